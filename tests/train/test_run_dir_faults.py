"""Faults of the run directory and the update, without a training
subprocess: a second lock, checkpoint rotation, the metrics log kept across a
fresh start and a kill inside its rewrite, a full disk (named, the old file
kept), and the guarded update that lets no non-finite value reach a
checkpoint or the engine."""

import errno
import json
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax.train import checkpoint as ckpt_lib
from rljax.train import guard
from rljax.train import rundir as rundir_lib
from rljax.train import update as update_lib
from rljax.train.metrics import MetricsWriter, read_metrics

from .test_trainer import make_trainer, small_config

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def test_second_lock_is_refused_and_a_stale_one_taken_over(tmp_path):
  first = rundir_lib.RunDirLock(str(tmp_path))
  with pytest.raises(
    rundir_lib.RunDirLockedError, match=f"pid {os.getpid()} on host"
  ):
    rundir_lib.RunDirLock(str(tmp_path))
  first.release()
  # A killed holder leaves its pid in the file but no flock.
  with open(os.path.join(str(tmp_path), rundir_lib.LOCK_FILE), "w") as f:
    json.dump({"pid": 999999, "host": "h", "since": "t"}, f)
  lines = []
  rundir_lib.RunDirLock(str(tmp_path), log=lines.append).release()
  assert "taking over the lock left by pid 999999" in lines[0]


def test_rotation_never_keeps_fewer_than_one_verified_checkpoint(tmp_path):
  with pytest.raises(ValueError, match="keep_checkpoints=0"):
    ckpt_lib.RunCheckpointer(str(tmp_path / "none"), 1, 0)
  ckpt = ckpt_lib.RunCheckpointer(str(tmp_path / "one"), 1, 1)
  try:
    for step in (1, 2, 3):
      ckpt.save(step, {"w": np.full((3,), step, np.float32)}, {"step": step})
      assert ckpt.all_steps() == [step]
      assert ckpt.latest_verified_step() == (step, [])
  finally:
    ckpt.close()


def test_a_fresh_start_never_deletes_an_earlier_metrics_log(tmp_path):
  path = os.path.join(str(tmp_path), "metrics.jsonl")
  with open(path, "w") as f:
    f.write('{"step": 1, "loss": 0.5}\n')
  MetricsWriter(str(tmp_path), tensorboard=False).close()
  kept = [
    n
    for n in os.listdir(str(tmp_path))
    if n.startswith("metrics.") and n != "metrics.jsonl"
  ]
  assert len(kept) == 1
  with open(os.path.join(str(tmp_path), kept[0])) as f:
    assert json.loads(f.readline())["loss"] == 0.5
  assert read_metrics(str(tmp_path)) == []


# Opens every file of the run directory opened for writing so that its first
# write stores half of its bytes and then SIGKILLs the process: a kill inside
# the rewrite, whatever writes the file (`open` is looked up at call time).
_KILL_INSIDE_REWRITE = """
import builtins, os, signal, sys
run_dir = sys.argv[1]
real_open = builtins.open

class Dying:
  def __init__(self, f):
    self.f = f
  def __enter__(self):
    return self
  def __exit__(self, *a):
    return self.f.__exit__(*a)
  def write(self, data):
    self.f.write(data[: len(data) // 2])
    self.f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
  def writelines(self, lines):
    self.write("".join(lines))
  def __getattr__(self, name):
    return getattr(self.f, name)

def dying_open(path, mode="r", *args, **kwargs):
  f = real_open(path, mode, *args, **kwargs)
  in_run = os.path.abspath(str(path)).startswith(run_dir)
  return Dying(f) if in_run and ("w" in mode or "a" in mode) else f

builtins.open = dying_open
from rljax.train.metrics import MetricsWriter
MetricsWriter(run_dir, tensorboard=False, resume_step=int(sys.argv[2]))
"""


