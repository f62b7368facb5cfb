"""Rewards that score a whole batch at once (a model on the accelerator, a
judge over HTTP), behind the same `score(inputs) -> RewardBatch` call as
`RewardPool`.

A verifier is a per-item function and runs in `RewardPool`'s worker
processes. A learned reward model or a likelihood reward is one batched
forward pass: it must run in the trainer's process, on the accelerator, and
a per-item call in a worker would reload the model in every process. Such
rewards implement `BatchedReward`; `rljax.train.tasks.Task` takes either.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import numpy as np

from rljax.rewards.pool import RewardBatch, RewardInput

__all__ = ["BatchedReward", "reward_batch", "chunks"]


class BatchedReward(Protocol):
  """Scores a batch in the calling process."""

  name: str

  def score(self, inputs: Sequence[RewardInput]) -> RewardBatch: ...

  def close(self) -> None: ...


def reward_batch(
  scores,
  components: Mapping[str, np.ndarray],
  *,
  seconds: float,
  status: Sequence[str] | None = None,
  metrics: Mapping[str, float] | None = None,
) -> RewardBatch:
  """A `RewardBatch` with the metric keys `RewardPool` reports (items,
  timeouts, errors, worker_restarts, seconds) plus `metrics`."""
  scores = np.asarray(scores, np.float32)
  count = scores.shape[0]
  status = tuple(status) if status is not None else ("ok",) * count
  if len(status) != count:
    raise ValueError(
      f"reward_batch: {len(status)} status entries for {count} scores"
    )
  comps = {}
  for name, value in components.items():
    value = np.asarray(value, np.float32)
    if value.shape != (count,):
      raise ValueError(
        f"reward_batch: component {name!r} has shape "
        f"{value.shape}; expected ({count},)"
      )
    comps[name] = value
  out = {
    "items": float(count),
    "timeouts": float(sum(s == "timeout" for s in status)),
    "errors": float(sum(s == "error" for s in status)),
    "worker_restarts": 0.0,
    "seconds": float(seconds),
  }
  out.update({k: float(v) for k, v in (metrics or {}).items()})
  return RewardBatch(scores, comps, status, out)


def chunks(count: int, size: int):
  """`slice`s of at most `size` items covering range(count)."""
  if size < 1:
    raise ValueError(f"chunk size={size!r}; expected >= 1")
  for start in range(0, count, size):
    yield slice(start, min(start + size, count))
