"""The code that trains is the code that is tested.

Each test drives the real `Trainer` (tiny random model, real tokenizer,
real task plumbing) or the real batch code, and checks one quantity
against a value computed by hand or independently of the trainer:
DAPO's overlong punishment, the dynamic-sampling refill loop, the KL
reward penalty's estimator, REINFORCE++-baseline whitening with filler
groups, and UAQ fold → train → HF export → reload.
"""

import jax
import numpy as np
import pytest

from rljax import data as data_lib
from rljax import models, quant
from rljax.train import batch as batch_lib
from rljax.train import build_batch as build_batch_lib
from rljax.train import export as export_lib
from rljax.train import loop as loop_lib
from rljax.train import testing
from rljax.train.config import apply_preset
from rljax.train.tasks import Task


class ScriptedTask(Task):
  """A reward whose informativeness is scripted per scoring call.

  `plan[k][i]` says whether group i of the k-th scored rollout has reward
  variance: an informative group scores its samples 0, 1/(n-1), ..., 1; a
  dull one scores 0.5 for every sample (DAPO drops it). Calls past the plan
  are informative. Every batch of prompts drawn is recorded.
  """

  def __init__(self, *args, plan=(), **kw):
    super().__init__(*args, **kw)
    self.plan = list(plan)
    self.calls = 0
    self.drawn = []

  def next_train_batch(self, n):
    batch = super().next_train_batch(n)
    self.drawn.append(list(batch))
    return batch

  def score(self, completions, examples, n):
    flags = (
      self.plan[self.calls]
      if self.calls < len(self.plan)
      else [True] * len(examples)
    )
    self.calls += 1
    ramp = np.linspace(0.0, 1.0, n, dtype=np.float32)
    scores = np.concatenate(
      [ramp if f else np.full(n, 0.5, np.float32) for f in flags]
    )
    return scores, {"scripted": scores}


def _config(algorithm, tmp_path, **kw):
  base = dict(
    model="tiny",
    steps=1,
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=6,
    eval_size=0,
    reward_workers=0,
    run_dir=str(tmp_path),
    checkpoint_every=100,
    tensorboard=False,
    learning_rate=1e-3,
    export_hf=False,
    rollout_quant="none",
  )
  base.update(kw)
  return apply_preset(algorithm, **base)


def _collect_and_build(trainer, step=1):
  """Step `step`'s rollout and the batch built from it, as train_step does."""
  rollout = trainer.collector.collect(step)
  out, _ = build_batch_lib.make_batch(
    trainer.cfg,
    trainer.spec,
    rollout,
    trainer.pad_id,
    trainer.policy_params,
    trainer.ref_params,
    trainer.state.critic_params,
  )
  return rollout.batch, rollout.valid, rollout.rewards, out


def _trainer(cfg, plan=()):
  tokenizer = testing.tiny_tokenizer()
  examples = data_lib.generate_arithmetic(64, "easy", seed=cfg.run.seed)
  task = ScriptedTask(
    examples[8:],
    examples[:8],
    tokenizer,
    data_lib.ChatTemplate(tokenizer),
    cfg.rollout.prompts_per_step,
    cfg.run.seed,
    cfg.task.max_prompt_tokens,
    reward_workers=0,
    plan=plan,
  )
  trainer = loop_lib.Trainer(cfg, task=task, show_progress=False)
  # What `run` does first: the engine gets θ.
  trainer.actor.sync(trainer.policy_params(), trainer.step_num)
  return trainer


def _per_sequence(advantages, mask):
  """The one value an outcome advantage has on a sequence's valid tokens."""
  advantages, mask = np.asarray(advantages), np.asarray(mask) > 0
  out = []
  for a, m in zip(advantages, mask):
    np.testing.assert_allclose(a[m], a[m][0], rtol=1e-6)
    np.testing.assert_array_equal(a[~m], 0.0)
    out.append(a[m][0])
  return np.array(out)


# ------------------------------------------------ DAPO overlong shaping


