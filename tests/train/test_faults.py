"""Fault injection, end to end on the tiny model: a run directory survives
kill -9 (at a random point, inside orbax's save, before the checksum manifest),
damaged checkpoint files, a second process on the same directory, a changed
config on resume and NaN weights, and the resumed run takes exactly the steps
the uninterrupted one took, logging each step once (a streaming run too, its
rows in flight continued from its checkpoint, on a deterministic worker
schedule: `stream_gate.py`).

Training runs in real subprocesses (`fault_worker.py`) so a kill is a real
SIGKILL; they share a persistent JAX compilation cache and one saved
tokenizer, and two uninterrupted reference runs (synchronous and pipelined)
are made once for the module.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import compile_cache_util
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rljax.train import checkpoint as ckpt_lib
from rljax.train import config as config_lib
from rljax.train import rundir as rundir_lib
from rljax.train import testing
from rljax.train.config import apply_preset
from rljax.train.metrics import read_metrics

# Training subprocesses killed and resumed: CI runs these after the README's
# test command (`-m slow`, .ci/run).
pytestmark = pytest.mark.slow

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
WORKER = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "fault_worker.py"
)
STEPS = 4  # synchronous reference
PIPE_STEPS = 3  # pipelined reference
BASE = dict(
  algorithm="grpo",
  model="tiny",
  prompts_per_step=2,
  group_size=2,
  max_new_tokens=4,
  eval_size=0,
  reward_workers=0,
  checkpoint_every=1,
  keep_checkpoints=4,
  tensorboard=False,
  learning_rate=1e-3,
  export_hf=False,
  micro_batches=1,
)


def overrides(run_dir, **kw) -> dict:
  out = dict(BASE, run_dir=str(run_dir), steps=STEPS)
  out.update(kw)
  return out


def config(run_dir, **kw):
  d = overrides(run_dir, **kw)
  return apply_preset(d.pop("algorithm"), **d)


# -- subprocesses -------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  root = tmp_path_factory.mktemp("faults_env")
  tok_dir = str(root / "tokenizer")
  testing.tiny_tokenizer().save_pretrained(tok_dir)  # pylint: disable=protected-access
  e = dict(os.environ)
  e.update(
    PYTHONPATH=REPO + os.pathsep + e.get("PYTHONPATH", ""),
    RLJAX_TEST_TOKENIZER_DIR=tok_dir,
    **compile_cache_util.env(root / "jax_cache"),
  )
  e.pop("RLJAX_TEST_WAIT_FOR", None)
  return e


def start(env, ovr: dict, die_at: str = "", wait_for: str = ""):
  e = dict(env)
  if wait_for:
    e["RLJAX_TEST_WAIT_FOR"] = wait_for
  cmd = [sys.executable, WORKER, json.dumps(ovr)] + ([die_at] if die_at else [])
  return subprocess.Popen(
    cmd,
    cwd=REPO,
    env=e,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def finish(proc, timeout=400) -> tuple[int, str]:
  out, _ = proc.communicate(timeout=timeout)
  return proc.returncode, out


def wait_until(cond, proc, what: str, timeout=300) -> None:
  t0 = time.time()
  while not cond():
    if proc.poll() is not None:
      raise AssertionError(f"worker ended before {what}:\n{proc.stdout.read()}")
    if time.time() - t0 > timeout:
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.02)


def manifest_written(run_dir, step):
  return lambda: os.path.exists(
    os.path.join(str(run_dir), "checkpoints", str(step), ckpt_lib.MANIFEST)
  )


def saved_params(run_dir, step):
  mgr = ocp.CheckpointManager(
    os.path.join(str(run_dir), "checkpoints"), item_names=("state", "meta")
  )
  try:
    restored = mgr.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore())
    )
  finally:
    mgr.close()
  return jax.tree.map(np.asarray, restored.state["params"])


class Reference:
  def __init__(self, run_dir, steps):
    self.run_dir = run_dir
    self.rows = read_metrics(str(run_dir))
    assert [r["step"] for r in self.rows] == list(range(1, steps + 1))
    self.params = saved_params(run_dir, steps)


@pytest.fixture(scope="module")
def references(env, tmp_path_factory):
  """Uninterrupted runs, synchronous and pipelined (made side by side)."""
  root = tmp_path_factory.mktemp("faults_reference")
  sync = start(env, overrides(root / "sync"))
  pipe = start(env, overrides(root / "pipe", steps=PIPE_STEPS, pipelined=True))
  for proc in (sync, pipe):
    rc, out = finish(proc)
    assert rc == 0, out
  return {
    "sync": Reference(root / "sync", STEPS),
    "pipe": Reference(root / "pipe", PIPE_STEPS),
  }


def assert_same_run(run_dir, ref: Reference, steps: int) -> None:
  """Each step logged once, and the same losses and final params."""
  rows = read_metrics(str(run_dir))
  assert [r["step"] for r in rows] == list(range(1, steps + 1))
  for got, want in zip(rows, ref.rows):
    np.testing.assert_allclose(
      got["loss"], want["loss"], rtol=1e-6, err_msg=f"step {got['step']}"
    )
    np.testing.assert_allclose(got["reward_mean"], want["reward_mean"])
  for a, b in zip(
    jax.tree.leaves(saved_params(run_dir, steps)), jax.tree.leaves(ref.params)
  ):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# -- end to end ------------------------------------------------------------


def test_kill9_after_checkpoint_resumes_to_the_uninterrupted_run(
  env, references, tmp_path
):
  """A real kill -9 (at a random moment after checkpoint 2, maybe inside
  checkpoint 3), then a resume, gives the uninterrupted run's steps (loss
  and params). While the first process lives, a second
  start on its directory is refused naming its pid; once it is killed, its
  stale lock is taken over."""
  run, go = tmp_path / "run", tmp_path / "go"
  first = start(env, overrides(run, steps=50), wait_for=str(go))
  lock = os.path.join(str(run), rundir_lib.LOCK_FILE)

  def locked_by_first():
    try:
      with open(lock) as f:
        return json.load(f)["pid"] == first.pid
    except (OSError, ValueError, KeyError):
      return False

  wait_until(locked_by_first, first, "the first run locks its directory")
  rc, out = finish(start(env, overrides(run, resume=True)))
  assert rc != 0
  assert "RunDirLockedError" in out and f"pid {first.pid}" in out, out
  go.touch()
  wait_until(manifest_written(run, 2), first, "checkpoint 2")
  time.sleep(random.Random(16).uniform(0.0, 1.0))
  os.kill(first.pid, signal.SIGKILL)
  first.communicate()
  assert first.returncode == -signal.SIGKILL
  rc, out = finish(start(env, overrides(run, resume=True)))
  assert rc == 0, out
  assert f"taking over the lock left by pid {first.pid}" in out, out
  assert_same_run(run, references["sync"], STEPS)


def test_pipelined_run_killed_inside_checkpoints_resumes_exactly(
  env, references, tmp_path
):
  """Killed inside orbax's save of step 3, then (resumed) after orbax
  committed step 3 but before its checksum manifest: the unfinished step is
  set aside, and the resume from step 2 trains on the in-flight rollout the
  uninterrupted run trained on (no prompts skipped), step 3 equal to it."""
  run = tmp_path / "run"
  ovr = overrides(run, steps=PIPE_STEPS, pipelined=True)
  rc, out = finish(start(env, ovr, die_at="in_orbax:3"))
  assert rc == -signal.SIGKILL, out
  resumed = dict(ovr, resume=True)
  rc, out = finish(start(env, resumed, die_at="before_manifest:3"))
  assert rc == -signal.SIGKILL, out
  assert os.path.isdir(os.path.join(str(run), "checkpoints", "3"))
  rc, out = finish(start(env, resumed))
  assert rc == 0, out
  damaged = [l for l in out.splitlines() if "damaged" in l]
  assert len(damaged) == 1 and "step 3" in damaged[0], out
  assert "no checksum manifest" in damaged[0] and "from step 2" in damaged[0]
  assert "Traceback" not in out
  assert os.listdir(os.path.join(str(run), ckpt_lib.DAMAGED_DIR))
  assert_same_run(run, references["pipe"], PIPE_STEPS)


# -- streaming: kill -9 at random points ---------------------------------------

# test_streaming.py's shape for the tiny model (40 new tokens: two decode
# chunks of the continuous engine, a swap point between them), a checkpoint
# every two steps (so that some swaps are a checkpoint's cut and some are
# in-flight updates), the worker on `stream_gate`'s deterministic schedule.
STREAM_STEPS = 7
STREAMING = {
  "rollout.batching": "continuous",
  "max_new_tokens": 40,
  "optim.steps": STREAM_STEPS,
  "run.async_mode": "streaming",
  "checkpoint_every": 2,
}


def _rows_logged(run_dir) -> int:
  path = os.path.join(str(run_dir), "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  with open(path, encoding="utf-8") as f:
    return sum(line.endswith("\n") for line in f)


@pytest.mark.parametrize(
  "staleness, inflight_kv, seed", [(1, "keep", 11), (2, "recompute", 12)]
)
def test_streaming_run_killed_at_a_random_point_resumes_to_the_uninterrupted_run(
  env, tmp_path, staleness, inflight_kv, seed
):
  """A streaming run (max_staleness 1 and 2) killed with kill -9 at a
  seeded random point after checkpoint 4, then resumed, ends with the
  uninterrupted run's metrics on every step (every key a batch fixes) and
  its final params, bit for bit. The checkpoint it resumed from held rows
  in flight, part-way: the resume continued them from where the cut left
  them, as the uninterrupted run did.

  Both runs follow `stream_gate`'s schedule (the worker takes prompts and
  weights at polls counted by its own progress, not when its thread
  happens to meet the trainer's): with free-running threads two streaming
  runs differ wherever an in-flight swap landed at another decode chunk,
  interrupted or not."""
  from .test_streaming import _untimed  # also drops the schedule's keys

  gated = dict(env, RLJAX_TEST_STREAM_GATE="1")
  ovr = lambda run_dir: overrides(
    run_dir,
    steps=STREAM_STEPS,
    **STREAMING,
    **{"run.max_staleness": staleness, "rollout.inflight_kv": inflight_kv},
  )
  reference = start(gated, ovr(tmp_path / "reference"))
  run = tmp_path / "run"
  rng = random.Random(seed)
  first = start(gated, ovr(run))
  # At a random moment of step 6, after checkpoint 4 (under the schedule,
  # the cut of a checkpoint after step 4 leaves rows in flight at both
  # staleness bounds).
  wait_until(lambda: _rows_logged(run) >= 5, first, "row 5")
  time.sleep(rng.uniform(0.0, 0.3))
  os.kill(first.pid, signal.SIGKILL)
  out, _ = first.communicate()
  assert first.returncode == -signal.SIGKILL, out
  ckpt = ckpt_lib.RunCheckpointer(os.path.join(str(run), "checkpoints"), 1, 1)
  try:
    c, _ = ckpt.latest_verified_step()
    held = ckpt_lib.pending_rollouts(ckpt, c, ckpt.read_meta(c))
  finally:
    ckpt.close()
  print(f"[test] killed after row {_rows_logged(run)}, checkpoint {c}")
  assert c == 4
  states = [v for _, e in held for k, v in e.items() if "stream_state_" in k]
  assert 1.0 in states, f"no row was in flight at checkpoint {c}: {states}"

  rc, out = finish(start(gated, dict(ovr(run), resume=True)))
  assert rc == 0, out
  assert f"starts at step {c}\n" in out, out
  rc, out = finish(reference)
  assert rc == 0, out
  got, want = read_metrics(str(run)), read_metrics(str(tmp_path / "reference"))
  assert [r["step"] for r in got] == list(range(1, STREAM_STEPS + 1))
  assert [r["step"] for r in want] == [r["step"] for r in got]
  for have, ref in zip(got, want):
    have, ref = _untimed(have), _untimed(ref)
    for key in ("loss", "reward_mean", "grad_norm", "version_lag_mean"):
      assert key in have, key
    assert have == ref, f"step {have['step']}"
  assert max(r["version_lag_max"] for r in got) >= 1.0  # tokens behind θ_old
  for a, b in zip(
    jax.tree.leaves(saved_params(run, STREAM_STEPS)),
    jax.tree.leaves(saved_params(tmp_path / "reference", STREAM_STEPS)),
  ):
    np.testing.assert_array_equal(a, b)


# -- damaged checkpoints, config changes (no training: the reference's files) --


def _largest_file(directory):
  files = [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs]
  return max(files, key=os.path.getsize)


def _truncate(step_dir):
  path = _largest_file(os.path.join(step_dir, "state"))
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _remove_meta(step_dir):
  shutil.rmtree(os.path.join(step_dir, "meta"))


def _bad_json(step_dir):
  with open(os.path.join(step_dir, "meta", "metadata"), "w") as f:
    f.write('{"step": 4, "data_state": ')


def _flip_bit(step_dir):
  path = _largest_file(os.path.join(step_dir, "state"))
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)[0]
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte ^ 0x10]))


@pytest.fixture
def run_copy(references, tmp_path):
  dest = tmp_path / "run"
  shutil.copytree(str(references["sync"].run_dir), str(dest))
  os.remove(os.path.join(str(dest), rundir_lib.LOCK_FILE))
  return dest


@pytest.mark.parametrize(
  "damage", [_truncate, _remove_meta, _bad_json, _flip_bit]
)
def test_damaged_latest_checkpoint_falls_back_to_the_newest_verified(
  run_copy, damage
):
  ckpts = os.path.join(str(run_copy), "checkpoints")
  damage(os.path.join(ckpts, "4"))
  lines = []
  rd = rundir_lib.RunDir(config(run_copy, resume=True), log=lines.append)
  try:
    assert rd.resume_step == 3
  finally:
    rd.close()
  assert len(lines) == 1 and "step 4" in lines[0] and "damaged" in lines[0]
  assert sorted(os.listdir(ckpts)) == ["1", "2", "3"]
  assert os.listdir(os.path.join(str(run_copy), ckpt_lib.DAMAGED_DIR))


def test_no_verified_checkpoint_is_a_clear_error(run_copy):
  ckpts = os.path.join(str(run_copy), "checkpoints")
  for step in ("1", "2", "3", "4"):
    _flip_bit(os.path.join(ckpts, step))
  with pytest.raises(ckpt_lib.CheckpointError, match=ckpts):
    rundir_lib.RunDir(config(run_copy, resume=True))
  assert sorted(os.listdir(ckpts)) == ["1", "2", "3", "4"]  # nothing moved
  rundir_lib.RunDirLock(str(run_copy)).release()  # and the lock was freed


def test_resume_refuses_a_changed_config_without_touching_config_json(run_copy):
  path = os.path.join(str(run_copy), "config.json")
  with open(path, "rb") as f:
    before = f.read()
  for changed in (
    dict(seed=1),
    dict(learning_rate=2e-3),
    dict(rollout_quant="none"),
    dict(algorithm="dapo"),
    dict(eval_size=4),
  ):
    field = next(iter(changed))
    with pytest.raises(
      rundir_lib.ConfigChangeError,
      match=f"--run.allow_config_change=.*{config_lib.legacy_name(field)}",
    ):
      rundir_lib.RunDir(config(run_copy, resume=True, **changed))
  with pytest.raises(FileExistsError, match="--run.resume"):
    rundir_lib.RunDir(config(run_copy, seed=1))
  with pytest.raises(ValueError, match="sed"):
    rundir_lib.RunDir(
      config(run_copy, resume=True, seed=1, allow_config_change="sed")
    )
  with open(path, "rb") as f:
    assert f.read() == before
  # Run-control fields may change freely.
  rundir_lib.RunDir(
    config(
      run_copy,
      resume=True,
      steps=9,
      eval_every=0,
      keep_checkpoints=2,
      checkpoint_every=2,
    )
  ).close()
  assert not os.path.exists(
    os.path.join(str(run_copy), rundir_lib.CHANGES_FILE)
  )
  # A named change is accepted and recorded.
  lines = []
  rundir_lib.RunDir(
    config(run_copy, resume=True, seed=1, allow_config_change="seed"),
    log=lines.append,
  ).close()
  with open(path) as f:
    assert json.load(f)["run"]["seed"] == 1
  with open(os.path.join(str(run_copy), rundir_lib.CHANGES_FILE)) as f:
    record = json.loads(f.readline())
  assert record["changes"] == {"run.seed": {"old": 0, "new": 1}}
  assert record["resumed_at_step"] == STEPS and "run.seed" in lines[0]


# -- small units ---------------------------------------------------------------
