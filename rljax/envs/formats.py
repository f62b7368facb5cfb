"""How a model writes a tool call and reads the answer: two formats.

``QwenFormat``: the form of the Qwen2.5/Qwen3 chat templates. The assistant
writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; each
result comes back as a ``tool`` turn, which those templates render inside a
user turn as ``<tool_response>...</tool_response>``. ``observation`` writes
exactly the text the template would put between the end of the assistant's
tool call and the start of its next turn, so the conversation the model sees
is the one it was trained on (Qwen3 with thinking switched off also puts an
empty think block after the last generation prompt; that is the prompt
renderer's business, not written here).

``TagFormat``: for models without a tool template. ``<calculator>2+2
</calculator>`` runs the calculator on its body (the tool's ``argument``),
``<python>print(1)</python>`` the Python tool; the answer is
``<output>...</output>``.

A turn stops at a call's closing tag (``stop_sequences``). An engine may
drop the stop string from the text it returns, so ``parse`` also takes an
opening tag left open at the very end of the turn as a complete call (the
environment refuses that reading for a turn that ended the answer,
``ToolEnv.step(final=True)``). Calls that cannot be read give an error
message each (in ``ParsedTurn.items``) that the environment answers with an
error observation and counts.

A closing tag inside a string literal of the call's body does not close
the call: ``<python>print("</python>")</python>`` is one call whose code
prints the tag. The body of a tool whose argument is ``code`` is read as
Python (its one-quote and triple-quote strings, backslash escapes, ``#``
comments), a Qwen call's body as JSON (its "..." strings);
``turn_complete`` tells the rollout driver whether a turn that stopped on a
``>`` holds a closed call by the same reading.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Protocol, Sequence

from rljax.envs.tools import Tool, ToolResult

__all__ = [
  "FORMATS",
  "ParsedTurn",
  "QwenFormat",
  "TagFormat",
  "ToolCall",
  "ToolCallFormat",
  "make_format",
  "tool_schemas",
]


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str
  arguments: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
  """The calls of one model turn in the order written: a ``ToolCall``, or
  a message (str) for a call that could not be read (malformed JSON,
  unknown tool, unclosed or empty tag, ...)."""

  items: tuple[ToolCall | str, ...] = ()

  @property
  def calls(self) -> tuple[ToolCall, ...]:
    return tuple(x for x in self.items if isinstance(x, ToolCall))

  @property
  def errors(self) -> tuple[str, ...]:
    return tuple(x for x in self.items if isinstance(x, str))

  @property
  def has_calls(self) -> bool:
    return bool(self.items)


class ToolCallFormat(Protocol):
  name: str

  def stop_sequences(self, tools: Sequence[Tool]) -> tuple[str, ...]: ...

  def instructions(self, tools: Sequence[Tool]) -> str: ...

  def parse(self, text: str, tools: Sequence[Tool]) -> ParsedTurn: ...

  def turn_complete(self, text: str, tools: Sequence[Tool]) -> bool: ...

  def observation(self, results: Sequence[ToolResult]) -> str: ...


def tool_schemas(tools: Sequence[Tool]) -> list[dict[str, Any]]:
  """The tools as function schemas, for a tokenizer's
  ``apply_chat_template(messages, tools=...)``."""
  return [
    {
      "type": "function",
      "function": {
        "name": t.name,
        "description": t.description,
        "parameters": dict(t.parameters),
      },
    }
    for t in tools
  ]


class _Unreadable(str):
  """An error message, told apart from a block body."""


def find_outside_strings(
  text: str, tag: str, start: int = 0, lexer: str | None = None
) -> int:
  """The first position >= `start` of `tag` in `text` that is not inside a
  string literal of `lexer`: None (plain text: every occurrence), "python"
  (one-quote and triple-quote strings; a backslash escapes the next
  character; a one-quote string ends at a newline, where Python would
  refuse it; a ``#`` comment opens no string), or "json" ("..." with
  backslash escapes). -1 when there is none."""
  if lexer is None:
    return text.find(tag, start)
  i, quote = start, None
  while i < len(text):
    if quote is None or quote == "#":
      if text.startswith(tag, i):
        return i
      c = text[i]
      if quote == "#":
        quote = None if c == "\n" else quote
      elif lexer == "python" and text.startswith(('"""', "'''"), i):
        quote, i = text[i : i + 3], i + 3
        continue
      elif c == '"' or (lexer == "python" and c in "'#"):
        quote = c
      i += 1
      continue
    if text[i] == "\\":
      i += 2
    elif text.startswith(quote, i):
      i, quote = i + len(quote), None
    else:
      if len(quote) == 1 and text[i] == "\n" and lexer == "python":
        quote = None  # an unterminated one-quote string ends its line
      i += 1
  return -1


def _blocks(
  text: str, open_tag: str, close_tag: str, lexer: str | None = None
) -> list[tuple[int, str]]:
  """(position, body) of ``open_tag ... close_tag`` blocks, left to right,
  with ``_Unreadable`` messages for stray or re-opened tags; an opening tag
  left open at the end of the text runs to the end. Inside a body, tags
  within `lexer`'s string literals are text (`find_outside_strings`)."""
  out: list[tuple[int, str]] = []
  position = 0
  while True:
    start = text.find(open_tag, position)
    stray = text.find(close_tag, position)
    if stray >= 0 and (start < 0 or stray < start):
      out.append(
        (stray, _Unreadable(f"{close_tag} without an opening {open_tag}"))
      )
      position = stray + len(close_tag)
      continue
    if start < 0:
      return out
    body_start = start + len(open_tag)
    end = find_outside_strings(text, close_tag, body_start, lexer)
    reopened = find_outside_strings(text, open_tag, body_start, lexer)
    if reopened >= 0 and (end < 0 or reopened < end):
      out.append(
        (start, _Unreadable(f"{open_tag} opened again before {close_tag}"))
      )
      position = reopened
      continue
    if end < 0:
      out.append((start, text[body_start:]))
      return out
    out.append((start, text[body_start:end]))
    position = end + len(close_tag)


