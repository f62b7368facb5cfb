"""Tool (multi-turn) tasks in the asynchronous modes: one_step (pipelined)
and streaming, on the forced tiny decoder of test_tool_training.py (every
episode: call, observation, call; `task.max_turns=2` ends it, reward 0).

one_step: the worker runs step k+1's episodes while step k trains; their
rewards and tool counters reach the step (and a checkpoint) with the batch.
streaming: each request's episodes run in the stream, taking new weights
between turns. kill -9 in the middle of an episode, in either mode: the
resumed run trains what the uninterrupted one did. The same plumbing
without a model, fast: test_tool_async_parts.py.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from rljax.rollout.base import RolloutBatch
from rljax.rollout.multiturn import MultiTurnRollout
from rljax.train import checkpoint as ckpt_lib
from rljax.train import collect as collect_lib
from rljax.train import episode_saved
from rljax.train import group_stream
from rljax.train.metrics import read_metrics
from tests.train.test_tool_training import TURN, _config, _train

# The metrics of a step that say what it trained on (not how long it took).
_SAME = (
  "loss",
  "reward_mean",
  "reward_all_mean",
  "tool_call_rate",
  "turns_mean",
  "tool_calls_mean",
  "malformed_call_rate",
  "episodes",
  "engine_calls",
  "rollout_staleness",
  "rollout_tokens",
  "version_lag_mean",
  "version_lag_max",
  "response_model_tokens_mean",
)


def _one_step(run_dir, **overrides):
  return _config(
    run_dir,
    **{"run.async_mode": "one_step", "run.eval_every": 0, **overrides},
  )


def _check_tool_rows(rows, collected):
  for row, rollout in zip(rows, collected):
    assert np.isfinite(row["loss"]) and row["applied"] == 1.0
    assert row["tool_call_rate"] == 1.0
    assert row["turns_mean"] == 2.0
    assert row["tool_calls_mean"] == 2.0
    assert row["episodes"] == 4.0  # 2 prompts × 2 samples
    assert row["engine_calls"] >= 2.0
    assert row["rollout_tokens"] == 4 * 2 * len(TURN)  # model ids only
    mask = rollout.batch.action_mask
    assert mask is not None
    assert all(m.sum() == 2 * len(TURN) for m in mask)


def test_episode_floats_round_trip():
  rb = RolloutBatch(
    prompt_ids=[[1, 2]],
    response_ids=[[3, 4, 5], [6]],
    behav_logp=[np.zeros(3, np.float32), np.zeros(1, np.float32)],
    finish_reason=["stop", "length"],
    n=2,
  )
  infos = [
    {"turns": 2, "tool_calls": 1, "malformed_calls": 1, "tool_errors": {}},
    {"turns": 1, "tool_calls": 0, "malformed_calls": 0,
     "tool_errors": {"timeout": 2}},
  ]  # fmt: skip
  out = MultiTurnRollout(
    rb, np.array([1.0, 0.0], np.float32), infos,
    {"engine_calls": 3.0, "continuations": 1.0, "turns_mean": 1.5},
  )  # fmt: skip
  extra = {"rollout_staleness": 1.0, **episode_saved.encode(out)}
  saved, rest = episode_saved.split(extra)
  assert rest == {"rollout_staleness": 1.0}
  back = episode_saved.decode(rb, saved)
  np.testing.assert_array_equal(back.rewards, out.rewards)
  assert collect_lib.episode_metrics([back]) == collect_lib.episode_metrics(
    [out]
  )
  with pytest.raises(ValueError, match="one per row"):
    episode_saved.decode(RolloutBatch.concat([rb, rb]), saved)


@pytest.mark.slow  # a whole trainer run (~40-140 s on 2 cores)
def test_one_step_trains_on_episodes(tmp_path, monkeypatch):
  rows, collected, _ = _train(
    _one_step(tmp_path, **{"run.steps": 3}), monkeypatch
  )
  assert [r["step"] for r in rows] == [1, 2, 3]
  _check_tool_rows(rows, collected)
  # Step k trains on episodes θ_{k-2} sampled (θ_0 for the first two).
  assert [r["rollout_staleness"] for r in rows] == [0.0, 1.0, 1.0]
  versions = [
    sorted({int(v) for row in c.batch.policy_version for v in row})
    for c in collected
  ]
  assert versions == [[0], [0], [1]]
  assert [r["version_lag_max"] for r in rows] == [0.0, 1.0, 1.0]


@pytest.mark.slow  # three trainer runs
def test_one_step_resume_trains_what_the_uninterrupted_run_did(
  tmp_path, monkeypatch
):
  full_rows, full_collected, _ = _train(
    _one_step(tmp_path / "full", **{"run.steps": 3}), monkeypatch
  )
  # Cut after step 2: its checkpoint holds step 3's episodes, in flight.
  _train(
    _one_step(tmp_path / "cut", **{"run.steps": 2, "run.checkpoint_every": 1}),
    monkeypatch,
  )
  rows, collected, _ = _train(
    _one_step(tmp_path / "cut", **{"run.steps": 3, "run.resume": True}),
    monkeypatch,
  )
  assert [r["step"] for r in rows] == [3]
  _check_tool_rows(rows, collected)
  want, got = full_rows[2], rows[0]
  for key in _SAME:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
  a, b = full_collected[2].batch, collected[0].batch
  assert a.response_ids == b.response_ids
  assert [m.tolist() for m in a.action_mask] == [
    m.tolist() for m in b.action_mask
  ]
  assert [v.tolist() for v in a.policy_version] == [
    v.tolist() for v in b.policy_version
  ]
  np.testing.assert_array_equal(full_collected[2].rewards, collected[0].rewards)
  logged = read_metrics(str(tmp_path / "cut"))
  assert [r["step"] for r in logged] == [1, 2, 3]


def _streaming(run_dir, **overrides):
  return _config(
    run_dir,
    **{
      "run.async_mode": "streaming",
      "rollout.batching": "continuous",
      "run.eval_every": 0,
      **overrides,
    },
  )


@pytest.mark.slow  # a whole trainer run (~40-140 s on 2 cores)
def test_streaming_trains_on_episodes(tmp_path, monkeypatch):
  rows, collected, _ = _train(
    _streaming(tmp_path, **{"run.steps": 3}), monkeypatch
  )
  assert [r["step"] for r in rows] == [1, 2, 3]
  _check_tool_rows(rows, collected)
  for row in rows:
    assert row["version_lag_max"] <= 1.0  # run.max_staleness


class TurnGate(group_stream.GroupStream):
  """A stream whose worker holds to θ_0 until step 2's episodes have made
  their first engine call, then waits for θ_1 before their second: those
  episodes span a weight swap, whatever the threads' speeds."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._seen, self._cap, self._step2_calls = {}, 0, 0

  def _newest(self):
    item = self.mailbox.latest()
    if item is not None:
      self._seen[item.version] = item
    allowed = [v for v in self._seen if v <= self._cap]
    return self._seen[max(allowed)] if allowed else None

  def _between_turns(self, key):
    if key == (2, 0):
      self._step2_calls += 1
      if self._step2_calls == 2:
        deadline = time.monotonic() + 600
        while (self.mailbox.latest() or self._seen[0]).version < 1:
          assert time.monotonic() < deadline, "θ_1 was never published"
          time.sleep(0.05)
        self._cap = 1 << 30
    return super()._between_turns(key)


