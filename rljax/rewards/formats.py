"""Format rewards: did the completion use the answer format it was asked for?

Both are 0/1 and say nothing about correctness; combine them with a
correctness reward at a small weight (``base.combine``).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from rljax.rewards import extraction
from rljax.rewards.base import RewardOutput

__all__ = [
  "boxed_format_reward",
  "has_boxed_answer",
  "has_r1_format",
  "r1_format_reward",
]

_R1_LAYOUT = re.compile(
  r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL
)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def has_r1_format(
  completion: str, *, think_opened_in_prompt: bool = False
) -> bool:
  """``<think>...</think>`` then ``<answer>...</answer>`` and nothing else.

  Each tag appears exactly once, the answer is non-empty, and only white
  space is allowed around the two blocks. With ``think_opened_in_prompt``
  (the R1-Zero prompt ends in ``<think>``) the completion may start inside
  the think block or open it again.
  """
  opened = think_opened_in_prompt and not completion.lstrip().startswith(
    "<think>"
  )
  text = "<think>" + completion if opened else completion
  # Exactly one of each tag; checked first, it also keeps the regex linear.
  if any(text.count(tag) != 1 for tag in _TAGS):
    return False
  match = _R1_LAYOUT.fullmatch(text)
  if match is None:
    return False
  return bool(match.group(2).strip())


def has_boxed_answer(completion: str) -> bool:
  """At least one well-formed ``\\boxed{...}`` with non-empty content."""
  return any(box.strip() for box in extraction.extract_boxed_all(completion))


def r1_format_reward(
  prompt: str, completion: str, ground_truth: str, metadata: Mapping[str, Any]
) -> RewardOutput:
  """1 if the completion follows the R1 template (``has_r1_format``), else 0.

  A prompt ending in ``<think>`` (R1-Zero template) opens the think block.
  """
  opened = prompt.rstrip().endswith("<think>")
  score = (
    1.0 if has_r1_format(completion, think_opened_in_prompt=opened) else 0.0
  )
  return RewardOutput(score, {"r1_format": score})


def boxed_format_reward(
  prompt: str, completion: str, ground_truth: str, metadata: Mapping[str, Any]
) -> RewardOutput:
  """1 if the completion puts an answer in ``\\boxed{}``, else 0."""
  score = 1.0 if has_boxed_answer(completion) else 0.0
  return RewardOutput(score, {"boxed_format": score})