def test_dapo_preset_has_soft_overlong_punishment():
  # DAPO's four parts include overlong reward shaping.
  cfg = apply_preset("dapo", {"rollout.max_new_tokens": 10})
  assert cfg.advantage.overlong_shaping
  assert cfg.overlong_lengths() == (10, 2)  # L_max = budget, L_cache = 1/5
  # Punishment starts after L_max − L_cache = 8: (8 − |y|) / 2, −1 past 10.
  shaped = batch_lib.shaped_rewards(
    cfg, np.ones(5, np.float32), np.array([3, 8, 9, 10, 11])
  )
  np.testing.assert_allclose(shaped, [1.0, 1.0, 0.5, 0.0, 0.0])
  # Explicit sizes; other presets stay unshaped.
  cfg = apply_preset(
    "dapo",
    {
      "rollout.max_new_tokens": 10,
      "advantage.overlong_max_len": 12,
      "advantage.overlong_cache_len": 4,
    },
  )
  np.testing.assert_allclose(
    batch_lib.shaped_rewards(cfg, np.zeros(2, np.float32), np.array([9, 10])),
    [-0.25, -0.5],
  )
  grpo = apply_preset("grpo", {"rollout.max_new_tokens": 10})
  assert grpo.overlong_lengths() is None
  np.testing.assert_array_equal(
    batch_lib.shaped_rewards(grpo, np.ones(2, np.float32), np.array([9, 10])),
    [1.0, 1.0],
  )


def test_a_size_alone_turns_shaping_on():
  # Never silently unused: configs and run directories written before the
  # switch existed set the sizes only.
  assert apply_preset(
    "grpo",
    {"advantage.overlong_max_len": 100, "advantage.overlong_cache_len": 20},
  ).overlong_lengths() == (100, 20)
  assert apply_preset(
    "grpo", {"rollout.max_new_tokens": 50, "advantage.overlong_cache_len": 5}
  ).overlong_lengths() == (50, 5)
  with pytest.raises(ValueError, match="overlong_cache_len=64"):
    apply_preset(
      "dapo", {"rollout.max_new_tokens": 32, "advantage.overlong_cache_len": 64}
    )


def test_dapo_trainer_penalizes_a_too_long_response(tmp_path):
  # Overlong shaping through the trainer: the advantage the update step
  # gets is the task reward plus the kernel's penalty. advantage="reinforce"
  # (A = r) makes the shaped reward visible; everything else is DAPO's.
  cfg = _config("dapo", tmp_path, max_new_tokens=10, advantage="reinforce")
  trainer = _trainer(cfg)
  try:
    rb, valid, rewards, out = _collect_and_build(trainer)
  finally:
    trainer.close()
  lengths = rb.response_lengths
  # A random model over 49k tokens never stops early: every response is
  # cut at the budget, |y| = L_max = 10 → penalty (8 − 10) / 2 = −1.
  assert (lengths == 10).all()
  adv = _per_sequence(out["advantages"], out["loss_mask"])
  np.testing.assert_allclose(adv, rewards - 1.0, rtol=1e-6, atol=1e-6)


# ---------------------------------------------- dynamic-sampling refill loop


def _spy_build_batch(trainer):
  """What the step's batch is built from: the collected rollout."""
  seen = {}
  real = trainer.collector.collect

  def spy(step):
    out = real(step)
    seen.update(rb=out.batch, valid=out.valid, rewards=out.rewards)
    return out

  trainer.collector.collect = spy
  return seen


def test_refill_draws_until_the_batch_has_enough_informative_groups(tmp_path):
  # Round 0: group 0 informative, group 1 dull; round 1: both dull; round 2:
  # group 1 informative. The loop stops after round 2 with the two
  # informative groups, in the order they were found.
  cfg = _config("dapo", tmp_path, max_resample_rounds=3)
  trainer = _trainer(cfg, plan=[[True, False], [False, False], [False, True]])
  seen = _spy_build_batch(trainer)
  try:
    row = trainer.train_step()
    task = trainer.task
    prompt = task.prompt_ids
  finally:
    trainer.close()
  assert len(task.drawn) == 3 and task.calls == 3  # three rounds of 2 prompts
  assert row["dynamic_sampling_rounds"] == 3
  assert row["dynamic_sampling_kept_groups"] == 2
  assert row["dynamic_sampling_filtered_groups"] == 4  # 1 + 2 + 1 dull
  assert row["valid_fraction"] == 1.0
  assert seen["rb"].prompt_ids == [
    prompt(task.drawn[0][0]),
    prompt(task.drawn[2][1]),
  ]
  np.testing.assert_array_equal(seen["valid"], True)
  np.testing.assert_allclose(
    seen["rewards"], np.tile([0, 1 / 3, 2 / 3, 1], 2), rtol=1e-6
  )
  assert np.isfinite(row["loss"]) and row["applied"] == 1.0