def test_a_kill_inside_the_resumes_metrics_rewrite_loses_no_row(tmp_path):
  """A resume from an older checkpoint cuts metrics.jsonl
  back to its step; a kill -9 inside that rewrite leaves the whole old file
  (it is replaced atomically), so the next resume still has rows 1..4."""
  run_dir = str(tmp_path)
  rows = [{"step": s, "loss": 0.1 * s} for s in range(1, 7)]
  with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  env = dict(
    os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
  )
  proc = subprocess.run(
    [sys.executable, "-c", _KILL_INSIDE_REWRITE, run_dir, "4"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == -signal.SIGKILL, proc.stderr
  assert read_metrics(run_dir) == rows  # untouched by the killed rewrite
  MetricsWriter(run_dir, tensorboard=False, resume_step=4).close()
  assert read_metrics(run_dir) == rows[:4]
  assert sorted(os.listdir(run_dir)) == ["metrics.jsonl"]  # no temporary


def test_a_full_disk_is_named_and_leaves_the_old_file(tmp_path, monkeypatch):
  """ENOSPC injected at the fsync of the new file (a real full tmpfs
  behaves the same when checked by hand)."""
  from rljax.train import atomic

  path = os.path.join(str(tmp_path), "config.json")
  atomic.write_json(path, {"a": 1})

  def full(fd):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(atomic.os, "fsync", full)
  with pytest.raises(atomic.DiskFullError) as e:
    atomic.write_json(path, {"a": 2})
  assert str(e.value).startswith(
    f"[Errno 28] no space left on {tmp_path}: "
    f"{len(json.dumps({'a': 2}, indent=1))} bytes needed (config.json)"
  )
  assert os.listdir(str(tmp_path)) == ["config.json"]  # no temporary left
  with open(path) as f:
    assert json.load(f) == {"a": 1}


def test_a_checkpoint_that_runs_out_of_space_is_named_and_removed(
  tmp_path, monkeypatch
):
  """A save that fails for lack of space raises
  DiskFullError naming the directory, and the unfinished step is removed
  (the older, verified one stays)."""
  from rljax.train import atomic

  ckpt = ckpt_lib.RunCheckpointer(str(tmp_path / "checkpoints"), 1, 2, True)
  state = {"w": np.arange(4, dtype=np.float32)}
  try:
    ckpt.save(1, state, {"step": 1})
    write_manifest = ckpt_lib.write_manifest

    def full(step_dir):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), step_dir)

    monkeypatch.setattr(ckpt_lib, "write_manifest", full)
    with pytest.raises(
      atomic.DiskFullError,
      match="no space left on .*checkpoints: 16 bytes needed",
    ):
      ckpt.save(2, state, {"step": 2})
    monkeypatch.setattr(ckpt_lib, "write_manifest", write_manifest)
    assert sorted(os.listdir(str(tmp_path / "checkpoints"))) == ["1"]
    assert ckpt.latest_verified_step() == (1, [])
  finally:
    ckpt.close()


@pytest.mark.parametrize("jit", [False, True])
def test_guarded_update_keeps_the_old_state_unless_all_results_are_finite(jit):
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  grads = {"w": jnp.zeros(3)}  # finite gradients...
  for b2, want in ((0.999, True), (1.0, False)):  # ...b2 = 1 divides 0 by 0
    opt = optax.adam(0.1, b2=b2)
    state = opt.init(params)
    fn = lambda g, s, p, l, opt=opt: update_lib.guarded_update(opt, g, s, p, l)
    fn = jax.jit(fn) if jit else fn
    new_p, new_s, applied = fn(grads, state, params, jnp.float32(0.0))
    assert bool(applied) == want
    assert bool(update_lib.all_finite((new_p, new_s)))
    if not want:
      np.testing.assert_array_equal(new_p["w"], params["w"])
      np.testing.assert_array_equal(new_s[0].count, state[0].count)
  opt = optax.adam(0.1)
  _, _, applied = update_lib.guarded_update(
    opt,
    {"w": jnp.array([0.0, jnp.nan, 0.0])},
    opt.init(params),
    params,
    jnp.float32(0.0),
  )
  assert not bool(applied)
  _, _, applied = update_lib.guarded_update(
    opt, grads, opt.init(params), params, jnp.float32(jnp.inf)
  )
  assert not bool(applied)


def test_nan_weights_reach_neither_a_checkpoint_nor_the_engine(tmp_path):
  """`--optim.b2=1.0` makes finite gradients give NaN params.

  validate() now refuses optim.b2 = 1 up front (16.7); the value is forced
  past it here to exercise the second line of defence, the guard on the
  updated parameters and optimizer state."""
  cfg = small_config("grpo", tmp_path, steps=2, group_size=2, max_new_tokens=4)
  object.__setattr__(cfg.optim, "b2", 1.0)  # frozen dataclass: bypass checks
  trainer = make_trainer(cfg)
  try:
    trainer.actor.sync(trainer.policy_params(), trainer.step_num)
    with pytest.raises(guard.NonFiniteError, match="not applied"):
      trainer.train_step()
    assert bool(update_lib.all_finite(trainer.state))
    assert trainer.checkpointer.all_steps() == []
    # Whatever the cause, non-finite weights are never written or pushed.
    nan_state = trainer.state.replace(
      params=jax.tree.map(lambda x: x * jnp.nan, trainer.state.params)
    )
    trainer.state = nan_state
    with pytest.raises(guard.NonFiniteError):
      trainer.actor.prepare(trainer.policy_params(), trainer.step_num)
    with pytest.raises(guard.NonFiniteError):
      ckpt_lib.save_step(trainer.checkpointer, 1, trainer.state, {})
    assert trainer.checkpointer.all_steps() == []
  finally:
    trainer.close()
