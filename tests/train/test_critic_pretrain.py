"""VC-PPO value pretraining (`--critic.pretrain_steps`, train/critic_pretrain.py)
on the tiny random model: the critic's loss falls on a fixed batch while the
policy stays bit-identical, the run's first steps are pretraining steps
(metrics, Monte-Carlo returns, no policy change), and a killed run resumes
inside pretraining."""

import jax
import numpy as np
import pytest

from rljax.train import build_batch as build_batch_lib
from rljax.train import critic_pretrain
from rljax.train import update as update_lib
from rljax.train.metrics import read_metrics
from tests.train.test_trainer import make_trainer, small_config


def _config(run_dir, **kw):
  base = {
    "critic.pretrain_steps": 2,
    "critic.learning_rate": 1e-3,
    "rollout.quant": "none",
    "loss.positive_nll_coef": 0.0,
  }
  base.update(kw)
  return small_config("vapo", run_dir, **base)


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.slow
def test_pretraining_fits_the_critic_only_and_a_killed_run_resumes(tmp_path):
  # One trainer for the fixed-batch check and the first pretraining step,
  # "killed" after it; a second resumes: two model set-ups in all.
  trainer = make_trainer(_config(tmp_path, steps=1))
  try:
    policy = _leaves(trainer.state.params)
    policy_opt = _leaves(trainer.state.opt_state)
    critic = _leaves(trainer.state.critic_params)
    trainer.actor.sync(trainer.policy_params(), 0)
    rollout = trainer.collector.collect(1)
    batch, _ = build_batch_lib.make_batch(
      critic_pretrain.monte_carlo_config(trainer.cfg),
      trainer.spec,
      rollout,
      trainer.pad_id,
      trainer._compute_policy_params,
      None,
      update_lib.compute_critic(trainer.spec, trainer.state.critic_params),
    )
    # λ = 1, γ = 1: every valid token's target is the outcome reward.
    mask = np.asarray(batch["loss_mask"]) > 0
    expected = np.where(mask, np.asarray(rollout.rewards)[:, None], 0.0)
    np.testing.assert_allclose(batch["returns"], expected, rtol=1e-6)
    # The fixed batch, 8 critic updates (not kept: trainer.state is as it was).
    state, losses = trainer.state, []
    for _ in range(8):
      state, metrics = trainer.critic_step(state, batch)
      losses.append(float(metrics["value_loss"]))
      assert float(metrics["applied"]) == 1.0
    assert losses[-1] < 0.5 * losses[0], losses
    for a, b in zip(policy, _leaves(state.params)):
      np.testing.assert_array_equal(a, b)  # bit-identical
    for a, b in zip(policy_opt, _leaves(state.opt_state)):
      np.testing.assert_array_equal(a, b)
    moved = _leaves(state.critic_params)
    assert any(not np.array_equal(a, b) for a, b in zip(critic, moved))
    # Step 1 of the run: a pretraining step, the policy still untouched.
    first = trainer.train_step()
    assert first["critic_pretrain"] == 1.0 and "loss" not in first
    assert np.isfinite(first["value_loss"])
    for a, b in zip(policy, _leaves(trainer.state.params)):
      np.testing.assert_array_equal(a, b)
  finally:
    trainer.close()
  del trainer
  resumed = make_trainer(_config(tmp_path, steps=1, resume=True))
  assert resumed.step_num == 1
  try:
    rest = resumed.run()
    after = _leaves(resumed.state.params)
  finally:
    resumed.close()
  # Pretraining step 2, then run.steps = 1 RL step.
  assert [r["step"] for r in rest] == [2, 3]
  assert [r.get("critic_pretrain", 0.0) for r in rest] == [1.0, 0.0]
  assert "loss" in rest[1] and np.isfinite(rest[1]["value_loss"])
  # Pretraining steps are not policy versions: θ_0's tokens trained after
  # them lag 0 (counting steps would read 1 on step 3).
  assert [r["version_lag_max"] for r in rest] == [0.0, 0.0]
  assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3]
  assert any(not np.array_equal(a, b) for a, b in zip(policy, after))


def test_no_critic_means_no_pretraining_steps():
  from rljax.train.config import ConfigError, apply_preset

  # Without a critic there is nothing to pretrain: refused, not ignored.
  with pytest.raises(ConfigError, match=r"--critic.pretrain_steps=3"):
    apply_preset("grpo", {"critic.pretrain_steps": 3, "run.steps": 4})
  cfg = apply_preset("grpo", {"run.steps": 4})
  assert critic_pretrain.total_steps(cfg) == 4
  cfg = apply_preset("vapo", {"critic.pretrain_steps": 3, "run.steps": 4})
  assert critic_pretrain.total_steps(cfg) == 7
  assert [critic_pretrain.policy_version(cfg, s) for s in (0, 3, 4, 7)] == [
    0,
    0,
    1,
    4,
  ]
  assert cfg.optim_config(critic=True).steps == 7
  assert cfg.optim_config().steps == 4