def test_refill_stops_at_max_resample_rounds_and_masks_filler(tmp_path):
  # Never informative: 1 + max_resample_rounds draws, then the batch is
  # filled with dropped groups that the loss does not see.
  cfg = _config("dapo", tmp_path, max_resample_rounds=2)
  trainer = _trainer(cfg, plan=[[False, False]] * 3)
  seen = _spy_build_batch(trainer)
  try:
    row = trainer.train_step()
    task = trainer.task
  finally:
    trainer.close()
  assert len(task.drawn) == 3
  assert row["dynamic_sampling_rounds"] == 3
  assert row["dynamic_sampling_kept_groups"] == 0
  assert row["dynamic_sampling_filtered_groups"] == 6
  assert row["valid_fraction"] == 0.0
  np.testing.assert_array_equal(seen["valid"], False)
  assert np.isfinite(row["loss"])


def test_one_round_without_refills_keeps_the_filler_masked(tmp_path):
  cfg = _config("dapo", tmp_path, max_resample_rounds=0)
  trainer = _trainer(cfg, plan=[[False, True]])
  seen = _spy_build_batch(trainer)
  try:
    row = trainer.train_step()
    task = trainer.task
    prompt = task.prompt_ids
  finally:
    trainer.close()
  assert len(task.drawn) == 1 and row["dynamic_sampling_rounds"] == 1
  assert row["dynamic_sampling_kept_groups"] == 1
  assert row["dynamic_sampling_filtered_groups"] == 1
  # The informative group first, then the dull one as masked filler.
  assert seen["rb"].prompt_ids == [
    prompt(task.drawn[0][1]),
    prompt(task.drawn[0][0]),
  ]
  np.testing.assert_array_equal(seen["valid"], [True] * 4 + [False] * 4)
  assert row["valid_fraction"] == 0.5


# ------------------------------------------------ KL reward penalty: k3


def _logp(trainer, params, batch):
  return np.asarray(
    models.token_logprobs(
      trainer.model_config,
      params,
      batch["tokens"],
      attention_mask=batch["attention_mask"],
      temperature=trainer.cfg.rollout.temperature,
    )[0],
    np.float64,
  )


def _k3(logp, ref):
  d = ref - logp  # k3 = π_ref/π − log(π_ref/π) − 1 (Schulman 2020)
  return np.exp(d) - d - 1.0


def _other_reference(trainer):
  # At step 1 the reference is θ itself and every estimator is 0; a second
  # random model makes k1 and k3 differ.
  return models.init_params(trainer.model_config, jax.random.PRNGKey(7))


def test_kl_reward_penalty_uses_k3_for_outcome_rewards(tmp_path):
  # The KL reward penalty uses the configured estimator (k3 here), not
  # always k1. Outcome path: A = r − β Σ_t k3_t (advantage="reinforce"
  # shows it unbaselined).
  beta = 0.5
  cfg = _config(
    "grpo",
    tmp_path,
    advantage="reinforce",
    kl_coef=0.0,
    kl_in_reward_coef=beta,
    kl_estimator="k3",
  )
  trainer = _trainer(cfg)
  try:
    trainer.ref_params = _other_reference(trainer)
    rb, valid, rewards, out = _collect_and_build(trainer)
    logp = _logp(trainer, trainer.policy_params(), out)
    ref = _logp(trainer, trainer.ref_params, out)
  finally:
    trainer.close()
  mask = np.asarray(out["loss_mask"]) > 0
  k3 = np.where(mask, _k3(logp, ref), 0.0)
  # The models differ enough that k1 would give another answer.
  k1 = np.where(mask, logp - ref, 0.0)
  assert np.abs(beta * (k3 - k1).sum(axis=1)).max() > 1e-2
  expected = rewards - beta * k3.sum(axis=1)
  np.testing.assert_allclose(
    _per_sequence(out["advantages"], mask), expected, rtol=1e-4, atol=1e-4
  )


