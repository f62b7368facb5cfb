"""What a Trainer writes to its checkpoint at a step, and how it resumes.

A step's checkpoint holds the train state, the metadata a resume needs
(`checkpoint.run_meta`), the rollouts still in flight and, for a pipelined
run, the θ its last sync prepared (`checkpoint.save_step`). A resume
restores the state and the data position, queues the saved rollouts again
and puts the config's optimizer hyperparameters back over the saved ones.
"""

from __future__ import annotations

from typing import Any, Callable

from rljax.train import checkpoint as checkpoint_lib
from rljax.train import optim as optim_lib
from rljax.train.config import TrainConfig


def save(
  cfg: TrainConfig,
  checkpointer: Any,
  step: int,
  state: Any,
  uaq_scale: float,
  row: dict,
  collector: Any,
  actor: Any,
) -> None:
  """Checkpoints step `step` (its metrics row goes to the metadata)."""
  meta = checkpoint_lib.run_meta(step, cfg, uaq_scale, row, collector)
  pending = collector.pending_rollouts()
  checkpoint_lib.save_step(
    checkpointer, step, state, meta, pending,
    # Pipelined: the last sync's θ is a step older than the state.
    actor.diagnostics_reference() if cfg.run.pipelined else None,
  )  # fmt: skip


def resume(
  cfg: TrainConfig,
  checkpointer: Any,
  step: int,
  state: Any,
  uaq_scale: float,
  collector: Any,
) -> tuple[Any, int]:
  """(state, step) of the checkpoint at `step`, in the structure of
  `state`; the collector's data position and queued rollouts restored."""
  state, step = checkpoint_lib.resume(
    checkpointer, step, state, uaq_scale, collector
  )
  # The config's betas and weight decay, not the checkpoint's (a change
  # that run.allow_config_change allowed applies, as it is recorded).
  restored = state
  state = restored.replace(
    opt_state=optim_lib.with_hyperparams(restored.opt_state, cfg.optim_config())
  )
  if restored.critic_opt_state is not None:
    state = state.replace(
      critic_opt_state=optim_lib.with_hyperparams(
        restored.critic_opt_state, cfg.optim_config(critic=True)
      )
    )
  return state, step


def diagnostics_reference(
  cfg: TrainConfig, checkpointer: Any, step: int, template: Callable
) -> Any:
  """The θ a pipelined run's last sync prepared before the checkpoint at
  `step`, in the structure and dtypes of `template()` (called only for a
  pipelined run: it may gather θ); `pacing.start` gives it to the actor
  after the first sync. None for other modes or a checkpoint without one."""
  if not cfg.run.pipelined:
    return None
  return checkpoint_lib.diagnostics_reference(checkpointer, step, template())
