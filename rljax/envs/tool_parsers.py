"""Tool calls in the model's own format: a registry of parsers.

Each parser reads one assistant turn, written as the model's chat template
taught it, into a ``ParsedTurn`` (calls in order; a message for each call
that could not be read). A turn may hold several calls (parallel calls):
in these formats the turn ends at the model's end-of-turn id, not at a
call's closing tag, so the driver stops on EOS and every call of the turn
is read here.

  qwen     Qwen2.5 / Qwen3 (Hermes style): ``<tool_call>\\n{"name": ...,
           "arguments": {...}}\\n</tool_call>``, zero or more; a Qwen3
           ``<think>...</think>`` block is reasoning, and a call written
           inside it does not run.
  llama3   Llama 3.1-3.3 JSON calls: the turn is ``{"name": ...,
           "parameters": {...}}`` (``arguments`` is read too), optionally
           after ``<|python_tag|>``; several are separated by ``;``.
  smollm2  SmolLM2's list form: ``<tool_call>[{"name": ..., "arguments":
           {...}}, ...]</tool_call>``; a bare object is read as a list of
           one.
  tags     the project's ``<TOOL>argument</TOOL>`` tags (``formats.
           TagFormat``).

``parser_for_template(chat_template)`` picks one from a tokenizer's chat
template text where it can tell.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Protocol, Sequence

from rljax.envs import formats as fmt
from rljax.envs.tools import Tool

__all__ = [
  "PARSERS",
  "Llama3Parser",
  "QwenParser",
  "SmolLM2Parser",
  "TagParser",
  "ToolCallParser",
  "make_parser",
  "parser_for_template",
]

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


class ToolCallParser(Protocol):
  name: str

  def parse(self, text: str, tools: Sequence[Tool]) -> fmt.ParsedTurn: ...


def _strip_think(text: str) -> str:
  return _THINK.sub("", text)


def _blocks(text: str, open_tag: str, close_tag: str) -> list:
  return [body for _, body in fmt._blocks(text, open_tag, close_tag)]  # noqa: SLF001


@dataclasses.dataclass(frozen=True)
class QwenParser:
  """Qwen2.5/Qwen3 ``<tool_call>`` JSON calls, think blocks skipped."""

  name: str = "qwen"

  def parse(self, text: str, tools: Sequence[Tool]) -> fmt.ParsedTurn:
    names = {t.name for t in tools}
    items = []
    for body in _blocks(_strip_think(text), "<tool_call>", "</tool_call>"):
      if isinstance(body, fmt._Unreadable):  # noqa: SLF001
        items.append(str(body))
      else:
        items.append(fmt._json_call(body, names))  # noqa: SLF001
    return fmt.ParsedTurn(tuple(items))


@dataclasses.dataclass(frozen=True)
class SmolLM2Parser:
  """SmolLM2's ``<tool_call>[{...}, ...]</tool_call>`` list form."""

  name: str = "smollm2"

  def parse(self, text: str, tools: Sequence[Tool]) -> fmt.ParsedTurn:
    names = {t.name for t in tools}
    items: list = []
    for body in _blocks(text, "<tool_call>", "</tool_call>"):
      if isinstance(body, fmt._Unreadable):  # noqa: SLF001
        items.append(str(body))
        continue
      try:
        calls = json.loads(body.strip())
      except ValueError as error:
        items.append(f"the tool call is not valid JSON ({error})")
        continue
      if isinstance(calls, dict):
        calls = [calls]
      if not isinstance(calls, list) or not calls:
        items.append("a tool call must be a JSON list of call objects")
        continue
      items += [fmt._json_call(json.dumps(c), names) for c in calls]  # noqa: SLF001
    return fmt.ParsedTurn(tuple(items))


@dataclasses.dataclass(frozen=True)
class Llama3Parser:
  """Llama 3.x JSON calls (the whole turn, ``;``-separated)."""

  name: str = "llama3"

  def parse(self, text: str, tools: Sequence[Tool]) -> fmt.ParsedTurn:
    names = {t.name for t in tools}
    body = text.strip()
    tagged = body.startswith("<|python_tag|>")
    body = body.removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
      if tagged:
        return fmt.ParsedTurn(("<|python_tag|> without a JSON call",))
      return fmt.ParsedTurn()  # a plain answer
    items = []
    for part in _split_objects(body):
      try:
        call = json.loads(part)
      except ValueError as error:
        items.append(f"the tool call is not valid JSON ({error})")
        continue
      if isinstance(call, dict) and "parameters" in call:
        call = {"name": call.get("name"), "arguments": call["parameters"]}
      items.append(fmt._json_call(json.dumps(call), names))  # noqa: SLF001
    return fmt.ParsedTurn(tuple(items))


def _split_objects(body: str) -> list[str]:
  """``{...}; {...}`` into its objects (``;`` inside strings kept)."""
  parts, depth, start, in_string, escaped = [], 0, 0, False, False
  for i, ch in enumerate(body):
    if in_string:
      escaped = ch == "\\" and not escaped
      if ch == '"' and not escaped:
        in_string = False
      continue
    if ch == '"':
      in_string = True
    elif ch == "{":
      depth += 1
    elif ch == "}":
      depth -= 1
    elif ch == ";" and depth == 0:
      parts.append(body[start:i].strip())
      start = i + 1
  parts.append(body[start:].strip())
  return [p for p in parts if p]


@dataclasses.dataclass(frozen=True)
class TagParser:
  """The project's ``<TOOL>argument</TOOL>`` tags."""

  name: str = "tags"

  def parse(self, text: str, tools: Sequence[Tool]) -> fmt.ParsedTurn:
    return fmt.TagFormat().parse(text, tools)


PARSERS = {
  "qwen": QwenParser,
  "llama3": Llama3Parser,
  "smollm2": SmolLM2Parser,
  "tags": TagParser,
}


def make_parser(name: str) -> ToolCallParser:
  if name not in PARSERS:
    raise ValueError(
      f"tool-call parser {name!r}; expected one of {sorted(PARSERS)}"
    )
  return PARSERS[name]()


def parser_for_template(chat_template: str | None) -> str | None:
  """The parser a chat template's text implies, or None where it names no
  tool-call syntax this registry reads."""
  if not chat_template:
    return None
  if "<|python_tag|>" in chat_template or "<|eom_id|>" in chat_template:
    return "llama3"
  if "<tool_call>" in chat_template:
    # SmolLM2's template asks for a list of calls inside one block.
    if "<tool_call>[" in chat_template or "JSON list" in chat_template:
      return "smollm2"
    return "qwen"
  return None
