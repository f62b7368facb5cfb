"""The environment protocol: what a multi-turn rollout talks to.

An environment is reset with a problem and returns the first observation
(the prompt text); then it answers each model turn with the next
observation, the turn's reward and whether the episode is over::

    observation = env.reset(example)
    while True:
      turn = policy(observation_so_far)        # text up to a stop sequence
      step = env.step(turn)
      if step.done:
        break
      observation_so_far += turn + step.observation

``StepResult.info`` carries the episode's counters (turns, tool calls,
malformed calls, tool errors by kind, tokens); ``summarize`` turns a batch of
final infos into metrics. ``TokenEnv`` puts the same environment behind token
ids: it decodes only the model's turn and encodes only the observation, so a
trajectory's ids are the engine's ids and the observation's ids concatenated
(the conversation is never re-rendered and re-tokenized).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from rljax.data.records import Example

__all__ = ["Environment", "StepResult", "TokenEnv", "TokenStep", "summarize"]


@dataclasses.dataclass(frozen=True)
class StepResult:
  """The environment's answer to one model turn.

  Attributes:
    observation: text to append after the turn ("" when done).
    reward: this turn's reward (the final answer's score on the last turn).
    done: the episode is over.
    info: counters of the episode so far (see ``ToolEnv.step``).
    observation_ids: the observation's own token ids where the environment
      gives them (a remote environment's tokenizer, a chat template's
      rendering); None: the driver encodes ``observation`` on its own.
  """

  observation: str
  reward: float
  done: bool
  info: Mapping[str, Any]
  observation_ids: tuple[int, ...] | None = None


@runtime_checkable
class Environment(Protocol):
  """Anything with ``reset(example) -> str`` and ``step(turn) ->
  StepResult``; ``stop_sequences`` end a model turn."""

  stop_sequences: tuple[str, ...]

  def reset(self, example: Example) -> str: ...

  def step(self, turn: str) -> StepResult: ...


@dataclasses.dataclass(frozen=True)
class TokenStep:
  observation_ids: tuple[int, ...]
  reward: float
  done: bool
  info: Mapping[str, Any]


class TokenEnv:
  """An ``Environment`` behind token ids.

  ``decode`` reads one model turn's ids as text (for the environment only:
  the ids themselves are what gets trained); ``encode`` tokenizes one
  observation on its own, without special-token insertion, e.g.
  ``lambda s: tokenizer.encode(s, add_special_tokens=False)``.
  """

  def __init__(
    self,
    env: Environment,
    encode: Callable[[str], Sequence[int]],
    decode: Callable[[Sequence[int]], str],
  ):
    self.env = env
    self.encode = encode
    self.decode = decode

  @property
  def stop_sequences(self) -> tuple[str, ...]:
    return self.env.stop_sequences

  def reset(self, example: Example) -> tuple[int, ...]:
    return tuple(self.encode(self.env.reset(example)))

  def step(self, turn_ids: Sequence[int]) -> TokenStep:
    result = self.env.step(self.decode(list(turn_ids)))
    ids = tuple(self.encode(result.observation)) if result.observation else ()
    return TokenStep(ids, result.reward, result.done, result.info)


def summarize(infos: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """Metrics of a batch of finished episodes (each its last ``info``):
  ``tool_call_rate`` (share of episodes with at least one call),
  ``malformed_call_rate`` (malformed calls over all calls),
  ``turns_mean``, ``tool_calls_mean``, ``malformed_calls`` (total) and
  ``tool_error/<kind>`` (totals)."""
  n = len(infos)
  if n == 0:
    return {}
  calls = sum(i["tool_calls"] for i in infos)
  malformed = sum(i["malformed_calls"] for i in infos)
  out = {
    "episodes": float(n),
    "tool_call_rate": sum(
      1 for i in infos if i["tool_calls"] + i["malformed_calls"]
    )
    / n,
    "malformed_call_rate": malformed / (calls + malformed)
    if calls + malformed
    else 0.0,
    "turns_mean": sum(i["turns"] for i in infos) / n,
    "tool_calls_mean": calls / n,
    "malformed_calls": float(malformed),
  }
  for info in infos:
    for kind, count in info["tool_errors"].items():
      key = f"tool_error/{kind}"
      out[key] = out.get(key, 0.0) + count
  return out