def _closes(text: str, open_tag: str, close_tag: str, lexer) -> bool:
  """`text` holds a closing tag: of a block opened before it (not inside a
  string of its body), or a stray one (a call that cannot be read, which
  the environment answers)."""
  start = text.find(open_tag)
  if start < 0:
    return close_tag in text
  if text.find(close_tag, 0, start) >= 0:
    return True
  return (
    find_outside_strings(text, close_tag, start + len(open_tag), lexer) >= 0
  )


def _json_call(body: str, names: set[str]) -> ToolCall | str:
  try:
    call = json.loads(body.strip())
  except ValueError as error:
    return f"the tool call is not valid JSON ({error})"
  if not isinstance(call, dict) or not isinstance(call.get("name"), str):
    return 'a tool call must be a JSON object with a "name" string'
  arguments = call.get("arguments", {})
  if isinstance(arguments, str):  # some models write the object as text
    try:
      arguments = json.loads(arguments)
    except ValueError:
      pass
  if not isinstance(arguments, dict):
    return f'"arguments" of {call["name"]!r} must be a JSON object'
  if call["name"] not in names:
    return f"unknown tool {call['name']!r}; the tools are {sorted(names)}"
  return ToolCall(call["name"], arguments)


@dataclasses.dataclass(frozen=True)
class QwenFormat:
  """Qwen2.5/Qwen3 tool calls (``<tool_call>{json}</tool_call>``)."""

  name: str = "qwen"

  def stop_sequences(self, tools: Sequence[Tool]) -> tuple[str, ...]:
    return ("</tool_call>",)

  def instructions(self, tools: Sequence[Tool]) -> str:
    listed = "\n".join(json.dumps(s) for s in tool_schemas(tools))
    return (
      "You can use these tools; their signatures are in <tools></tools>:\n"
      f"<tools>\n{listed}\n</tools>\n"
      "To call one, write a JSON object with its name and arguments between "
      "<tool_call> and </tool_call>:\n"
      '<tool_call>\n{"name": <tool name>, "arguments": <arguments object>}\n'
      "</tool_call>\nThe result will come back inside <tool_response>."
    )

  def parse(self, text: str, tools: Sequence[Tool]) -> ParsedTurn:
    names = {t.name for t in tools}
    return ParsedTurn(
      tuple(
        body if isinstance(body, _Unreadable) else _json_call(body, names)
        for _, body in _blocks(text, "<tool_call>", "</tool_call>", "json")
      )
    )

  def turn_complete(self, text: str, tools: Sequence[Tool]) -> bool:
    """A closed call (the closing tag outside the JSON's strings)."""
    return _closes(text, "<tool_call>", "</tool_call>", "json")

  def observation(self, results: Sequence[ToolResult]) -> str:
    responses = "\n".join(
      f"<tool_response>\n{r.output}\n</tool_response>" for r in results
    )
    return f"<|im_end|>\n<|im_start|>user\n{responses}<|im_end|>\n<|im_start|>assistant\n"


@dataclasses.dataclass(frozen=True)
class TagFormat:
  """``<TOOL>body</TOOL>`` calls answered by ``<output>...</output>``."""

  name: str = "tags"
  output_tag: str = "output"

  def stop_sequences(self, tools: Sequence[Tool]) -> tuple[str, ...]:
    return tuple(f"</{t.name}>" for t in tools)

  def instructions(self, tools: Sequence[Tool]) -> str:
    lines = [
      f"- <{t.name}>{t.argument}</{t.name}>: {t.description}" for t in tools
    ]
    return (
      "You can use these tools by writing a tag; the result comes back as "
      f"<{self.output_tag}>...</{self.output_tag}>:\n" + "\n".join(lines)
    )

  def parse(self, text: str, tools: Sequence[Tool]) -> ParsedTurn:
    found: list[tuple[int, ToolCall | str]] = []
    for tool in tools:
      tags = (f"<{tool.name}>", f"</{tool.name}>", _lexer(tool))
      for position, body in _blocks(text, *tags):
        if isinstance(body, _Unreadable):
          found.append((position, str(body)))
        elif not body.strip():
          found.append((position, f"<{tool.name}></{tool.name}> is empty"))
        else:
          found.append(
            (position, ToolCall(tool.name, {tool.argument: body.strip()}))
          )
    found.sort(key=lambda item: item[0])
    return ParsedTurn(tuple(item for _, item in found))

  def turn_complete(self, text: str, tools: Sequence[Tool]) -> bool:
    """Some tool's call closed (outside its code's strings)."""
    return any(
      _closes(text, f"<{t.name}>", f"</{t.name}>", _lexer(t)) for t in tools
    )

  def observation(self, results: Sequence[ToolResult]) -> str:
    return "".join(
      f"\n<{self.output_tag}>\n{r.output}\n</{self.output_tag}>\n"
      for r in results
    )


def _lexer(tool: Tool) -> str | None:
  """How a tag body is read: a tool whose argument is code, as Python."""
  return "python" if getattr(tool, "argument", "") == "code" else None


FORMATS = {"qwen": QwenFormat, "tags": TagFormat}


def make_format(name: str) -> ToolCallFormat:
  if name not in FORMATS:
    raise ValueError(
      f"tool-call format {name!r}; expected one of {sorted(FORMATS)}"
    )
  return FORMATS[name]()
