"""When a Trainer's rollouts are requested and its weights reach the engine.

One function per point of the loop where `run.async_mode` matters
(s = `run.max_staleness`):

  mode        start of run           after collect        after update
  off         sync θ                 -                    sync θ_k
  one_step    sync θ if restored     schedule step k+s    - (the worker
  (pipelined) rollouts need a        with θ_k             syncs what it
              refill; schedule the                        was scheduled
              steps up to s ahead                         with)
  streaming   publish θ; queue the   -                    publish θ_k, queue
              requests up to s                            step k+1+s
              ahead

Streaming's pace admits step j once step j − 1 − s has trained, so a
token's lag behind θ_old is at most s; `check_lag` refuses a rollout past it
before it is trained on. Value-pretraining steps leave the engine's weights
alone (`critic_pretrain.py`).

`theta` is a callable returning (θ as the model runs it, on this host, and
its policy version): gathering θ costs a transfer, so it is read only where
a mode needs it.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from rljax.train import critic_pretrain
from rljax.train.config import TrainConfig


def start(
  cfg: TrainConfig,
  collector: Any,
  actor: Any,
  theta: Callable[[], tuple],
  step_num: int,
  diag_reference: Any,
) -> None:
  """Gives the engine its first weights and queues the first requests of a
  run that resumes after `step_num` (0 for a fresh run). `diag_reference`
  is the θ a resumed pipelined run last synced (or None)."""
  if cfg.run.pipelined:
    if collector.pending:
      # Restored in-flight rollouts: the engine needs weights for any
      # dynamic-sampling refill before the next scheduled push.
      actor.sync(*theta())
    if diag_reference is not None:
      # The next sync's QuRL diagnostics compare against the θ the
      # uninterrupted run last synced, not against this resume's sync.
      actor.restore_diagnostics_reference(
        jax.tree.map(jnp.asarray, diag_reference),
        critic_pretrain.policy_version(cfg, step_num - 1),
      )
    for k in range(collector.pending, cfg.run.max_staleness):
      collector.schedule(step_num + 1 + k, *theta())
  elif cfg.run.async_mode == "streaming":
    # θ of the restored step, then the requests of the steps up to
    # max_staleness ahead (a resume restored the queued ones).
    collector.publish(*theta())
    collector.stream_through(step_num + 1 + cfg.run.max_staleness)
  else:
    actor.sync(*theta())


def check_lag(cfg: TrainConfig, step: int, lags: dict) -> None:
  """Refuses a streaming rollout with a token more than `max_staleness`
  policy versions behind θ_old (in-flight updates only make tokens newer,
  so this means the worker's pace is broken)."""
  if cfg.run.async_mode != "streaming":
    return
  if lags.get("version_lag_max", 0.0) > cfg.run.max_staleness:
    raise RuntimeError(
      f"step {step}: a streaming rollout token is "
      f"{lags['version_lag_max']:.0f} versions behind θ_old; expected <= "
      f"run.max_staleness={cfg.run.max_staleness} (the worker's pace is "
      "broken)"
    )


def after_collect(
  cfg: TrainConfig, collector: Any, step: int, theta: Callable[[], tuple]
) -> None:
  """Pipelined: step k+s's rollout starts now, with θ_k (the state before
  step k's update)."""
  if cfg.run.pipelined:
    collector.schedule(step + cfg.run.max_staleness, *theta())


def after_update(
  cfg: TrainConfig,
  collector: Any,
  actor: Any,
  step: int,
  theta: Callable[[], tuple],
  pretraining: bool,
) -> dict[str, float]:
  """θ_k, quantized, to the engine once step k has trained; returns the
  sync's metrics (none when nothing was synced here)."""
  if cfg.run.async_mode == "streaming":
    metrics = {} if pretraining else collector.publish(*theta())
    collector.stream_through(step + 1 + cfg.run.max_staleness)
    return metrics
  if cfg.run.pipelined or pretraining:
    return {}
  return actor.sync(*theta())