def test_kl_reward_penalty_uses_k3_per_token_with_a_critic(tmp_path):
  # PPO path: r_t = −β k3_t, plus the outcome reward on the last token. With
  # γ = λ = 1 the advantage is the reward-to-go minus the critic's value.
  beta = 0.5
  cfg = _config(
    "ppo",
    tmp_path,
    group_size=2,
    kl_in_reward_coef=beta,
    kl_estimator="k3",
    gamma=1.0,
    gae_lambda=1.0,
    critic_lambda=1.0,
  )
  trainer = _trainer(cfg)
  try:
    trainer.ref_params = _other_reference(trainer)
    rb, valid, rewards, out = _collect_and_build(trainer)
    logp = _logp(trainer, trainer.policy_params(), out)
    ref = _logp(trainer, trainer.ref_params, out)
  finally:
    trainer.close()
  mask = np.asarray(out["loss_mask"]) > 0
  assert mask.all(axis=0).sum() > 0 and (mask.sum(axis=1) > 0).all()
  k3 = np.where(mask, _k3(logp, ref), 0.0)
  assert np.abs(beta * (k3 - np.where(mask, logp - ref, 0.0))).max() > 1e-2
  token_r = -beta * k3
  last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
  token_r[np.arange(len(last)), last] += rewards
  to_go = np.cumsum(token_r[:, ::-1], axis=1)[:, ::-1]
  values = np.asarray(out["old_values"], np.float64)
  expected = np.where(mask, to_go - values, 0.0)
  np.testing.assert_allclose(
    np.asarray(out["advantages"]), expected, rtol=1e-4, atol=1e-4
  )
  np.testing.assert_allclose(
    np.asarray(out["returns"]), np.where(mask, to_go, 0.0), rtol=1e-4, atol=1e-4
  )


# ---------------------------------- REINFORCE++-baseline with filler groups


def test_reinforce_pp_baseline_whitens_over_valid_groups_only():
  # Filler groups are left out of the whitening, at the batch level. Group
  # 0 = [1, 0] is kept; group 1 = [3, 3] is dynamic-sampling filler. Over
  # the kept group: centred [.5, −.5], mean 0, std .5 → [1, −1]. Counting
  # the filler's zeros, the std would be √.125 and the advantages ±1.414.
  cfg = apply_preset(
    "reinforce_pp",
    {
      "advantage.estimator": "reinforce_pp_baseline",
      "rollout.group_size": 2,
      "rollout.prompts_per_step": 2,
      "kl.in_reward_coef": 0.0,
    },
  )
  adv = batch_lib.sequence_advantages(
    cfg,
    np.array([1.0, 0.0, 3.0, 3.0], np.float32),
    np.array([True, True, False, False]),
  )
  np.testing.assert_allclose(adv, [1.0, -1.0, 0.0, 0.0], rtol=1e-5)
  # Group 1 informative but masked: it must not move group 0's numbers.
  adv = batch_lib.sequence_advantages(
    cfg,
    np.array([1.0, 0.0, 9.0, -5.0], np.float32),
    np.array([True, True, False, False]),
  )
  np.testing.assert_allclose(adv, [1.0, -1.0, 0.0, 0.0], rtol=1e-5)


# -------------------------------------- UAQ fold → train → export → reload


def test_uaq_fold_train_export_reload_gives_the_trained_function(tmp_path):
  cfg = _config(
    "grpo", tmp_path, rollout_quant="int8", uaq_scale=1.5, learning_rate=1e-2
  )
  trainer = _trainer(cfg)
  try:
    assert trainer.uaq_scale == 1.5
    before = jax.tree.map(np.asarray, trainer.policy_params())
    row = trainer.train_step()
    assert row["applied"] == 1.0
    trained = jax.tree.map(np.asarray, trainer.policy_params())
    # From the run directory: the step's checkpoint, UAQ unfolded.
    export_lib.export_run(
      cfg.run.run_dir, str(tmp_path / "hf"), dtype="float32"
    )
    config = trainer.model_config
  finally:
    trainer.close()
  moved = max(
    float(np.abs(a - b).max())
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(trained))
  )
  assert moved > 1e-4  # the step changed θ
  loaded_config, loaded = models.load_hf(tmp_path / "hf")
  # The file holds the unfolded parametrisation of the trained θ ...
  unfolded = quant.unfold_uaq(config, trained, scale=1.5)
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6),
    loaded,
    unfolded,
  )
  # ... and computes the function that was trained.
  tokens = jax.random.randint(
    jax.random.PRNGKey(3), (2, 12), 0, config.vocab_size
  )
  want = models.forward(config, trained, tokens)
  got = models.forward(loaded_config, loaded, tokens)
  np.testing.assert_allclose(
    np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4
  )
  # The fold is not the identity here: the exported weights differ from θ.
  assert (
    max(
      float(np.abs(a - b).max())
      for a, b in zip(jax.tree.leaves(unfolded), jax.tree.leaves(trained))
    )
    > 1e-3
  )
