"""Dynamic sampling (DAPO): which sampled groups make up a step's batch."""

from __future__ import annotations

import dataclasses

import numpy as np

from rljax.rollout.base import RolloutBatch


@dataclasses.dataclass
class Round:
  """One rollout round: the groups, their scores and which to keep."""

  batch: RolloutBatch
  rewards: np.ndarray  # [P * n]
  components: dict[str, np.ndarray]  # reward components, each [P * n]
  keep: np.ndarray  # bool [P], a group with a useful signal


def select(rounds: list[Round], prompts: int):
  """The first `prompts` kept groups over the rounds, in sampling order,
  padded with dropped groups (masked out: `valid` is False) when too few
  were kept.

  Returns:
    (batch, valid [P' * n] bool, rewards [P' * n] float32, components,
    kept groups, dropped groups), P' = min(prompts, groups sampled).
  """
  every = RolloutBatch.concat([r.batch for r in rounds])
  keep = np.concatenate([np.asarray(r.keep, bool) for r in rounds])
  kept = np.flatnonzero(keep)[:prompts]
  filler = np.flatnonzero(~keep)[: prompts - len(kept)]
  order = np.concatenate([kept, filler]).astype(np.int64)
  n = every.n
  rows = (order[:, None] * n + np.arange(n)).reshape(-1)
  rewards = np.concatenate([r.rewards for r in rounds])[rows]
  components = {
    k: np.concatenate([r.components[k] for r in rounds])[rows]
    for k in rounds[0].components
  }
  valid = np.repeat(np.arange(len(order)) < len(kept), n)
  return (
    every.select_groups(order),
    valid,
    rewards.astype(np.float32),
    components,
    len(kept),
    int((~keep).sum()),
  )
