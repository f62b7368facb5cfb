"""Non-finite rewards: counted, named, and their groups dropped.

A reward function that returns NaN or ±inf for a sample (a reward model
that overflowed, a judge that parsed "inf") would otherwise reach the
advantages: a group-normalised advantage of a group with one NaN is NaN for
every member, and a batch-normalised one poisons the whole step. The rule:

  * every group holding a non-finite reward is dropped from the update (its
    samples are masked out like dynamic sampling's filler groups), and its
    rewards are replaced by 0 so that no NaN reaches any array;
  * the trainer counts them (`reward_nonfinite` in metrics.jsonl) and names
    them in a one-line warning (sample index and value);
  * a step where *every* sample's reward is non-finite is refused: the
    reward function is broken, not noisy (`NonFiniteRewardError`).
"""

from __future__ import annotations

import numpy as np


class NonFiniteRewardError(ValueError):
  """Every reward of a step is NaN or inf."""


def drop_nonfinite_groups(
  rewards: np.ndarray, group_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(rewards with 0 for each non-finite one, bool [n_groups] keep mask
  False for groups holding one, int indices of the non-finite samples).

  Args:
    rewards: [n_groups * group_size] rewards, groups contiguous.
    group_size: samples per prompt (>= 1).
  """
  rewards = np.asarray(rewards, np.float64)
  if rewards.ndim != 1 or group_size < 1 or rewards.size % group_size:
    raise ValueError(
      f"rewards of shape {rewards.shape} are not groups of "
      f"group_size={group_size}"
    )
  finite = np.isfinite(rewards)
  keep = finite.reshape(-1, group_size).all(axis=1)
  return np.where(finite, rewards, 0.0), keep, np.flatnonzero(~finite)


def describe(rewards: np.ndarray, bad: np.ndarray, limit: int = 8) -> str:
  """ "3 non-finite rewards (sample 1: nan, sample 6: inf, ...)"."""
  rewards = np.asarray(rewards)
  shown = ", ".join(f"sample {int(i)}: {rewards[i]}" for i in bad[:limit])
  more = ", ..." if len(bad) > limit else ""
  n = len(bad)
  return f"{n} non-finite reward{'s' if n != 1 else ''} ({shown}{more})"