@pytest.mark.slow  # a whole trainer run (~40-140 s on 2 cores)
def test_an_episode_spanning_a_swap_has_tokens_of_two_versions(
  tmp_path, monkeypatch
):
  monkeypatch.setattr(group_stream, "GroupStream", TurnGate)
  rows, collected, _ = _train(
    _streaming(tmp_path, **{"run.steps": 2}), monkeypatch
  )
  step2 = collected[1].batch
  for versions, mask in zip(step2.policy_version, step2.action_mask):
    model = versions[np.asarray(mask, bool)]
    # The first call (up to the opening tag's '>') sampled with θ_0, every
    # later one with θ_1: one episode, two versions, in order.
    assert model[0] == 0 and model[-1] == 1
    assert np.all(np.diff(model) >= 0)
  assert rows[1]["rollout_weight_swaps"] >= 1.0
  assert rows[1]["version_lag_max"] == 1.0 and rows[1]["version_lag_mean"] < 1
  # Step 1's episodes ran with θ_0 alone.
  assert {int(v) for r in collected[0].batch.policy_version for v in r} == {0}


WORKER = os.path.join(os.path.dirname(__file__), "tool_fault_worker.py")
ENV = dict(os.environ, JAX_PLATFORMS="cpu", RLJAX_HUGE_PAGES="0")


