"""Checkpoints of a run with orbax: atomic, every N steps, resumable.

A checkpoint holds the train state (params, optimizer state, step; critic
too for PPO), and a JSON side-car with everything else a resumed run needs to
take exactly the next step an uninterrupted run would have taken: the data
iterator position, the RNG seed, the UAQ scale the params are folded with, and
the metrics so far. Orbax writes each step to a temporary directory and
renames it when complete, so a run killed mid-save leaves the previous
checkpoint intact and `latest_step` never points at a partial one.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class RunCheckpointer:
  """Saves and restores (state pytree, JSON metadata) pairs under `directory`."""

  def __init__(self, directory: str, every: int, keep: int):
    if every < 1:
      raise ValueError(f"checkpoint_every={every} must be >= 1")
    self.directory = os.path.abspath(directory)
    self.every = every
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def should_save(self, step: int, last: bool = False) -> bool:
    return last or step % self.every == 0

  def save(self, step: int, state: Any, meta: dict) -> None:
    self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                meta=ocp.args.JsonSave(meta)),
        force=True)
    self._manager.wait_until_finished()

  def restore(self, step: int, target_state: Any) -> tuple[Any, dict]:
    """Restores into the structure, dtypes and shardings of `target_state`."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                meta=ocp.args.JsonRestore()))
    return restored.state, dict(restored.meta)

  def close(self) -> None:
    self._manager.close()
