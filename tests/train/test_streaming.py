"""--run.async_mode=streaming: a worker generates
ahead and takes each new θ between decode chunks; run.max_staleness paces
it. Equivalence with the synchronous run at max_staleness=0, the lag bound
and mid-response versions at max_staleness=2, the resume of queued
rollouts, and the settings streaming refuses."""

import dataclasses
import time

import jax
import numpy as np
import pytest

from rljax.train import checkpoint as checkpoint_lib
from rljax.train import config as config_lib
from rljax.train import group_stream
from rljax.train.metrics import read_metrics
from tests.train.test_trainer import make_trainer, small_config

# One shape for every run here, so that they share compiled programs: 40
# new tokens make two decode chunks of the engine's 32 steps (a swap point
# between them), and a learning-rate schedule that does not depend on
# run.steps.
CONTINUOUS = {
  "rollout.batching": "continuous",
  "max_new_tokens": 40,
  "optim.steps": 4,
}
STREAM0 = {**CONTINUOUS, "run.async_mode": "streaming", "run.max_staleness": 0}
# Keys that measure wall time (or its rates): the only ones that may differ.
_TIMED = ("time_", "_per_s", "seconds")


def _run(cfg, setup=None):
  trainer = make_trainer(cfg)
  try:
    if setup is not None:
      setup(trainer)
    rows = trainer.run()
    params = jax.device_get(trainer.state.params)
    return trainer, rows, params
  finally:
    trainer.close()


def _untimed(row):
  """The keys a batch determines: not wall time, and not how the trainer
  and the worker happened to meet (`group_stream.SCHEDULE_METRICS`)."""
  return {
    k: v
    for k, v in row.items()
    if not any(t in k for t in _TIMED)
    and k not in group_stream.SCHEDULE_METRICS
  }


def _assert_same_rows(got, want):
  assert [r["step"] for r in got] == [r["step"] for r in want]
  for g, w in zip(got, want):
    g, w = _untimed(g), _untimed(w)
    shared = sorted(set(g) & set(w))
    for key in ("loss", "reward_mean", "grad_norm", "version_lag_max"):
      assert key in shared
    assert {k: g[k] for k in shared} == {k: w[k] for k in shared}


def _assert_same_params(got, want):
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(scope="module")
def synchronous(tmp_path_factory):
  """(rows, params) of 3 synchronous steps on the continuous engine."""
  cfg = small_config(
    "grpo", tmp_path_factory.mktemp("off"), steps=3, **CONTINUOUS
  )
  _, rows, params = _run(cfg)
  return rows, params


def test_streaming_at_staleness_0_is_the_synchronous_run(synchronous, tmp_path):
  """max_staleness=0: step j's request starts once step j − 1 has trained,
  from θ_{j−1}, and nothing newer exists while it decodes: the same rows
  and params, bit for bit, as async_mode=off."""
  trainer, rows, params = _run(
    small_config("grpo", tmp_path, steps=3, **STREAM0)
  )
  assert trainer.cfg.run.async_mode == "streaming"
  assert not trainer.cfg.run.pipelined
  _assert_same_rows(rows, synchronous[0])
  _assert_same_params(params, synchronous[1])
  assert [r["version_lag_max"] for r in rows] == [0.0, 0.0, 0.0]
  assert [r["rollout_weight_swaps"] for r in rows] == [0.0, 0.0, 0.0]