def _worker(fields: dict, env=None, log=None):
  """The worker's output once it ends; with `log` (a file, not a pipe that
  could fill while nobody reads it), the running process."""
  cmd = [sys.executable, WORKER, json.dumps(fields)]
  proc = subprocess.Popen(
    cmd, env=env or ENV, stdout=log or subprocess.PIPE,
    stderr=subprocess.STDOUT, text=True,
  )  # fmt: skip
  if log is not None:
    return proc
  out, _ = proc.communicate(timeout=1200)
  assert proc.returncode == 0, out[-4000:]
  return out


# Each step's 4 episodes make 2 calculator calls each: call 17 is the first
# of step 3's episodes.
_STEP_3_CALL = 17


@pytest.mark.slow  # three training processes, one killed
# ~8 (one_step) and ~12 (streaming) minutes on 2 busy cores: past the
# suite's 900 s per test.
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("mode", ["one_step", "streaming"])
def test_kill_9_mid_episode_resumes_to_the_uninterrupted_run(tmp_path, mode):
  fields = {
    "run.steps": 3,
    "run.checkpoint_every": 1,
    "run.eval_every": 0,
    "run.async_mode": mode,
  }
  if mode == "streaming":
    # Staleness 0: nothing newer exists while a request's episodes run, so
    # the run is a function of its own progress (comparable token for
    # token); every step's episodes run after the step before trained.
    fields.update({"rollout.batching": "continuous", "run.max_staleness": 0})
  full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
  _worker({**fields, "run.run_dir": full})
  marker = str(tmp_path / "in_episode")
  env = dict(
    ENV, RLJAX_TEST_SLOW_CALL=str(_STEP_3_CALL), RLJAX_TEST_IN_EPISODE=marker
  )
  with open(tmp_path / "killed.log", "w") as log:
    proc = _worker({**fields, "run.run_dir": cut}, env=env, log=log)
    deadline = time.monotonic() + 900
    while not os.path.exists(marker):
      assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-4000:]
      assert time.monotonic() < deadline, "no episode of step 3 started"
      time.sleep(0.2)
    # The last checkpoint before the kill: one_step's of step 1 (step 2's
    # waits for step 3's episodes), streaming's of step 2 (its cut came
    # before step 3's episodes began, and it is written while they run).
    start = 1 if mode == "one_step" else 2
    manifest = os.path.join(cut, "checkpoints", str(start), ckpt_lib.MANIFEST)
    while not os.path.exists(manifest):
      assert time.monotonic() < deadline, f"checkpoint {start} never completed"
      time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # step 3's episodes in flight
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
  out = _worker({**fields, "run.run_dir": cut, "run.resume": True})
  # Step 3's episodes are run again, from the same prompts and weights.
  assert f"starts at step {start}" in out, out[-4000:]
  want, got = read_metrics(full), read_metrics(cut)
  assert [r["step"] for r in got] == [1, 2, 3]  # each step logged once
  for a, b in zip(want, got):
    for key in _SAME:
      np.testing.assert_allclose(
        b[key], a[key], rtol=1e-6, err_msg=f"step {a['step']}: {key}"
      )
