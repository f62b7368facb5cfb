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
           after ``<|python_tag|>``; several are separated by ``;``; text
           after the last object is not a call.
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
    for part in _leading_objects(body):
      if isinstance(part, str):
        items.append(part)
        continue
      if "parameters" in part:
        part = {"name": part.get("name"), "arguments": part["parameters"]}
      items.append(fmt._json_call(json.dumps(part), names))  # noqa: SLF001
    return fmt.ParsedTurn(tuple(items))


def _leading_objects(body: str) -> list:
  """The JSON objects ``{...}; {...}`` that ``body`` starts with (a ``;``
  inside a string is the string's), each a dict or an error message; the
  text after the last one (e.g. the tool turns of a worked example) is
  not a call."""
  decoder, out, i = json.JSONDecoder(), [], 0
  while True:
    try:
      value, i = decoder.raw_decode(body, i)
    except ValueError as error:
      out.append(f"the tool call is not valid JSON ({error})")
      return out
    if not isinstance(value, dict):
      out.append('a tool call must be a JSON object with a "name" string')
      return out
    out.append(value)
    rest = body[i:].lstrip()
    if not rest.startswith(";"):
      return out
    i = len(body) - len(rest) + 1
    while i < len(body) and body[i].isspace():
      i += 1
    if i == len(body):
      return out


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