# On the page-pool engine a free-running worker can decode the same rows in
# another row bucket than the uninterrupted run did: runs on the AMX Xeon
# (2026-11-29, 3 of 7) saw equal tokens but behav_prox_log_ratio_mean 2.0e-5 vs
# -1.1e-5. Bit-for-bit streaming resumes are checked on the deterministic
# schedule (test_faults.py). Since `layers.rms_norm` became row-count
# invariant (one cause of the bucket dependence) this test passed in both
# README-command runs; it stays non-strict until more runs show no other
# row-count-dependent op is left.
@pytest.mark.xfail(
  strict=False,
  reason="behaviour log-probs can differ by row bucket at float level",
)
def test_a_resume_trains_the_queued_request(synchronous, tmp_path):
  """A 3-step run stopped after step 2, then a resume. The checkpoint of
  step 2 is the stream cut right before the worker took θ_2: step 3's
  request is in it, queued, or was admitted after it (at max_staleness=0
  nothing of it is sampled before θ_2), and the resume samples it with θ_2
  as the uninterrupted run does: the same rows and params, bit for bit."""

  class Stop(Exception):
    pass

  def stop_after_two(trainer):
    step = trainer.train_step

    def limited():
      row = step()
      if trainer.step_num == 2:
        raise Stop
      return row

    trainer.train_step = limited

  with pytest.raises(Stop):
    _run(small_config("grpo", tmp_path, steps=3, **STREAM0), stop_after_two)
  first = read_metrics(str(tmp_path))
  trainer = make_trainer(
    small_config("grpo", tmp_path, steps=3, resume=True, **STREAM0)
  )
  try:
    meta = trainer.checkpointer.read_meta(2)
    queued = checkpoint_lib.pending_rollouts(trainer.checkpointer, 2, meta)
    assert trainer.collector.pending == len(queued) <= 1
    resumed = trainer.run()
    params = jax.device_get(trainer.state.params)
  finally:
    trainer.close()
  assert [r["step"] for r in resumed] == [3]
  for rb, extra in queued:
    assert extra["stream_step"] == 3.0
    assert [extra[f"stream_state_{i}"] for i in range(2)] == [2.0, 2.0]
    assert not any(rb.response_ids)  # queued: no row sampled yet
  _assert_same_rows(first + resumed, synchronous[0])
  _assert_same_params(params, synchronous[1])


def _wait_for_version(mailbox, version, seconds=300.0):
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    item = mailbox.latest()
    if item is not None and item.version >= version:
      return
    time.sleep(0.01)
  raise AssertionError(f"θ of version {version} was never published")


@pytest.mark.parametrize("inflight_kv", ["keep", "recompute"])
def test_new_weights_reach_requests_in_flight(tmp_path, inflight_kv):
  """max_staleness=2: the worker streams the prompts of up to 3 steps and
  takes new θ between decode chunks. So that the swap is not left to
  thread timing, the test's hook holds θ_1 back until a group of step 2
  has started (steps 1 and 2 start from θ_0; the slots hold one step's
  groups, so step 2 starts once step 1's are done), then, at the next swap
  point (after the first 32-step chunk; 40 new tokens make a second), waits
  for θ_1 and takes it: step 2's responses hold tokens of two versions. No
  token of any step is more than 2 versions behind θ_old."""
  cfg = small_config(
    "grpo",
    tmp_path,
    steps=4,
    **{
      **CONTINUOUS,
      "run.async_mode": "streaming",
      "run.max_staleness": 2,
      "rollout.inflight_kv": inflight_kv,
    },
  )
  started, groups, gated = {}, {}, []

  class Spy:
    """The worker's feed, recording each group's start and rows (tags:
    ((step, round), index))."""

    def __init__(self, feed):
      self.feed = feed

    def poll(self, prompt_len):
      return self.feed.poll(prompt_len)

    def started(self, tag, version):
      started.setdefault(tag, version)
      self.feed.started(tag, version)

    def done(self, group):
      groups[group.tag] = group
      self.feed.done(group)

    def stopped(self):
      return self.feed.stopped()

  collected = []

  def setup(trainer):
    engine, mailbox = trainer.actor.engine, trainer.collector.mailbox
    stream = engine.generate_stream
    collect = trainer.collector.collect
    trainer.collector.collect = lambda step: (
      collected.append(collect(step)) or collected[-1]
    )

    def gated_stream(feed, shape, sampling, *, weight_updates=None, version=0):
      inner = weight_updates

      def hook():
        if not gated:
          if not any(key[0] == 2 for key, _ in started):
            return None  # θ_0 until step 2 has started
          gated.append(True)
          _wait_for_version(mailbox, 1)
        return inner()

      return stream(
        Spy(feed), shape, sampling, weight_updates=hook, version=version
      )

    engine.generate_stream = gated_stream

  _, rows, _ = _run(cfg, setup)
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  for step, (row, out) in enumerate(zip(rows, collected), start=1):
    # Recounted from the trained tokens' versions (θ_old of step s is
    # version s - 1), not read back from the metric.
    lags = np.concatenate([step - 1 - v for v in out.batch.policy_version])
    assert lags.max() <= 2 and lags.min() >= 0
    assert row["version_lag_max"] == lags.max()
    assert row["version_lag_mean"] == pytest.approx(lags.mean())
    assert row["version_lag_ge1"] == pytest.approx((lags >= 1).mean())
  assert max(r["version_lag_max"] for r in rows) >= 1  # some lag was met
  assert gated and started[((2, 0), 0)] == started[((2, 0), 1)] == 0
  for i in (0, 1):
    versions = groups[((2, 0), i)].versions
    mixed = [v for v in versions if len(set(v.tolist())) > 1]
    assert mixed, f"no response of step 2's group {i} has two versions"
    for v in mixed:  # versions only move forward within a response
      assert v[0] == 0 and (np.diff(v) >= 0).all() and v[-1] >= 1
  assert sum(r["rollout_weight_swaps"] for r in rows) >= 1.0


