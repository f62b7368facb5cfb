"""DAPO soft overlong punishment as a reward term (thin wrapper over core).

The formula lives in ``rljax.core.shaping.soft_overlong_punishment`` (Yu et
al. 2025, DAPO eq. 13): 0 for |y| <= L_max - L_cache, then a linear ramp down
to -1 at L_max, and -1 beyond. Here it is exposed two ways:
``overlong_penalty`` on a batch of lengths (what a training loop should call,
once per batch), and ``OverlongPenalty``, a reward function for ``combine``
that reads the token count from ``metadata["completion_tokens"]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from rljax.rewards.base import RewardOutput

__all__ = ["OverlongPenalty", "overlong_penalty"]


def overlong_penalty(lengths, max_length: int, cache_length: int) -> np.ndarray:
  """[N] penalties in [-1, 0] for [N] completion lengths in tokens."""
  from rljax.core import shaping  # JAX: imported only when used

  lengths = np.asarray(lengths)
  return np.asarray(
    shaping.soft_overlong_punishment(lengths, max_length, cache_length),
    np.float32,
  )


@dataclasses.dataclass(frozen=True)
class OverlongPenalty:
  """Reward function: the soft overlong penalty of one completion.

  Attributes:
    max_length: L_max, the generation budget in tokens.
    cache_length: L_cache, the width of the ramp (0 < L_cache <= L_max).
    length_key: metadata key holding the completion's token count.
  """

  max_length: int
  cache_length: int
  length_key: str = "completion_tokens"
  name: str = "overlong"

  def __post_init__(self):
    if not 0 < self.cache_length <= self.max_length:
      raise ValueError(
        f"OverlongPenalty: cache_length is {self.cache_length} with max_length "
        f"{self.max_length}; expected 0 < cache_length <= max_length"
      )

  def __call__(
    self,
    prompt: str,
    completion: str,
    ground_truth: str,
    metadata: Mapping[str, Any],
  ) -> RewardOutput:
    if self.length_key not in metadata:
      raise ValueError(
        f"OverlongPenalty needs metadata[{self.length_key!r}] (completion length in "
        f"tokens); metadata has {sorted(metadata)}"
      )
    length = int(metadata[self.length_key])
    score = float(
      overlong_penalty(np.array([length]), self.max_length, self.cache_length)[
        0
      ]
    )
    return RewardOutput(score, {self.name: score})
