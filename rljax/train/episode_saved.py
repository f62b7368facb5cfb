"""Episodes as a rollout's dict of floats and back: how the asynchronous
modes carry a multi-turn rollout's rewards and tool metrics beside its
`RolloutBatch` (the pipelined queue, a checkpoint's in-flight rollouts, a
streaming cut), where only (batch, floats) travel.

Per episode row r: its reward (`MultiTurnRollout.rewards`) and the counters
`rljax.envs.summarize` reads of its last info (turns, tool calls, malformed
calls, tool errors by kind); per rollout: the driver's engine calls and
continuations. The keys start with a prefix (PREFIX by default), so that
they can sit in one dict with a rollout's timing metrics, which `split`
separates again.
"""

from __future__ import annotations

import numpy as np

from rljax.rollout.base import RolloutBatch
from rljax.rollout.multiturn import ENGINE_METRICS, MultiTurnRollout

PREFIX = "episode/"
_COUNTERS = ("turns", "tool_calls", "malformed_calls")
_DRIVER = ("engine_calls", "continuations")
_ERROR = "tool_error_"


def encode(episodes: MultiTurnRollout, prefix: str = PREFIX) -> dict:
  """The episodes' rewards, info counters and driver counts as floats."""
  out = {f"{prefix}rows": float(len(episodes.rewards))}
  for key in _DRIVER:
    out[f"{prefix}{key}"] = float(episodes.metrics.get(key, 0.0))
  for key, value in episodes.metrics.items():
    if key.startswith(ENGINE_METRICS):  # a kept-KV run's counts
      out[f"{prefix}{key}"] = float(value)
  for r, (reward, info) in enumerate(zip(episodes.rewards, episodes.infos)):
    out[f"{prefix}reward_{r}"] = float(reward)
    for key in _COUNTERS:
      out[f"{prefix}{key}_{r}"] = float(info.get(key, 0))
    for kind, count in info.get("tool_errors", {}).items():
      out[f"{prefix}{_ERROR}{r}/{kind}"] = float(count)
  return out


def decode(
  batch: RolloutBatch, extra: dict, prefix: str = PREFIX
) -> MultiTurnRollout:
  """`encode` inverted, around the episodes' `batch` (the infos hold the
  counters only: what the step's tool metrics read)."""
  rows = int(extra[f"{prefix}rows"])
  if rows != len(batch.response_ids):
    raise ValueError(
      f"episode_saved.decode: {rows} episodes saved for a batch of "
      f"{len(batch.response_ids)} rows; expected one per row"
    )
  errors: list[dict] = [{} for _ in range(rows)]
  head = f"{prefix}{_ERROR}"
  for key, value in extra.items():
    if key.startswith(head):
      r, kind = key[len(head) :].split("/", 1)
      errors[int(r)][kind] = int(value)
  infos = [
    {
      **{key: int(extra[f"{prefix}{key}_{r}"]) for key in _COUNTERS},
      "tool_errors": errors[r],
      "stop_reason": "",
    }
    for r in range(rows)
  ]
  rewards = np.array(
    [extra[f"{prefix}reward_{r}"] for r in range(rows)], np.float32
  )
  metrics = {key: float(extra.get(f"{prefix}{key}", 0.0)) for key in _DRIVER}
  head = f"{prefix}{ENGINE_METRICS}"
  for key, value in extra.items():
    if key.startswith(head):
      metrics[key[len(prefix) :]] = float(value)
  return MultiTurnRollout(batch, rewards, infos, metrics)


def split(extra: dict, prefix: str = PREFIX) -> tuple[dict, dict]:
  """(the keys `encode` wrote with `prefix`, the others)."""
  mine = {k: v for k, v in extra.items() if k.startswith(prefix)}
  return mine, {k: v for k, v in extra.items() if not k.startswith(prefix)}
