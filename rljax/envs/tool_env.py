"""An environment whose model calls tools: parse the call, run it, answer.

Each model turn is parsed with the episode's ``ToolCallFormat``. A turn
without a call is the final answer: it is scored (``reward_fn``) and the
episode ends. So is a turn the model ended itself (EOS, ``step(turn,
final=True)``): a call it left open there is not run (it is counted as
malformed), and the episode does not go on past the model's end. A turn with calls gets one observation holding every call's
result in order: the tool's output cut to the limits, or an error message
for a call that could not be read (counted in ``malformed_calls``) or that
failed (counted by kind in ``tool_errors``). The first
``max_calls_per_turn`` calls of a turn run concurrently (one thread each:
a turn's calls are independent, and the slowest, not their sum, bounds the
turn's wall time); calls past it get an error each. The episode also ends, with
reward 0, at ``max_turns`` model turns or ``max_total_tokens`` tokens after
the prompt (model turns and observations together).

Token counts come from ``count_tokens``; without a tokenizer the default is
the UTF-8 byte count, an upper bound for byte-level BPE tokenizers (every
token is at least one byte), so the limits hold either way.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable, Mapping, Sequence

from rljax.core import _validation as v
from rljax.data.records import Example
from rljax.envs import formats as fmt
from rljax.envs.base import StepResult
from rljax.envs.chat_formats import CHAT_FORMATS, make_any_format
from rljax.envs.tasks import score_answer
from rljax.envs.tools import Tool, ToolResult

__all__ = ["ToolEnv", "ToolEnvConfig", "truncate", "utf8_bytes"]

_CUT_MARK = "\n[truncated]"


@dataclasses.dataclass(frozen=True)
class ToolEnvConfig:
  """Limits of one episode.

  Attributes:
    format: the tool-call format: "tags" or "qwen" (``formats``: a turn
      stops at a call's closing tag), or "chat_qwen", "chat_llama3",
      "chat_smollm2" (``chat_formats``: the model's own syntax, several
      calls per turn, the turn ended by its end-of-turn id).
    tools_in_template: a chat format's tools are listed by the tokenizer's
      chat template (``apply_chat_template(tools=...)``), not in the
      instructions; a chat format only.
    max_turns: model turns per episode (>= 1).
    max_calls_per_turn: tool calls run per turn (>= 1); further calls get
      an error observation and count as malformed.
    max_tool_output_chars: characters of one tool output (>= 16).
    max_tool_output_tokens: tokens of one tool output (>= 4).
    max_total_tokens: tokens after the prompt, model and tools together
      (>= 1).
    tool_timeout_s: wall-time limit of one tool call (> 0).
  """

  format: str = "tags"
  tools_in_template: bool = False
  max_turns: int = 4
  max_calls_per_turn: int = 2
  max_tool_output_chars: int = 2000
  max_tool_output_tokens: int = 512
  max_total_tokens: int = 4096
  tool_timeout_s: float = 5.0

  def __post_init__(self):
    for name, rule in _RULES:
      v.check_field("ToolEnvConfig", name, getattr(self, name), rule)
    if self.tools_in_template and self.format not in CHAT_FORMATS:
      raise ValueError(
        v.field_message(
          "ToolEnvConfig.tools_in_template",
          True,
          f"False with format={self.format!r} (only a chat format, one of "
          f"{sorted(CHAT_FORMATS)}, is read from the tools the chat template "
          "lists)",
        )
      )


_RULES = (
  ("format", v.one_of(*fmt.FORMATS, *CHAT_FORMATS)),
  ("tools_in_template", v.is_bool),
  ("max_turns", v.all_of(v.is_int, v.at_least(1))),
  ("max_calls_per_turn", v.all_of(v.is_int, v.at_least(1))),
  ("max_tool_output_chars", v.all_of(v.is_int, v.at_least(16))),
  ("max_tool_output_tokens", v.all_of(v.is_int, v.at_least(4))),
  ("max_total_tokens", v.all_of(v.is_int, v.at_least(1))),
  ("tool_timeout_s", v.all_of(v.is_real, v.in_range(0, 3600, lo_open=True))),
)


def utf8_bytes(text: str) -> int:
  return len(text.encode("utf-8"))


def truncate(
  text: str, max_chars: int, max_tokens: int, count_tokens: Callable[[str], int]
) -> tuple[str, bool]:
  """(text cut to both limits with a "[truncated]" mark inside them, was
  it cut). The token cut is the longest character prefix that fits
  (binary search: ``count_tokens`` is called O(log n) times)."""
  if len(text) <= max_chars and count_tokens(text) <= max_tokens:
    return text, False
  mark_tokens = count_tokens(_CUT_MARK)
  lo, hi = 0, min(len(text), max_chars - len(_CUT_MARK))
  while lo < hi:  # the longest prefix within the token budget
    mid = (lo + hi + 1) // 2
    if count_tokens(text[:mid]) + mark_tokens <= max_tokens:
      lo = mid
    else:
      hi = mid - 1
  return text[:lo] + _CUT_MARK, True


@dataclasses.dataclass
class _Episode:
  example: Example
  turns: int = 0
  total_tokens: int = 0
  tool_calls: int = 0
  malformed_calls: int = 0
  truncated_outputs: int = 0
  tool_errors: dict[str, int] = dataclasses.field(default_factory=dict)
  done: bool = False
  stop_reason: str = ""

  def info(self) -> dict[str, Any]:
    return {
      "turns": self.turns,
      "total_tokens": self.total_tokens,
      "tool_calls": self.tool_calls,
      "malformed_calls": self.malformed_calls,
      "truncated_outputs": self.truncated_outputs,
      "tool_errors": dict(self.tool_errors),
      "stop_reason": self.stop_reason,
    }


def score_final_answer(text: str, example: Example) -> float:
  """The default ``reward_fn``: ``score_answer`` against ``example.answer``."""
  return score_answer(text, example.answer)


def default_prompt(example: Example, instructions: str) -> str:
  return (
    f"{instructions}\n\n{example.question}\n"
    "Put the final answer in \\boxed{}."
  )


class ToolEnv:
  """A tool-using episode per ``reset``; not thread-safe (one per worker).

  Args:
    tools: the tools the model may call, by their ``name``.
    config: the limits (``ToolEnvConfig``).
    reward_fn: ``(final_turn_text, example) -> float``; default
      ``score_answer`` against ``example.answer``.
    count_tokens: tokens of a text (default: UTF-8 bytes, an upper bound).
    prompt_fn: ``(example, format_instructions) -> first observation``.
  """

  def __init__(
    self,
    tools: Sequence[Tool],
    config: ToolEnvConfig = ToolEnvConfig(),
    *,
    reward_fn: Callable[[str, Example], float] | None = None,
    count_tokens: Callable[[str], int] = utf8_bytes,
    prompt_fn: Callable[[Example, str], str] = default_prompt,
  ):
    names = [t.name for t in tools]
    if not tools or len(set(names)) != len(names):
      raise ValueError(f"ToolEnv needs tools with distinct names; got {names}")
    self.tools: Mapping[str, Tool] = {t.name: t for t in tools}
    self.config = config
    self.format = make_any_format(config.format, config.tools_in_template)
    # A chat format's turn with calls ends at the model's end-of-turn id
    # (the rollout driver reads this).
    self.eos_ends_turn = bool(getattr(self.format, "eos_ends_turn", False))
    self.reward_fn = reward_fn or score_final_answer
    self.count_tokens = count_tokens
    self.prompt_fn = prompt_fn
    self.stop_sequences = self.format.stop_sequences(list(self.tools.values()))
    self._episode: _Episode | None = None

  def reset(self, example: Example) -> str:
    self._episode = _Episode(example)
    instructions = self.format.instructions(list(self.tools.values()))
    return self.prompt_fn(example, instructions)

  def turn_complete(self, turn: str) -> bool:
    """Whether a turn the engine stopped holds a closed call (a stop
    sequence that is not inside a string of the call's body)."""
    return self.format.turn_complete(turn, list(self.tools.values()))

  def step(self, turn: str, final: bool = False) -> StepResult:
    """Answers a model turn. `final`: the model ended it (EOS), so it is
    the answer whatever it holds: its calls are not run (counted as
    malformed) and the episode ends."""
    ep = self._episode
    if ep is None or ep.done:
      raise RuntimeError(
        "ToolEnv.step: no episode in progress; call reset(example)"
      )
    ep.turns += 1
    ep.total_tokens += self.count_tokens(turn)
    parsed = self.format.parse(turn, list(self.tools.values()))
    if final and parsed.has_calls:
      ep.malformed_calls += len(parsed.items)
      reward = float(self.reward_fn(turn, ep.example))
      return self._end(ep, "call_left_open", reward)
    if not parsed.has_calls:
      return self._end(ep, "answer", float(self.reward_fn(turn, ep.example)))
    if ep.total_tokens >= self.config.max_total_tokens:
      return self._end(ep, "max_total_tokens", 0.0)
    limit = self.config.max_calls_per_turn
    results: list[ToolResult | None] = []
    to_run: list[tuple[int, fmt.ToolCall]] = []
    for item in parsed.items:
      if isinstance(item, str):
        results.append(self._malformed(ep, item))
      elif len(to_run) >= limit:
        message = f"at most {limit} tool calls per turn"
        results.append(self._malformed(ep, message))
      else:
        to_run.append((len(results), item))
        results.append(None)
    for (i, call), result in zip(to_run, self._run_all([c for _, c in to_run])):
      results[i] = self._account(ep, result)
    observation = self.format.observation(results)
    ep.total_tokens += self.count_tokens(observation)
    if ep.turns >= self.config.max_turns:
      return self._end(ep, "max_turns", 0.0)
    if ep.total_tokens >= self.config.max_total_tokens:
      return self._end(ep, "max_total_tokens", 0.0)
    return StepResult(observation, 0.0, False, ep.info())

  def _end(self, ep: _Episode, reason: str, reward: float) -> StepResult:
    ep.done, ep.stop_reason = True, reason
    return StepResult("", reward, True, ep.info())

  def _malformed(self, ep: _Episode, message: str) -> ToolResult:
    ep.malformed_calls += 1
    return ToolResult(f"error: malformed tool call: {message}", "malformed")

  def _run_all(self, calls: Sequence[fmt.ToolCall]) -> list[ToolResult]:
    """The calls' results in order, the calls run concurrently."""
    timeout = self.config.tool_timeout_s

    def run(call: fmt.ToolCall) -> ToolResult:
      return self.tools[call.name].run(call.arguments, timeout)

    if len(calls) <= 1:
      return [run(c) for c in calls]
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
      return list(pool.map(run, calls))

  def _account(self, ep: _Episode, result: ToolResult) -> ToolResult:
    """Counts a call that ran and cuts its output to the limits."""
    ep.tool_calls += 1
    if result.error is not None:
      ep.tool_errors[result.error] = ep.tool_errors.get(result.error, 0) + 1
    output, cut = truncate(
      result.output,
      self.config.max_tool_output_chars,
      self.config.max_tool_output_tokens,
      self.count_tokens,
    )
    ep.truncated_outputs += cut
    return dataclasses.replace(result, output=output)
