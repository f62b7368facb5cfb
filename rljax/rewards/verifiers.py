"""Correctness reward that picks its verifier from the example's metadata.

Datasets and generated tasks (``rljax.data``) set ``metadata["verifier"]``:
``"math"`` (default; ``math_reward``) or ``"countdown"`` (needs
``metadata["numbers"]`` and ``metadata["target"]``). One reward function then
serves a mixed batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from rljax.rewards.base import RewardOutput
from rljax.rewards.countdown import countdown_reward
from rljax.rewards.math_verifier import math_reward

__all__ = ["VERIFIERS", "Correctness", "correctness_reward"]

VERIFIERS = ("math", "countdown")


def _correctness(
  completion: str,
  ground_truth: str,
  metadata: Mapping[str, Any],
  last_number_fallback: bool,
) -> float:
  verifier = metadata.get("verifier", "math") if metadata else "math"
  if verifier == "math":
    return math_reward(
      completion, ground_truth, last_number_fallback=last_number_fallback
    )
  if verifier == "countdown":
    missing = [key for key in ("numbers", "target") if key not in metadata]
    if missing:
      raise ValueError(
        f"countdown example metadata lacks {missing}; has {sorted(metadata)}"
      )
    return countdown_reward(
      completion, metadata["numbers"], int(metadata["target"])
    )
  raise ValueError(
    f"metadata['verifier'] is {verifier!r}; expected one of {VERIFIERS}"
  )


def correctness_reward(
  prompt: str, completion: str, ground_truth: str, metadata: Mapping[str, Any]
) -> RewardOutput:
  """1 if the completion's final answer is right for its task, else 0.

  Raises:
    ValueError: unknown ``metadata["verifier"]``, or a countdown example
      without ``numbers``/``target`` (a data bug, not a model error).
  """
  score = _correctness(
    completion, ground_truth, metadata, last_number_fallback=False
  )
  return RewardOutput(score, {"correct": score})


@dataclasses.dataclass(frozen=True)
class Correctness:
  """``correctness_reward`` with options, as a picklable reward function.

  Attributes:
    last_number_fallback: grade the last number of a math completion that
      has no answer format (see ``math_reward``); for tiny models.
    name: the component name.
  """

  last_number_fallback: bool = False
  name: str = "correct"

  def __call__(
    self,
    prompt: str,
    completion: str,
    ground_truth: str,
    metadata: Mapping[str, Any],
  ) -> RewardOutput:
    score = _correctness(
      completion, ground_truth, metadata, self.last_number_fallback
    )
    return RewardOutput(score, {self.name: score})
