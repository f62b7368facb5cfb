"""--run.async_mode=streaming (issue 47 items 1 and 4): a worker generates
ahead and takes each new θ between decode chunks; run.max_staleness paces
it. Equivalence with the synchronous run at max_staleness=0, the lag bound
and mid-response versions at max_staleness=2, the resume of queued
rollouts, and the settings streaming refuses."""

import threading
import time

import jax
import numpy as np
import pytest

from rljax.train import batch as batch_lib
from rljax.train import checkpoint as checkpoint_lib
from rljax.train import config as config_lib
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
  return {k: v for k, v in row.items() if not any(t in k for t in _TIMED)}


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


def test_a_resume_trains_the_queued_rollout(synchronous, tmp_path):
  """2 steps (the checkpoint of step 2 holds the queued rollout of step 3),
  then a resume to 3: step 3 trains that rollout (none lost, none
  regenerated), so the resumed run ends where the uninterrupted one does,
  bit for bit."""

  _, first, _ = _run(small_config("grpo", tmp_path, steps=2, **STREAM0))
  trainer = make_trainer(
    small_config("grpo", tmp_path, steps=3, resume=True, **STREAM0)
  )
  try:
    meta = trainer.checkpointer.read_meta(2)
    queued = checkpoint_lib.pending_rollouts(trainer.checkpointer, 2, meta)
    assert trainer.collector.pending == len(queued) == 1
    resumed = trainer.run()
    params = jax.device_get(trainer.state.params)
  finally:
    trainer.close()
  assert [r["step"] for r in resumed] == [3]
  assert resumed[0]["rollout_tokens"] == float(
    sum(len(r) for r in queued[0][0].response_ids)
  )
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
  """max_staleness=2: the worker runs up to 3 requests ahead and takes new
  θ mid-request. So the swap is not left to thread timing, a request of
  step j >= 2 that starts from θ_0 waits at its first swap point
  (after the first 32-step decode chunk; 40 new tokens make a second) until
  θ_1 is published (step 1 trains without this request): its responses
  then hold tokens of two versions. No token of any step is more than 2
  versions behind θ_old."""
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
  step_of = {batch_lib.seed_for(cfg.run.seed, j, 0): j for j in range(1, 9)}
  gated_steps, rollouts = [], {}

  def setup(trainer):
    engine, mailbox = trainer.actor.engine, trainer.collector.mailbox
    generate = engine.generate

    def gated(prompts, sampling, *args, weight_updates=None, version=0, **kw):
      step = step_of[sampling.seed]
      # Only θ_1: a checkpoint waits for every queued request, so a wait
      # for a later θ would deadlock with the checkpoint of step 1.
      if weight_updates is not None and version == 0 and 2 <= step <= 4:
        gated_steps.append(step)
        inner, gate = weight_updates, threading.Event()

        def weight_updates():
          if not gate.is_set():
            gate.set()
            _wait_for_version(mailbox, version + 1)
          return inner()

      rb = generate(
        prompts,
        sampling,
        *args,
        weight_updates=weight_updates,
        version=version,
        **kw,
      )
      rollouts[step] = rb
      return rb

    engine.generate = gated

  _, rows, _ = _run(cfg, setup)
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  for row in rows:
    assert row["version_lag_max"] <= 2
    for key in ("version_lag_mean", "version_lag_ge1", "version_lag_ge4"):
      assert key in row
  # Step 2 starts from θ_0 unless the trainer finished step 1 before the
  # worker took up its next request; either way some request is gated.
  assert gated_steps and gated_steps[0] in (2, 3)
  for step in gated_steps:
    rb = rollouts[step]
    assert rb.timing["weight_swaps"] >= 1
    mixed = [v for v in rb.policy_version if len(set(v.tolist())) > 1]
    assert mixed, f"no response of step {step} holds tokens of two versions"
    for versions in mixed:  # versions only move forward within a response
      assert (np.diff(versions) >= 0).all()
    assert rows[step - 1]["rollout_weight_swaps"] >= 1.0


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

  def test_vllm_is_refused_with_the_fallback(self):
    got = self.problems(**{"rollout.engine": "vllm"})
    assert "rollout.engine" in got and "'vllm'" in got
    assert "--run.async_mode=one_step" in got

  def test_the_static_engine_is_refused(self):
    got = self.problems()  # batching defaults to static
    assert "rollout.batching" in got and "'continuous'" in got

  def test_dynamic_sampling_is_refused(self):
    got = self.problems(
      **{"rollout.batching": "continuous", "advantage.dynamic_sampling": True}
    )
    assert "advantage.dynamic_sampling" in got

  def test_a_multi_turn_task_is_refused(self):
    got = self.problems(
      **{
        "rollout.batching": "continuous",
        "task.name": "tool_arithmetic",
        "reward.name": "verifier",
      }
    )
    assert "run.async_mode" in got and "'streaming'" in got

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
