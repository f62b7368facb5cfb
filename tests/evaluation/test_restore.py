"""Evaluating a training run directory reads it and writes nothing (an
evaluation must not alter the run it judges): `restore_policy` gives the
trainer's own params, UAQ unfolded, and every file of the run is
byte-identical afterwards."""

import hashlib
import os

import jax
import numpy as np
import pytest

from rljax import data as data_lib
from rljax import evaluation
from rljax import quant
from rljax.rollout.base import SamplingConfig
from rljax.train import loop as loop_lib
from rljax.train.config import apply_preset


def _tree_digest(root):
  """{relative path: sha256} of every file under root, and the dir names."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    rel = os.path.relpath(dirpath, root)
    out[rel + "/"] = "dir"
    for name in filenames:
      with open(os.path.join(dirpath, name), "rb") as f:
        out[os.path.join(rel, name)] = hashlib.sha256(f.read()).hexdigest()
  return out


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
  """A one-step INT8 run with UAQ (s = 1.5): params are stored folded."""
  run_dir = str(tmp_path_factory.mktemp("run"))
  cfg = apply_preset(
    "grpo",
    {
      "model.name": "tiny",
      "run.steps": 1,
      "rollout.prompts_per_step": 2,
      "rollout.group_size": 2,
      "rollout.max_new_tokens": 4,
      "task.eval_size": 2,
      "task.reward_workers": 0,
      "run.run_dir": run_dir,
      "run.checkpoint_every": 1,
      "run.tensorboard": False,
      "run.export_hf": False,
      "optim.learning_rate": 1e-3,
      "rollout.quant": "int8",
      "rollout.uaq_scale": 1.5,
    },
  )
  trainer = loop_lib.Trainer(cfg, show_progress=False)
  try:
    trainer.run()
    assert trainer.uaq_scale == 1.5
    unfolded = quant.unfold_uaq(
      trainer.model_config, trainer.state.params, scale=trainer.uaq_scale
    )
    unfolded = jax.tree.map(np.asarray, unfolded)
  finally:
    trainer.close()
  return run_dir, unfolded


def test_restore_policy_gives_the_trainers_params(trained_run):
  run_dir, expected = trained_run
  model = evaluation.restore_policy(run_dir)
  assert jax.tree.structure(model.params) == jax.tree.structure(expected)
  for got, want in zip(
    jax.tree.leaves(model.params), jax.tree.leaves(expected)
  ):
    np.testing.assert_array_equal(np.asarray(got), want)


def test_evaluating_a_run_dir_writes_nothing_into_it(trained_run):
  run_dir, _ = trained_run
  before = _tree_digest(run_dir)
  model = evaluation.load_policy(run_dir)
  from rljax.rollout.jax_sampler import JaxSampler

  engine = JaxSampler(model.config, model.params, max_prompt_len=128, pad_id=0)
  summary, _ = evaluation.evaluate_dataset(
    model,
    engine,
    data_lib.generate_arithmetic(2, "easy", seed=3),
    SamplingConfig(n=1, greedy=True, max_new_tokens=3),
    k=1,
  )
  engine.close()
  assert summary["examples"] == 2
  assert _tree_digest(run_dir) == before


def test_a_run_dir_without_checkpoint_is_named(tmp_path):
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "config.json").write_text(
    '{"algorithm": "grpo", "model": "tiny"}'
  )
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    evaluation.restore_policy(str(tmp_path))


def test_restoring_a_vllm_run_starts_no_engine(
  trained_run, tmp_path, monkeypatch
):
  """A run trained with engine=vllm is restored without starting a sidecar
  (nor a JAX sampler): the caller starts the engine it asks for."""
  import json
  import shutil
  from rljax.rollout import jax_sampler
  from rljax.rollout import vllm_sidecar

  run_dir, expected = trained_run
  copy = str(tmp_path / "vllm_run")
  shutil.copytree(run_dir, copy)
  with open(os.path.join(copy, "config.json")) as f:
    saved = json.load(f)
  saved.update(engine="vllm", vllm_urls="http://127.0.0.1:9")
  with open(os.path.join(copy, "config.json"), "w") as f:
    json.dump(saved, f)
  started = []

  def spy(name):
    def record(*args, **kwargs):
      started.append(name)
      raise RuntimeError(f"restore_policy started an engine: {name}")

    return record

  monkeypatch.setattr(vllm_sidecar, "engine_for_model", spy("vllm"))
  monkeypatch.setattr(jax_sampler.JaxSampler, "__init__", spy("jax"))
  model = evaluation.load_policy(copy)
  assert started == []
  for got, want in zip(
    jax.tree.leaves(model.params), jax.tree.leaves(expected)
  ):
    np.testing.assert_array_equal(np.asarray(got), want)


def test_restore_policy_of_a_lora_run_merges_and_unfolds(tmp_path):
  """A LoRA run's checkpoint holds the adapters only: restore_policy merges
  them into the (UAQ-folded) base the trainer ran, then unfolds, giving
  unfold(θ_merged) of the trainer itself, and export_run writes that."""
  from rljax import models
  from rljax.train import export as export_lib

  # LetterTask: a reward that varies on a random model, so the adapters move.
  from tests.train.test_trainer import make_trainer, small_config

  cfg = small_config(
    "grpo",
    tmp_path / "run",
    steps=1,
    learning_rate=1e-2,
    rollout_quant="int8",
    uaq_scale=1.5,
    lora_rank=2,
    lora_alpha=4.0,
    lora_targets="q_proj,v_proj",
  )
  trainer = make_trainer(cfg)
  try:
    trainer.run()
    expected = quant.unfold_uaq(
      trainer.model_config, trainer.policy_params(), scale=1.5
    )
    expected = jax.tree.map(np.asarray, expected)
    lora_b = trainer.state.params["layers"]["q_proj"]["lora_b"]
    assert float(np.abs(np.asarray(lora_b)).max()) > 0  # adapters trained
  finally:
    trainer.close()
  model = evaluation.restore_policy(cfg.run.run_dir)
  assert jax.tree.structure(model.params) == jax.tree.structure(expected)
  for got, want in zip(
    jax.tree.leaves(model.params), jax.tree.leaves(expected)
  ):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
  out = export_lib.export_run(cfg.run.run_dir, str(tmp_path / "hf"), "float32")
  _, exported = models.load_hf(out)
  for got, want in zip(jax.tree.leaves(exported), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
