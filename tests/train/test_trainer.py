"""The RL loop end to end on a tiny random model: every preset takes two
steps, a killed run resumes to the same next step, pipelined mode runs, and
NaNs stop a step with a debug dump."""

import json
import os

import jax
import numpy as np
import pytest

from rljax import data as data_lib
from rljax.train import build_batch as build_batch_lib
from rljax.train import guard
from rljax.train import loop as loop_lib
from rljax.train import testing
from rljax.train.config import ALGORITHMS, apply_preset
from rljax.train.metrics import read_metrics
from rljax.train.tasks import Task


class LetterTask(Task):
  """Reward = share of 'e' among the completion's characters: it varies
  across a random model's samples, so advantages and gradients are not 0."""

  def score(self, completions, examples, n):
    scores = np.array(
      [c.count("e") / max(len(c), 1) for c in completions], np.float32
    )
    return scores, {"e_share": scores}


def small_config(algorithm, run_dir, **kw):
  base = dict(
    model="tiny",
    steps=2,
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=6,
    eval_size=0,
    reward_workers=0,
    run_dir=str(run_dir),
    checkpoint_every=1,
    tensorboard=False,
    learning_rate=1e-3,
    export_hf=False,
  )
  if algorithm in ("ppo", "vapo"):
    base.update(group_size=2)
  base.update(kw)
  return apply_preset(algorithm, **base)


def make_trainer(cfg):
  tokenizer = testing.tiny_tokenizer()
  examples = data_lib.generate_arithmetic(64, "easy", seed=cfg.seed)
  task = LetterTask(
    examples[8:],
    examples[:8],
    tokenizer,
    data_lib.ChatTemplate(tokenizer),
    cfg.prompts_per_step,
    cfg.seed,
    cfg.max_prompt_tokens,
    reward_workers=0,
  )
  return loop_lib.Trainer(cfg, task=task, show_progress=False)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_preset_takes_two_finite_steps(tmp_path, algorithm):
  trainer = make_trainer(small_config(algorithm, tmp_path))
  try:
    rows = trainer.run()
  finally:
    trainer.close()
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    assert np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"])
    assert r["applied"] == 1.0
    assert 0.0 <= r["clip_fraction"] <= 1.0
  logged = read_metrics(str(tmp_path))
  assert [r["step"] for r in logged] == [1, 2]
  if trainer.cfg.uses_critic:
    assert "value_loss" in rows[-1]
  if trainer.cfg.kl_coef > 0:
    assert "kl_to_ref" in rows[-1]


def test_params_change_when_rewards_vary(tmp_path):
  cfg = small_config("grpo", tmp_path, steps=1, rollout_quant="none")
  trainer = make_trainer(cfg)
  before = jax.tree.map(np.asarray, trainer.state.params)
  try:
    row = trainer.run()[0]
  finally:
    trainer.close()
  assert row["advantage_abs_max"] > 0  # the letter task gives variance
  diff = max(
    float(np.max(np.abs(a - np.asarray(b))))
    for a, b in zip(
      jax.tree.leaves(before), jax.tree.leaves(trainer.state.params)
    )
  )
  assert diff > 0


def test_killed_run_resumes_to_the_same_next_step(tmp_path):
  full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
  full = make_trainer(small_config("grpo", full_dir, steps=4))
  try:
    full_rows = full.run()
  finally:
    full.close()
  # The same run, "killed" after step 3: its object is dropped mid-run.
  killed = make_trainer(small_config("grpo", killed_dir, steps=4))
  killed.actor.sync(killed.policy_params(), killed.step_num)
  for _ in range(3):
    killed.train_step()
  killed.close()
  del killed
  resumed = make_trainer(small_config("grpo", killed_dir, steps=4, resume=True))
  assert resumed.step_num == 3
  try:
    resumed_rows = resumed.run()
  finally:
    resumed.close()
  assert [r["step"] for r in resumed_rows] == [4]
  np.testing.assert_allclose(
    resumed_rows[0]["loss"], full_rows[3]["loss"], rtol=1e-6
  )
  np.testing.assert_allclose(
    resumed_rows[0]["reward_mean"], full_rows[3]["reward_mean"]
  )
  for a, b in zip(
    jax.tree.leaves(full.state.params), jax.tree.leaves(resumed.state.params)
  ):
    np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7
    )
  assert [r["step"] for r in read_metrics(str(killed_dir))] == [1, 2, 3, 4]


def test_existing_run_dir_without_resume_is_refused(tmp_path):
  trainer = make_trainer(small_config("grpo", tmp_path, steps=1))
  trainer.run()
  trainer.close()
  with pytest.raises(FileExistsError, match="--resume"):
    make_trainer(small_config("grpo", tmp_path, steps=1))


def test_pipelined_rollouts_are_one_step_stale(tmp_path):
  trainer = make_trainer(
    small_config("grpo", tmp_path, steps=3, pipelined=True)
  )
  try:
    rows = trainer.run()
  finally:
    trainer.close()
  assert [r["rollout_staleness"] for r in rows] == [0.0, 1.0, 1.0]
  assert all(np.isfinite(r["loss"]) for r in rows)


def test_nan_stops_the_step_and_dumps_the_batch(tmp_path, monkeypatch):
  trainer = make_trainer(small_config("grpo", tmp_path, steps=1))
  original = build_batch_lib.make_batch

  def poisoned(*args, **kwargs):
    batch, metrics = original(*args, **kwargs)
    batch["advantages"] = batch["advantages"] * np.nan
    return batch, metrics

  monkeypatch.setattr(build_batch_lib, "make_batch", poisoned)
  trainer.actor.sync(trainer.policy_params(), trainer.step_num)
  with pytest.raises(guard.NonFiniteError, match="loss"):
    trainer.train_step()
  trainer.close()
  dumped = os.path.join(str(tmp_path), "debug_step1", "metrics.json")
  with open(dumped) as f:
    assert not np.isfinite(json.load(f)["loss"])
  assert os.path.exists(os.path.join(str(tmp_path), "debug_step1", "batch.npz"))
