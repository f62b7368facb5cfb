"""`--reward` in the trainer: `build_reward` picks each reward, and one RL
step on a tiny model trains on the reward model / VR-CLI rewards while the
held-out evaluation keeps the verifier."""

import jax
import numpy as np
import pytest

from rljax import models
from rljax.rewards import judge, likelihood
from rljax.rewards import reward_model as rm
from rljax.train import loop as loop_lib
from rljax.train import tasks
from rljax.train import testing
from rljax.train.config import apply_preset
from rljax.train.metrics import read_metrics


@pytest.fixture(scope="module")
def tiny_rm_dir(tmp_path_factory):
  """A random (untrained) tiny reward model on the SmolLM2 tokenizer."""
  tokenizer = testing.tiny_tokenizer()
  config = models.tiny_config(vocab_size=len(tokenizer))
  params = rm.init_reward_model(
    config,
    models.init_params(config, jax.random.PRNGKey(0)),
    jax.random.PRNGKey(1),
    init_scale=1.0,
  )
  out = tmp_path_factory.mktemp("rm")
  return rm.save_reward_model(out, config, params, tokenizer, max_len=64)


def _cfg(tmp_path, **kw):
  base = dict(
    model="tiny",
    steps=1,
    prompts_per_step=2,
    group_size=2,
    max_new_tokens=6,
    eval_size=2,
    reward_workers=0,
    run_dir=str(tmp_path / "run"),
    tensorboard=False,
    export_hf=False,
    rollout_quant="none",
    learning_rate=1e-3,
  )
  base.update(kw)
  return apply_preset("drgrpo", **base)


def test_build_reward_picks_each_reward(tmp_path, tiny_rm_dir):
  tokenizer = testing.tiny_tokenizer()
  assert tasks.build_reward(_cfg(tmp_path), tokenizer) is None
  got = tasks.build_reward(
    _cfg(tmp_path, reward="reward_model", reward_model_path=tiny_rm_dir),
    tokenizer,
  )
  assert isinstance(got, rm.RewardModelReward)
  got = tasks.build_reward(_cfg(tmp_path, reward="vrcli"), tokenizer)
  assert isinstance(got, likelihood.LikelihoodImprovementReward)
  (tmp_path / "rubrics.txt").write_text("- Clarity.\n")
  got = tasks.build_reward(
    _cfg(
      tmp_path,
      reward="judge",
      judge_rubrics=str(tmp_path / "rubrics.txt"),
      judge_timeout_s=2.0,
    ),
    tokenizer,
  )
  assert isinstance(got, judge.JudgeReward)
  assert got.config.rubrics == "- Clarity." and got.config.timeout_s == 2.0
  got.close()


@pytest.mark.parametrize(
  "reward,component",
  [
    # Each arm is a whole trainer step: the slow tier (which reward each
    # setting builds is checked above, in this tier).
    pytest.param("reward_model", "reward_model", marks=pytest.mark.slow),
    pytest.param("vrcli", "vrcli", marks=pytest.mark.slow),
  ],
)
def test_one_rl_step_on_the_selected_reward(
  tmp_path, tiny_rm_dir, reward, component
):
  cfg = _cfg(tmp_path, reward=reward, reward_model_path=tiny_rm_dir)
  trainer = loop_lib.Trainer(cfg, show_progress=False)
  try:
    row = trainer.run()[0]
    evaluation = trainer.heldout.evaluate(trainer.policy_params())
  finally:
    trainer.close()
  logged = read_metrics(cfg.run.run_dir)[-1]
  assert f"reward_{component}" in logged and "reward_correct" not in logged
  # The trained-on reward is the batched reward's score, not 0/1 accuracy.
  assert np.isfinite(row["reward_mean"]) and np.isfinite(row["loss"])
  assert row["reward_mean"] == pytest.approx(
    logged[f"reward_{component}"], abs=1e-5
  )
  # Held-out evaluation still uses the task's verifier: accuracy in [0, 1].
  assert 0.0 <= evaluation["eval_accuracy"] <= 1.0
  assert evaluation["eval_reward"] in (0.0, 0.5, 1.0)
