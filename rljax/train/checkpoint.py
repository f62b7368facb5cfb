"""Checkpoints of a run with orbax: atomic, checksummed, verified on restore.

A checkpoint holds the train state (params, optimizer state, step; critic
too for PPO), and a JSON side-car with everything else a resumed run needs to
take exactly the next step an uninterrupted run would have taken: the data
iterator position, the RNG seed, the UAQ scale the params are folded with, and
the metrics so far. Optional `aux` arrays (the pipelined trainer's in-flight
rollouts) are written beside them.

Orbax writes each step to a temporary directory and renames it when complete,
but that does not protect against a damaged file afterwards (a full disk, a
copy that was cut, a flipped bit), which orbax would restore silently or fail
on deep inside its reader. So every checkpoint also gets a manifest, the
sha256 and size of every file in it, written last and atomically
(`MANIFEST`): a checkpoint without one never finished saving. Restoring
verifies the manifest, and a damaged or unfinished newest checkpoint is set
aside (moved, never deleted) in favour of the newest one that verifies.

Rotation is done here rather than by orbax (`max_to_keep`), after the new
checkpoint's manifest is on disk: orbax deletes the old step as soon as the
new one is renamed into place, so a kill between that and the manifest could
leave no verified checkpoint at all.

Multi-host: every process calls `save` and `restore` (orbax writes and
reads each process's shards, and deletes on process 0); process 0 alone
writes the aux file and the manifest, and every process waits for it before
old steps rotate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from rljax import distributed
from rljax.rollout.base import RolloutBatch
from rljax.train import atomic
from rljax.train import guard
from rljax.train.rollout_arrays import rollout_from_arrays, rollout_to_arrays

MANIFEST = "rljax_manifest.json"
AUX_FILE = "rljax_aux.npz"
DAMAGED_DIR = "checkpoints_set_aside"
_CHUNK = 1 << 22


class CheckpointError(RuntimeError):
  """No checkpoint of a run directory passes verification."""


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
  return h.hexdigest()


def _files_under(directory: str) -> list[str]:
  """Relative paths of every regular file under `directory` but the manifest
  (and its temporary), sorted."""
  out = []
  for root, _, files in os.walk(directory):
    for name in files:
      rel = os.path.relpath(os.path.join(root, name), directory)
      if rel not in (MANIFEST, MANIFEST + ".tmp"):
        out.append(rel)
  return sorted(out)


def _fsync_dir(directory: str) -> None:
  fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def write_manifest(step_dir: str) -> None:
  """Writes `step_dir/MANIFEST`: sha256 and size of every file, atomically
  (a temporary file, fsync, rename), so it is either absent or whole."""
  files = {}
  for rel in _files_under(step_dir):
    path = os.path.join(step_dir, rel)
    files[rel] = {"sha256": _sha256(path), "bytes": os.path.getsize(path)}
  tmp = os.path.join(step_dir, MANIFEST + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump({"format": 1, "files": files}, f, indent=0, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, os.path.join(step_dir, MANIFEST))
  _fsync_dir(step_dir)


def verify(step_dir: str) -> str | None:
  """None if `step_dir` matches its manifest, else why not (one line)."""
  path = os.path.join(step_dir, MANIFEST)
  if not os.path.isfile(path):
    return "no checksum manifest (its save never finished)"
  try:
    with open(path, encoding="utf-8") as f:
      files = json.load(f)["files"]
    expected = {
      rel: (int(e["bytes"]), str(e["sha256"])) for rel, e in files.items()
    }
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    return f"its manifest is unreadable ({type(e).__name__})"
  present = set(_files_under(step_dir))
  missing = sorted(set(expected) - present)
  if missing:
    return f"{missing[0]} is missing"
  extra = sorted(present - set(expected))
  if extra:
    return f"{extra[0]} is not in its manifest"
  for rel, (size, digest) in sorted(expected.items()):
    full = os.path.join(step_dir, rel)
    if os.path.getsize(full) != size:
      return f"{rel} has {os.path.getsize(full)} bytes, expected {size}"
    if _sha256(full) != digest:
      return f"{rel} fails its sha256 check"
  return None


def _remove_tree(path: str, tries: int = 50) -> None:
  """rmtree, again while a writer that failed still closes its files (an
  orbax save that ran out of space has writer threads finishing)."""
  for _ in range(tries):
    try:
      shutil.rmtree(path)
      return
    except FileNotFoundError:
      return
    except OSError:
      time.sleep(0.1)
  shutil.rmtree(path, ignore_errors=True)


class RunCheckpointer:
  """Saves and restores (state pytree, JSON metadata) pairs under `directory`."""

  def __init__(
    self, directory: str, every: int, keep: int, owner: bool = False
  ):
    """`owner`: this process holds the run directory's lock (`RunDir`), so
    unfinished saves left by a killed process may be cleaned up; a reader
    (evaluation) must not, as a live run may be writing one."""
    if every < 1:
      raise ValueError(f"checkpoint_every={every} must be >= 1")
    if keep < 1:
      # Keeping none would leave a run nothing to resume from.
      raise ValueError(f"keep_checkpoints={keep} must be >= 1")
    self.directory = os.path.abspath(directory)
    self.every = every
    self.keep = keep
    options = ocp.CheckpointManagerOptions(
      max_to_keep=None,
      create=True,
      enable_async_checkpointing=False,
      cleanup_tmp_directories=owner,
    )
    self._manager = ocp.CheckpointManager(
      self.directory, options=options, item_names=("state", "meta")
    )

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest step on disk, verified or not."""
    return self._manager.latest_step()

  def should_save(self, step: int, last: bool = False) -> bool:
    return last or step % self.every == 0

  def save(
    self,
    step: int,
    state: Any,
    meta: dict,
    aux: dict[str, np.ndarray] | None = None,
  ) -> None:
    """Writes step `step`; its manifest last; then rotates old steps.

    Raises:
      DiskFullError: the filesystem ran out of space; the unfinished step
        (orbax's temporary directory, or the step without its manifest) is
        removed, older checkpoints are untouched.
    """
    try:
      self._manager.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
        ),
        force=True,
      )
      self._manager.wait_until_finished()
      step_dir = self.step_dir(step)
      if distributed.is_main_process():
        if aux:
          buf = io.BytesIO()
          np.savez(buf, **aux)
          with open(os.path.join(step_dir, AUX_FILE), "wb") as f:
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())
        write_manifest(step_dir)
    except Exception as e:
      if not atomic.is_disk_full(e):
        raise
      try:  # the other writes of the save end before their files go
        self._manager.wait_until_finished()
      except Exception:  # pylint: disable=broad-except
        pass
      self._remove_unfinished(step)
      needed = sum(
        int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves((state, aux))
      )
      raise atomic.DiskFullError(
        self.directory, needed, f"checkpoint of step {step}"
      ) from e
    # Only now may older steps go (orbax deletes them on process 0, with
    # every process taking part); the newest `keep` (>= 1) stay.
    distributed.barrier(f"rljax_manifest_{step}")
    for old in self.all_steps()[: -self.keep]:
      self._manager.delete(old)

  def _remove_unfinished(self, step: int) -> None:
    """Deletes what a failed save of `step` left: orbax's temporary
    directories and the step directory if it has no manifest (a step with
    one is complete and stays)."""
    if not distributed.is_main_process():
      return
    for name in os.listdir(self.directory):
      path = os.path.join(self.directory, name)
      unfinished = name.startswith(f"{step}.") and "tmp" in name
      if name == str(step):
        unfinished = not os.path.exists(os.path.join(path, MANIFEST))
      if unfinished and os.path.isdir(path):
        _remove_tree(path)
    self._manager.reload()

  def latest_verified_step(self) -> tuple[int | None, list[tuple[int, str]]]:
    """The newest step whose files match its manifest, and the newer steps
    that do not, as (step, reason) pairs; (None, []) without checkpoints.

    Raises:
      CheckpointError: there are checkpoints but none verifies.
    """
    bad = []
    for step in reversed(self.all_steps()):
      reason = verify(self.step_dir(step))
      if reason is None:
        return step, bad
      bad.append((step, reason))
    if bad:
      listed = "; ".join(f"step {s}: {r}" for s, r in bad)
      raise CheckpointError(
        f"no checkpoint in {self.directory} passes verification ({listed}). "
        "Restore the directory from a copy, or move it aside to start the "
        "run over"
      )
    return None, []

  def set_aside(self, step: int) -> str:
    """Moves step `step` (damaged or unfinished) to
    `<run_dir>/checkpoints_set_aside/` so the step can be written again;
    nothing is deleted. Returns where it went."""
    root = os.path.join(os.path.dirname(self.directory), DAMAGED_DIR)
    os.makedirs(root, exist_ok=True)
    dest = os.path.join(root, f"{step}-{time.strftime('%Y%m%dT%H%M%S')}")
    while os.path.exists(dest):
      dest += "_"
    shutil.move(self.step_dir(step), dest)
    self._manager.reload()
    return dest

  def reload(self) -> None:
    """Re-reads the steps on disk (another process changed them)."""
    self._manager.reload()

  def read_meta(self, step: int) -> dict:
    restored = self._manager.restore(
      step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
    )
    return dict(restored.meta)

  def read_aux(self, step: int) -> dict[str, np.ndarray]:
    path = os.path.join(self.step_dir(step), AUX_FILE)
    if not os.path.exists(path):
      return {}
    with np.load(path, allow_pickle=False) as f:
      return {k: f[k] for k in f.files}

  def restore(self, step: int, target_state: Any) -> tuple[Any, dict]:
    """Restores into the structure, dtypes and shardings of `target_state`."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
    restored = self._manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
      ),
    )
    return restored.state, dict(restored.meta)

  def close(self) -> None:
    self._manager.close()


# -- the trainer's checkpoint: state, run metadata, in-flight rollouts --------


def run_meta(
  step: int, cfg: Any, uaq_scale: float, row: dict, collector: Any
) -> dict:
  """The JSON side-car of a trainer checkpoint: what a resume needs beyond
  the state (the data position before any in-flight rollout's prompts,
  how many rollouts are in flight, the UAQ scale θ is folded with)."""
  return {
    "step": step,
    "seed": cfg.run.seed,
    "uaq_scale": uaq_scale,
    "data_state": collector.data_state(),
    "last_metrics": row,
    "pending_rollouts": collector.pending,
    "config": dataclasses.asdict(cfg),
  }


_DIAG_REF = "diag_reference_"


def save_step(
  checkpointer: RunCheckpointer,
  step: int,
  state: Any,
  meta: dict,
  pending_rollouts: list[tuple[RolloutBatch, dict]] = (),
  diag_reference: Any = None,
) -> None:
  """Saves a trainer step: the state (refused if not finite), its metadata,
  the in-flight rollouts and the QuRL diagnostics' reference.

  The in-flight rollouts were generated by weights this checkpoint does not
  hold (θ of earlier steps): they are saved, so that a resumed run trains on
  exactly what the uninterrupted one did. For the same reason a pipelined
  run saves `diag_reference`, the θ of the last prepared sync (one step
  older than the state): the next sync's diagnostics compare against it
  (one more float32 copy of θ in such a checkpoint).

  Raises:
    NonFiniteError: the state holds NaN or inf.
  """
  guard.require_finite(state, f"the train state of step {step}")
  # The rollouts saved, counted as saved (a stream may have admitted a
  # request after the state its save describes).
  meta = {**meta, "pending_rollouts": len(pending_rollouts)}
  aux = {}
  for i, (rb, extra) in enumerate(pending_rollouts):
    aux.update(rollout_to_arrays(rb, extra, prefix=f"pending{i}_"))
  if diag_reference is not None:
    for i, leaf in enumerate(jax.tree.leaves(diag_reference)):
      # float32: npz has no bfloat16 (the template's dtype comes back).
      aux[f"{_DIAG_REF}{i}"] = np.asarray(leaf, np.float32)
  checkpointer.save(step, state, meta, aux)


def diagnostics_reference(
  checkpointer: RunCheckpointer, step: int, template: Any
) -> Any:
  """The `diag_reference` saved with `step`, in the structure and dtypes of
  `template` (θ), or None when the checkpoint holds none."""
  aux = checkpointer.read_aux(step)
  leaves, treedef = jax.tree.flatten(template)
  if f"{_DIAG_REF}0" not in aux:
    return None
  return jax.tree.unflatten(
    treedef,
    [
      np.asarray(aux[f"{_DIAG_REF}{i}"]).astype(leaf.dtype)
      for i, leaf in enumerate(leaves)
    ],
  )


def resume(
  checkpointer: RunCheckpointer,
  step: int,
  state: Any,
  uaq_scale: float,
  collector: Any,
) -> tuple[Any, int]:
  """Restores a trainer checkpoint: returns (state, step); the collector's
  task goes back to the saved data position and, when asynchronous
  (one_step or streaming), the saved queued rollouts are queued again."""
  state, meta = restore_step(checkpointer, step, state, uaq_scale)
  collector.task.load_state_dict(meta["data_state"])
  step = int(meta["step"])
  if collector.cfg.run.async_mode != "off":  # one_step or streaming
    collector.restore_pending(pending_rollouts(checkpointer, step, meta))
  return state, step


def restore_step(
  checkpointer: RunCheckpointer, step: int, target_state: Any, uaq_scale: float
) -> tuple[Any, dict]:
  """(state, meta) of a trainer checkpoint; refuses one whose params are
  folded with another UAQ scale than this run's."""
  state, meta = checkpointer.restore(step, target_state)
  if float(meta.get("uaq_scale", 1.0)) != uaq_scale:
    raise ValueError(
      f"checkpoint at step {step} was trained with uaq_scale="
      f"{meta['uaq_scale']}, this run has uaq_scale={uaq_scale}"
    )
  return state, meta


def pending_rollouts(
  checkpointer: RunCheckpointer, step: int, meta: dict
) -> list[tuple[RolloutBatch, dict]]:
  """The in-flight rollouts `save_step` stored with step `step`."""
  n = int(meta.get("pending_rollouts", 0))
  if not n:
    return []
  aux = checkpointer.read_aux(step)
  return [rollout_from_arrays(aux, prefix=f"pending{i}_") for i in range(n)]
