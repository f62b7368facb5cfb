"""Tool calls in the model's own chat format: several calls per turn, the
turn ended by the model's end-of-turn id.

The formats of ``formats.py`` stop a turn at a call's closing tag, so a turn
holds one call. A chat template that teaches tool calls (Qwen2.5/Qwen3,
Llama 3.x, SmolLM2) ends the assistant's turn with its end-of-turn id after
all of its calls instead, and hands the results back as tool turns. A
``ChatFormat`` reads such a turn with a parser of ``tool_parsers`` (every
call of the turn, in order) and writes the tool turns that follow it:

  chat_qwen     ``<tool_call>{json}</tool_call>`` blocks (Qwen3 ``<think>``
                skipped); results as ``<tool_response>`` blocks in a user
                turn, as the Qwen templates render ``tool`` messages.
  chat_llama3   JSON calls (``<|python_tag|>``, ``;``-separated); each
                result an ``ipython`` turn, as Llama 3.1's template.
  chat_smollm2  ``<tool_call>[{...}, ...]</tool_call>``; each result a
                ChatML ``tool`` turn.

The format has no stop sequences (``eos_ends_turn``: the rollout driver
stops on EOS alone and hands the environment the turn as not final; a turn
without calls is the answer). The observation starts right after the
end-of-turn id the model sampled, which the driver keeps in the ids.
Where the tokenizer's chat template lists the tools itself
(``apply_chat_template(..., tools=...)``), ``tools_in_template`` leaves
them out of the instructions.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Sequence

from rljax.envs import formats as fmt
from rljax.envs import tool_parsers
from rljax.envs.tools import Tool, ToolResult

__all__ = [
  "ALL_FORMATS",
  "CHAT_FORMATS",
  "ChatFormat",
  "make_any_format",
  "make_chat_format",
]

# Format name -> the parser (``tool_parsers.PARSERS``) that reads its turns.
CHAT_FORMATS = {
  "chat_qwen": "qwen",
  "chat_llama3": "llama3",
  "chat_smollm2": "smollm2",
}

_SYNTAX = {
  "qwen": (
    "For each call, write a JSON object with its name and arguments between "
    "<tool_call> and </tool_call>:\n"
    '<tool_call>\n{"name": <tool name>, "arguments": <arguments object>}\n'
    "</tool_call>\nYou may write several calls; end your turn after them."
  ),
  "llama3": (
    "To call functions, reply with only a JSON object per call, "
    '{"name": <function name>, "parameters": <arguments object>}, '
    "calls separated by ';'. End your turn after them."
  ),
  "smollm2": (
    "To call tools, write the list of calls between <tool_call> and "
    '</tool_call>: <tool_call>[{"name": <tool name>, "arguments": '
    "<arguments object>}, ...]</tool_call>. End your turn after it."
  ),
}


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """A ``ToolCallFormat`` in a model family's own chat syntax (module doc).

  Attributes:
    name: one of ``CHAT_FORMATS``.
    tools_in_template: the chat template lists the tools (the first
      prompt is rendered with ``tools=``), so ``instructions`` is empty.
  """

  name: str = "chat_qwen"
  tools_in_template: bool = False

  # The model's end-of-turn id ends a turn with calls (not a stop string).
  eos_ends_turn = True

  def __post_init__(self):
    if self.name not in CHAT_FORMATS:
      raise ValueError(
        f"ChatFormat.name={self.name!r}; expected one of {sorted(CHAT_FORMATS)}"
      )

  @property
  def parser(self) -> tool_parsers.ToolCallParser:
    return tool_parsers.make_parser(CHAT_FORMATS[self.name])

  def stop_sequences(self, tools: Sequence[Tool]) -> tuple[str, ...]:
    return ()

  def instructions(self, tools: Sequence[Tool]) -> str:
    if self.tools_in_template:
      return ""
    listed = "\n".join(json.dumps(s) for s in fmt.tool_schemas(tools))
    return (
      "You can use these tools; their signatures are in <tools></tools>:\n"
      f"<tools>\n{listed}\n</tools>\n{_SYNTAX[CHAT_FORMATS[self.name]]}"
    )

  def parse(self, text: str, tools: Sequence[Tool]) -> fmt.ParsedTurn:
    return self.parser.parse(text, tools)

  def turn_complete(self, text: str, tools: Sequence[Tool]) -> bool:
    """Never: a turn of this format ends at the end-of-turn id only."""
    return False

  def observation(self, results: Sequence[ToolResult]) -> str:
    family = CHAT_FORMATS[self.name]
    if family == "qwen":
      responses = "\n".join(
        f"<tool_response>\n{r.output}\n</tool_response>" for r in results
      )
      return (
        f"\n<|im_start|>user\n{responses}<|im_end|>\n<|im_start|>assistant\n"
      )
    if family == "llama3":
      turns = "".join(
        f"<|start_header_id|>ipython<|end_header_id|>\n\n{r.output}<|eot_id|>"
        for r in results
      )
      return f"{turns}<|start_header_id|>assistant<|end_header_id|>\n\n"
    turns = "".join(
      f"\n<|im_start|>tool\n{r.output}<|im_end|>" for r in results
    )
    return f"{turns}\n<|im_start|>assistant\n"


def make_chat_format(name: str, tools_in_template: bool = False) -> ChatFormat:
  return ChatFormat(name, tools_in_template)


# Every format a ToolEnv takes, by name: those that stop at a closing tag
# and the chat formats (``rljax.envs.FORMATS``).
ALL_FORMATS = {
  **fmt.FORMATS,
  **{name: functools.partial(ChatFormat, name) for name in CHAT_FORMATS},
}


def make_any_format(
  name: str, tools_in_template: bool = False
) -> fmt.ToolCallFormat:
  """The format ``name`` names, of ``formats`` or a chat format
  (``tools_in_template`` applies to a chat format only)."""
  if name in CHAT_FORMATS:
    return ChatFormat(name, tools_in_template)
  if name not in fmt.FORMATS:
    raise ValueError(
      f"tool-call format {name!r}; expected one of {sorted(ALL_FORMATS)}"
    )
  return fmt.make_format(name)