@pytest.mark.parametrize("fault", ["stale", "unversioned"])
def test_a_token_past_the_bound_or_without_a_version_stops_the_step(
  tmp_path, fault
):
  """The per-step lag check is live: at step 2 of max_staleness=0, a
  rollout whose tokens are a version older than allowed, or that carries
  no versions at all (it used to pass unchecked), stops the step before
  it trains."""
  trainer = make_trainer(small_config("grpo", tmp_path, steps=2, **STREAM0))
  collect = trainer.collector.collect

  def broken(step):
    out = collect(step)
    if step == 2:
      versions = out.batch.policy_version
      out.batch = dataclasses.replace(
        out.batch,
        policy_version=None
        if fault == "unversioned"
        else [v - 1 for v in versions],
      )
    return out

  trainer.collector.collect = broken
  error, match = {
    "stale": (RuntimeError, "1 versions behind θ_old; expected <= "),
    "unversioned": (ValueError, "the rollout has no policy_version"),
  }[fault]
  try:
    with pytest.raises(error, match=match):
      trainer.run()
    assert trainer.step_num == 1  # step 2 did not train
  finally:
    trainer.close()


class TestStreamingConfig:
  def resolve(self, **layer):
    return config_lib.resolve("grpo", {"run.async_mode": "streaming", **layer})

  def problems(self, **layer):
    with pytest.raises(config_lib.ConfigError) as e:
      self.resolve(**layer)
    return str(e.value)

  def test_streaming_on_the_continuous_engine_resolves(self):
    cfg = self.resolve(
      **{
        "rollout.batching": "continuous",
        "rollout.inflight_kv": "recompute",
        "run.max_staleness": 0,
      }
    )
    assert cfg.run.async_mode == "streaming" and not cfg.run.pipelined
    assert cfg.rollout.inflight_kv == "recompute"

  def test_one_vllm_server_resolves(self):
    cfg = self.resolve(**{"rollout.engine": "vllm"})
    assert cfg.rollout.engine == "vllm" and cfg.run.async_mode == "streaming"

  def test_a_vllm_pool_is_refused_with_the_fallback(self):
    urls = "http://127.0.0.1:8001,http://127.0.0.1:8002"
    got = self.problems(**{"rollout.engine": "vllm", "rollout.vllm_urls": urls})
    assert "rollout.vllm_urls" in got and urls in got
    assert "--run.async_mode=one_step" in got
    assert "VLLMSidecar.generate_inflight" in got

  def test_the_static_engine_is_refused(self):
    got = self.problems()  # batching defaults to static
    assert "rollout.batching" in got and "'continuous'" in got

  def test_dynamic_sampling_resolves(self):
    # Filtered on arrival, refilled through the stream (test_stream_refill).
    cfg = self.resolve(
      **{"rollout.batching": "continuous", "advantage.dynamic_sampling": True}
    )
    assert cfg.advantage.dynamic_sampling

  def test_a_multi_turn_task_resolves(self):
    # Its episodes run in the stream (test_tool_async.py).
    cfg = self.resolve(
      **{
        "rollout.batching": "continuous",
        "task.name": "tool_arithmetic",
        "reward.name": "verifier",
      }
    )
    assert cfg.task.name == "tool_arithmetic"

  def test_inflight_kv_values(self):
    got = self.problems(
      **{"rollout.batching": "continuous", "rollout.inflight_kv": "drop"}
    )
    assert "rollout.inflight_kv" in got and "one of" in got
    with pytest.raises(config_lib.ConfigError, match="only streaming"):
      config_lib.resolve("grpo", {"rollout.inflight_kv": "recompute"})

  def test_staleness_0_is_streaming_only(self):
    with pytest.raises(config_lib.ConfigError, match=">= 1 with async_mode"):
      config_lib.resolve(
        "grpo", {"run.async_mode": "one_step", "run.max_staleness": 0}
      )
    with pytest.raises(config_lib.ConfigError, match=">= 0"):
      self.resolve(
        **{"rollout.batching": "continuous", "run.max_staleness": -1}
      )
