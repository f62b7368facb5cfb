"""A run directory is one experiment: locked, checked, then written.

`RunDir(cfg)` opens `cfg.run.run_dir` for a trainer, in this order, and writes
nothing until every check has passed:

  1. lock: one live process per directory (`RunDirLock`, an `fcntl.flock` on
     `rljax.lock`); a second start is refused with the holder's pid and host.
     The kernel drops the lock when its process dies, however it dies, so a
     lock left by a killed run is simply taken over.
  2. checkpoints: a start without `resume` refuses a directory that holds
     any; a resume finds the newest checkpoint that passes its checksum
     manifest (damaged newer ones are reported and set aside).
  3. config: a resume refuses a configuration that differs from the one the
     checkpoint was trained with in anything but run-control fields
     (`RUN_CONTROL_FIELDS`: how long, how often to log / evaluate / save),
     unless `run.allow_config_change` names the fields (dotted, or a whole
     section). Allowed changes are appended to `config_changes.jsonl`.
     Configs saved by an older rljax (flat keys) are read through
     `config.LEGACY_KEYS`.
  4. only then `config.json` is (atomically) written: the resolved config,
     nested by section (`config.from_dict` reads it back).

Multi-host (`rljax.distributed`): every process opens the directory and
runs the checks (they only read), but only process 0 takes the lock, sets
damaged checkpoints aside and writes; the orbax checkpoints themselves are
written and restored by every process (`RunCheckpointer`).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from typing import Any, Callable, Mapping

from rljax import distributed
from rljax.train import atomic
from rljax.train import config as config_lib
from rljax.train.checkpoint import RunCheckpointer
from rljax.train.config import TrainConfig

LOCK_FILE = "rljax.lock"
CONFIG_FILE = "config.json"
CHANGES_FILE = "config_changes.jsonl"

# Fields that say how long a run goes, what it records and how it is laid
# out on devices, never what it trains: a resume may change them freely.
# Every other field (including ones added later) changes the trajectory and
# must be named in --run.allow_config_change to differ on resume.
# `task.eval_size` is not here: the held-out examples are removed from the
# training pool.
RUN_CONTROL_FIELDS = frozenset(
  {
    "run.steps",
    "run.resume",
    "run.run_dir",
    "run.checkpoint_every",
    "run.keep_checkpoints",
    "run.eval_every",
    "run.export_hf",
    "run.tensorboard",
    "run.allow_config_change",
    "task.reward_workers",
    "rollout.vllm_urls",
    "rollout.vllm_allow_remote",
    "mesh.data",
    "mesh.fsdp",
    "mesh.tensor",
  }
)


class RunDirLockedError(RuntimeError):
  """Another live process holds the run directory."""


class ConfigChangeError(ValueError):
  """A resume would continue a run with a different configuration."""


class RunDirExistsError(FileExistsError):
  """A start without `run.resume` in a directory that holds checkpoints."""


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
    timespec="seconds"
  )


def _describe(holder: str) -> str:
  try:
    h = json.loads(holder)
    return f"pid {h['pid']} on host {h['host']}, since {h['since']}"
  except (ValueError, KeyError, TypeError):
    return "a process that has not written its pid yet"


class RunDirLock:
  """An exclusive, non-blocking `flock` on `<run_dir>/rljax.lock`.

  The file holds the holder's pid, host and start time for the refusal
  message; a clean release empties it, so content found by a new holder
  means the previous one was killed (reported, then taken over).
  """

  def __init__(self, run_dir: str, log: Callable[[str], Any] = print):
    self.path = os.path.join(run_dir, LOCK_FILE)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 4096, 0).decode("utf-8", "replace")
      os.close(fd)
      raise RunDirLockedError(
        f"run_dir={run_dir!r} is in use by another rljax run "
        f"({_describe(holder)}); wait for it to end or stop it, or choose "
        "another --run.run_dir"
      ) from None
    except BaseException:
      os.close(fd)
      raise
    stale = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    if stale:
      log(
        f"[rljax] run_dir={run_dir!r}: taking over the lock left by "
        f"{_describe(stale)}, which is no longer running"
      )
    me = json.dumps(
      {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
    )
    os.ftruncate(fd, 0)
    os.pwrite(fd, me.encode(), 0)
    os.fsync(fd)
    self._fd = fd

  def release(self) -> None:
    """Empties the file (a clean exit) and drops the lock (idempotent)."""
    if self._fd is None:
      return
    try:
      os.ftruncate(self._fd, 0)
    finally:
      os.close(self._fd)  # closing the only descriptor drops the flock
      self._fd = None


def allowed_changes(cfg: TrainConfig) -> frozenset[str]:
  """The dotted fields of `cfg.run.allow_config_change` (comma-separated;
  a section name allows each of its fields, an old flat name its field)."""
  names = [
    config_lib.legacy_name(n.strip())
    for n in cfg.run.allow_config_change.split(",")
    if n.strip()
  ]
  fields = config_lib.field_names()
  out, unknown = set(), []
  for name in names:
    matched = [f for f in fields if f == name or f.startswith(name + ".")]
    out.update(matched)
    if not matched:
      unknown.append(name)
  if unknown:
    raise ConfigChangeError(
      f"--run.allow_config_change names {sorted(unknown)}, which are not "
      "TrainConfig fields; expected a comma-separated list of dotted fields "
      "(e.g. loss.eps_high) or sections (e.g. loss)"
    )
  return frozenset(out)


def _jsonable(value: Any) -> Any:
  return json.loads(json.dumps(value))  # tuples become lists, as on disk


def saved_fields(saved: Mapping[str, Any]) -> dict[str, Any]:
  """{dotted field: value} of a saved config (nested, or flat from an older
  rljax), fields it lacks at their defaults: what that run used."""
  try:
    flat = config_lib.to_flat(config_lib.from_dict(saved))
  except ValueError:  # no longer valid: compare what it says as it is
    flat = {n: config_lib.field_default(n) for n in config_lib.field_names()}
    flat.update(config_lib.flatten(saved))
  return {k: _jsonable(v) for k, v in flat.items()}


def config_changes(
  saved: Mapping[str, Any], cfg: TrainConfig
) -> dict[str, tuple[Any, Any]]:
  """{dotted field: (saved, new)} for every trajectory-changing field that
  differs."""
  run_control = set(RUN_CONTROL_FIELDS)
  if cfg.optim.schedule == "cosine" and not cfg.optim.steps:
    run_control.discard("run.steps")  # the cosine length is steps * updates
  old_values = saved_fields(saved)
  out = {}
  for name, value in config_lib.to_flat(cfg).items():
    if name in run_control:
      continue
    new = _jsonable(value)
    old = old_values.get(name, _jsonable(config_lib.field_default(name)))
    if old != new:
      out[name] = (old, new)
  return out


def check_resume_config(
  saved: Mapping[str, Any], cfg: TrainConfig, step: int
) -> dict[str, tuple[Any, Any]]:
  """Raises ConfigChangeError unless every change is allowed; returns them."""
  allowed = allowed_changes(cfg)
  changes = config_changes(saved, cfg)
  refused = {k: v for k, v in changes.items() if k not in allowed}
  if refused:
    listed = "; ".join(f"{k}: {o!r} -> {n!r}" for k, (o, n) in refused.items())
    raise ConfigChangeError(
      f"run_dir={cfg.run.run_dir!r} was trained up to step {step} with another "
      f"configuration ({listed}). Resume with the values it was trained "
      "with, or name the fields you mean to change: "
      f"--run.allow_config_change={','.join(sorted(refused))}"
    )
  return changes


class RunDir:
  """`cfg.run.run_dir`, opened for training by this process (see module doc).

  Attributes:
    checkpointer: the run's `RunCheckpointer`.
    resume_step: the verified checkpoint step to restore, or None to start.
    changes: the allowed config changes, {field: (saved, new)}.
  """

  def __init__(self, cfg: TrainConfig, log: Callable[[str], Any] = print):
    allowed_changes(cfg)  # a bad field name fails before anything is touched
    self.cfg = cfg
    # What this start created, for `abandon` to remove.
    self._created = [
      p
      for p in (
        cfg.run.run_dir,
        os.path.join(cfg.run.run_dir, "checkpoints"),
        os.path.join(cfg.run.run_dir, CONFIG_FILE),
        os.path.join(cfg.run.run_dir, LOCK_FILE),
      )
      if not os.path.exists(p)
    ]
    self.resume_step = None
    os.makedirs(cfg.run.run_dir, exist_ok=True)
    main = distributed.is_main_process()
    # The other processes of a multi-host run share process 0's lock.
    self.lock = RunDirLock(cfg.run.run_dir, log) if main else None
    self.checkpointer = None
    try:
      self.checkpointer = RunCheckpointer(
        os.path.join(cfg.run.run_dir, "checkpoints"),
        cfg.run.checkpoint_every,
        cfg.run.keep_checkpoints,
        owner=True,
      )
      self.resume_step, self.changes = self._check(log)
      distributed.barrier("rljax_rundir_checked")
      if not main:
        self.checkpointer.reload()  # process 0 may have set steps aside
        return
      atomic.write_json(
        os.path.join(cfg.run.run_dir, CONFIG_FILE), cfg.to_dict()
      )
      if self.changes:
        with open(
          os.path.join(cfg.run.run_dir, CHANGES_FILE), "a", encoding="utf-8"
        ) as f:
          f.write(
            json.dumps(
              {
                "resumed_at_step": self.resume_step,
                "time": _now(),
                "changes": {
                  k: {"old": o, "new": n} for k, (o, n) in self.changes.items()
                },
              }
            )
            + "\n"
          )
        log(
          f"[rljax] resuming step {self.resume_step} with allowed config "
          f"changes {sorted(self.changes)} (recorded in {CHANGES_FILE})"
        )
    except BaseException:
      self.close()
      raise

  def _check(self, log) -> tuple[int | None, dict]:
    cfg, ckpt = self.cfg, self.checkpointer
    latest = ckpt.latest_step()
    if latest is None:
      return None, {}
    if not cfg.run.resume:
      raise RunDirExistsError(
        f"run_dir={cfg.run.run_dir!r} already holds checkpoints up to step "
        f"{latest}; pass --run.resume to continue that run, or choose "
        "another --run.run_dir"
      )
    step, damaged = ckpt.latest_verified_step()
    meta = ckpt.read_meta(step)
    changes = check_resume_config(meta.get("config", {}), cfg, step)
    for bad_step, reason in damaged:
      if not distributed.is_main_process():
        continue
      dest = ckpt.set_aside(bad_step)
      log(
        f"[rljax] checkpoint step {bad_step} in {ckpt.directory} is "
        f"damaged ({reason}); moved to {dest}; resuming from step {step}"
      )
    return step, changes

  def abandon(self) -> None:
    """`close` after a start that failed before its first step: removes
    what this start created (config.json, an empty checkpoints/, the lock
    file, the directory if it is then empty), so the next start finds the
    directory as it was. A resumed run's files are the run's: kept."""
    self.close()
    if self.resume_step is not None or not distributed.is_main_process():
      return
    for path in reversed(self._created):
      try:
        if os.path.isdir(path):
          os.rmdir(path)  # only when empty: anything else was not ours
        else:
          os.remove(path)
      except OSError:
        pass

  def close(self) -> None:
    if self.checkpointer is not None:
      self.checkpointer.close()
      self.checkpointer = None
    if self.lock is not None:
      self.lock.release()
