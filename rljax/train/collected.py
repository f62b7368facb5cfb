"""The step's rollout as the trainer builds its batch from (`Collected`),
and the check that stops a step whose every reward is NaN or inf. Shared
by the synchronous collector (`collect`) and its streaming half
(`collect_stream`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from rljax.rewards import finite as finite_lib
from rljax.rollout.base import RolloutBatch


@dataclasses.dataclass
class Collected:
  """The step's rollout: what the batch is built from."""

  batch: RolloutBatch
  valid: np.ndarray  # bool [P' * n]: False for masked-out filler groups
  rewards: np.ndarray  # float32 [P' * n]
  components: dict[str, np.ndarray]  # reward components, each [P' * n]
  kept_groups: int
  dropped_groups: int  # over every round
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)


def refuse_all_nonfinite(step: int, cfg, sampled: float, nonfinite: float):
  """A step whose every reward is NaN or inf: the reward function is
  broken, not noisy (rewards/finite.py)."""
  if sampled and nonfinite == sampled:
    raise finite_lib.NonFiniteRewardError(
      f"step {step}: every reward is NaN or inf ({int(nonfinite)} samples) "
      f"from --reward.name={cfg.reward.name!r}; the reward function is broken"
    )
