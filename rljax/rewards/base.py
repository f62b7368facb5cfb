"""The reward-function interface and weighted combination.

A reward function is any callable

    fn(prompt: str, completion: str, ground_truth: str, metadata: Mapping) -> RewardOutput | float

``RewardOutput.components`` names the parts of a score so that a training run
can log them separately (correctness, format, length penalty, ...).
``combine`` builds the weighted sum, optax-style: small pieces that compose.
To run in a ``RewardPool`` worker process a reward function must be picklable
by reference: a module-level function or a dataclass instance.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Protocol, Sequence, Union

__all__ = [
  "CombinedReward",
  "RewardFn",
  "RewardOutput",
  "combine",
  "reward_name",
  "to_reward_output",
]


@dataclasses.dataclass(frozen=True)
class RewardOutput:
  """A scalar reward and its named parts (unweighted, for logging)."""

  score: float
  components: dict[str, float] = dataclasses.field(default_factory=dict)


class RewardFn(Protocol):
  def __call__(
    self,
    prompt: str,
    completion: str,
    ground_truth: str,
    metadata: Mapping[str, Any],
  ) -> Union[RewardOutput, float]: ...


def reward_name(fn: Callable[..., Any]) -> str:
  """A reward function's component name: its ``name`` attribute, else its
  ``__name__``, else its class name."""
  name = (
    getattr(fn, "name", None)
    or getattr(fn, "__name__", None)
    or type(fn).__name__
  )
  return str(name)


def to_reward_output(value: Any, name: str) -> RewardOutput:
  """Normalises a reward function's return value; a bare number becomes
  ``RewardOutput(x, {name: x})``."""
  if isinstance(value, RewardOutput):
    return value
  if isinstance(value, bool) or not hasattr(value, "__float__"):
    raise TypeError(
      f"reward function {name!r} returned {type(value).__name__} {value!r}; "
      "expected a float or a RewardOutput"
    )
  score = float(value)
  return RewardOutput(score, {name: score})


@dataclasses.dataclass(frozen=True)
class CombinedReward:
  """``score = sum_i weight_i * score_i``; components hold each unweighted
  ``score_i`` under its name and each part's own components as
  ``name/component``."""

  terms: tuple[tuple[str, Callable[..., Any], float], ...]
  name: str = "combined"

  def __call__(
    self,
    prompt: str,
    completion: str,
    ground_truth: str,
    metadata: Mapping[str, Any],
  ) -> RewardOutput:
    total = 0.0
    components: dict[str, float] = {}
    for name, fn, weight in self.terms:
      out = to_reward_output(
        fn(prompt, completion, ground_truth, metadata), name
      )
      total += weight * out.score
      components[name] = out.score
      for key, value in out.components.items():
        if key != name:
          components[f"{name}/{key}"] = value
    return RewardOutput(total, components)


def combine(
  terms: Sequence[
    tuple[Callable[..., Any], float] | tuple[str, Callable[..., Any], float]
  ],
  *,
  name: str = "combined",
) -> CombinedReward:
  """Weighted sum of reward functions.

  Args:
    terms: ``(fn, weight)`` pairs, named by ``reward_name(fn)``, or
      ``(name, fn, weight)`` triples to name a part explicitly.
    name: the combined function's own name.

  Example: ``combine([(correctness_reward, 1.0), (r1_format_reward, 0.1)])``.
  """
  if not terms:
    raise ValueError(
      "combine: terms is empty; expected at least one (fn, weight) pair"
    )
  named: list[tuple[str, Callable[..., Any], float]] = []
  for index, term in enumerate(terms):
    if len(term) == 2:
      fn, weight = term
      term_name = reward_name(fn)
    elif len(term) == 3:
      term_name, fn, weight = term
    else:
      raise ValueError(
        f"combine: terms[{index}] has {len(term)} items; expected (fn, weight) or (name, fn, weight)"
      )
    if not callable(fn):
      raise TypeError(
        f"combine: terms[{index}] function is {type(fn).__name__}, not callable"
      )
    if (
      isinstance(weight, bool)
      or not isinstance(weight, (int, float))
      or not math.isfinite(weight)
    ):
      raise ValueError(
        f"combine: terms[{index}] ({term_name}) weight is {weight!r}; expected a finite number"
      )
    named.append((term_name, fn, float(weight)))
  names = [n for n, _, _ in named]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(
      f"combine: duplicate component names {duplicates}; name them with (name, fn, weight)"
    )
  return CombinedReward(tuple(named), name)
