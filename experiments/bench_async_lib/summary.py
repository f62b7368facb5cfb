"""One async mode's summary in bench_async.py, from its metrics rows and
step start times: wall per step and steps/hour (warm-up steps left out),
trainer and engine idle fractions, the version lag of every trained token,
the tokens generated but never trained; and the steps/hour ratios of the
streaming modes against their targets."""

from __future__ import annotations

import collections

import numpy as np

# Steps/hour of each streaming mode over (baseline mode) must reach (target):
# the overlap is worth its staleness only if it buys this much speed.
TARGETS = (("sync", 1.5), ("one_step", 1.2))


def lag_counts(batch, current_version: int, valid) -> collections.Counter:
  """{lag: tokens} of a rollout's trained tokens (the rows `valid` keeps,
  model tokens only), as `staleness.rollout_lag_metrics` counts them."""
  counts = collections.Counter()
  if batch.policy_version is None:
    return counts
  for row, versions in enumerate(batch.policy_version):
    if not valid[row]:
      continue
    versions = np.asarray(versions, np.int64)
    if batch.action_mask is not None:
      versions = versions[np.asarray(batch.action_mask[row], bool)]
    lags, n = np.unique(current_version - versions, return_counts=True)
    counts.update(dict(zip(lags.tolist(), n.tolist())))
  return counts


def _idle(rows: list[dict], key: str, fallback) -> float | None:
  """Idle share of the rows' time: the logged per-step fraction `key`
  when every row has it, else `fallback(row)`; time-weighted by
  time_step. None when neither is available."""
  total = sum(r["time_step"] for r in rows)
  if not rows or total <= 0:
    return None
  if all(key in r for r in rows):
    fracs = [r[key] for r in rows]
  else:
    fracs = [fallback(r) for r in rows]
    if any(f is None for f in fracs):
      return None
  return float(sum(f * r["time_step"] for f, r in zip(fracs, rows)) / total)


def summarize(
  mode: str,
  rows: list[dict],
  starts: list[float],
  end: float,
  lags: collections.Counter,
  untrained: dict[str, int],
  warmup: int,
) -> dict:
  """One mode's summary from its rows and the step start times.

  Step i's wall is starts[i + 1] − starts[i] (the last: end − starts[-1]);
  the first `warmup` steps are left out of every rate and fraction.
  """
  if len(starts) != len(rows):
    raise ValueError(
      f"summarize: {len(starts)} step starts for {len(rows)} rows; expected "
      "one per row"
    )
  walls = np.diff(np.asarray([*starts, end], np.float64))
  kept = rows[warmup:]
  wall = walls[warmup:]
  sync = mode == "sync"
  # The sync trainer runs the rollout on its own thread: serial by design.
  trainer_fallback = (
    (lambda r: r["time_rollout"] / r["time_step"])
    if sync
    else (lambda r: r.get("time_rollout_wait", 0.0) / r["time_step"])
  )
  engine_fallback = (
    (lambda r: 1.0 - r["time_rollout"] / r["time_step"])
    if sync
    else (lambda r: None)
  )
  logged = all("engine_idle_fraction" in r for r in kept) and bool(kept)
  tokens = sum(lags.values())
  lag_keys = sorted(lags)
  out = {
    "mode": mode,
    "steps": len(rows),
    "measured_steps": len(kept),
    "wall_per_step_mean_s": float(wall.mean()) if wall.size else None,
    "wall_per_step_median_s": float(np.median(wall)) if wall.size else None,
    "steps_per_hour": float(3600.0 / wall.mean()) if wall.size else None,
    "trainer_idle_fraction": _idle(
      kept, "trainer_idle_fraction", trainer_fallback
    ),
    "engine_idle_fraction": _idle(
      kept, "engine_idle_fraction", engine_fallback
    ),
    "idle_source": "logged"
    if logged
    else ("serial (sync)" if sync else "time_rollout_wait; engine n/a"),
    "trained_tokens": int(tokens),
    "version_lag_mean": (
      float(sum(k * n for k, n in lags.items()) / tokens) if tokens else 0.0
    ),
    "version_lag_max": int(lag_keys[-1]) if lag_keys else 0,
    "version_lag_ge1": (
      float(sum(n for k, n in lags.items() if k >= 1) / tokens)
      if tokens
      else 0.0
    ),
    "version_lag_ge4": (
      float(sum(n for k, n in lags.items() if k >= 4) / tokens)
      if tokens
      else 0.0
    ),
    "version_lag_tokens": {str(k): int(lags[k]) for k in lag_keys},
    "untrained_tokens": int(sum(untrained.values())),
    **{f"untrained_tokens_{k}": int(v) for k, v in untrained.items()},
    "wall_per_step_s": [float(w) for w in walls],
    "rows": [
      {
        k: r[k]
        for k in (
          "step",
          "time_step",
          "time_rollout",
          "time_rollout_wait",
          "time_update",
          "version_lag_mean",
          "version_lag_max",
          "rollout_tokens",
          "rollout_weight_swaps",
          "trainer_idle_fraction",
          "engine_idle_fraction",
          # The exposure of streaming's deadlines on a long tail: how long
          # the batch's responses ran (the update pads to the longest) and
          # how many groups came from another step's request.
          "response_length_mean",
          "response_length_max",
          "stream_groups_other_request",
          "stream_groups_expired",
        )
        if k in r
      }
      for r in rows
    ],
  }
  return out


def ratios(summaries: dict[str, dict]) -> list[dict]:
  """Steps/hour of each streaming mode over sync and one_step, with the
  targets, where both modes ran."""
  out = []
  for mode, s in summaries.items():
    if not mode.startswith("streaming"):
      continue
    for base, target in TARGETS:
      b = summaries.get(base)
      if b is None or not b["steps_per_hour"] or not s["steps_per_hour"]:
        continue
      value = s["steps_per_hour"] / b["steps_per_hour"]
      out.append(
        {
          "ratio": f"{mode} / {base}",
          "value": float(value),
          "target": target,
          "met": bool(value >= target),
        }
      )
  return out
