"""The step's rollout as the trainer builds its batch from (`Collected`),
the check that stops a step whose every reward is NaN or inf, and the
counts of a multi-turn rollout (its tool metrics, its model ids). Shared
by the synchronous collector (`collect`) and its streaming half
(`collect_stream`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from rljax.envs import summarize
from rljax.rewards import finite as finite_lib
from rljax.rollout.base import RolloutBatch
from rljax.rollout.multiturn import ENGINE_METRICS


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


# Counts of `rollout_multiturn`'s driver summed over a step's rounds (its
# token means and reward are the batch's own metrics already).
_DRIVER_SUMS = ("engine_calls", "continuations")
# Counts of a kept-KV episode run (`slot_episodes`, ENGINE_METRICS + count
# in the episodes' metrics), summed over a step's rounds as
# kv_episode_<count>.
_KEPT_KV_SUMS = (
  "prefills",
  "appends",
  "appended_tokens",
  "decode_steps",
  "slot_steps",
  "live_row_steps",
)


def episode_metrics(episodes: list) -> dict[str, float]:
  """The tool metrics of a step's episodes (every round's
  `MultiTurnRollout`): `rljax.envs.summarize` of their infos (tool_call_rate,
  malformed_call_rate, turns_mean, tool_calls_mean, tool_error/<kind>, ...),
  the driver's engine calls and continuations, the share of episodes the
  driver cut (`episode_truncated_rate`), and a kept-KV run's counts
  (`kv_episode_*`: prefills, appended observation ids, decode steps, the
  decode batches' occupancy)."""
  infos = [i for e in episodes for i in e.infos]
  out = summarize(infos)
  for key in _DRIVER_SUMS:
    out[key] = float(sum(e.metrics.get(key, 0.0) for e in episodes))
  cut = [r == "length" for e in episodes for r in e.batch.finish_reason]
  out["episode_truncated_rate"] = float(np.mean(cut)) if cut else 0.0
  slot_steps = f"{ENGINE_METRICS}slot_steps"
  kept = [e.metrics for e in episodes if slot_steps in e.metrics]
  if kept:
    for key in _KEPT_KV_SUMS:
      total = sum(m.get(f"{ENGINE_METRICS}{key}", 0.0) for m in kept)
      out[f"kv_episode_{key}"] = float(total)
    # Live rows per slot-step: what the run's decode batches held.
    out["kv_episode_occupancy"] = out["kv_episode_live_row_steps"] / max(
      1.0, out["kv_episode_slot_steps"]
    )
  return out


def model_tokens(rb: RolloutBatch) -> int:
  """The ids the model sampled: a trajectory's model ids (its action
  mask), not its observations'."""
  if rb.action_mask is None:
    return int(rb.response_lengths.sum())
  return int(sum(int(np.sum(m)) for m in rb.action_mask))
