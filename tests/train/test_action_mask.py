"""Training on multi-turn trajectories: `RolloutBatch.action_mask`.

A trajectory is one response row, model turns and the environment's
observation tokens concatenated. Observation tokens are context, never
targets: the properties below draw random batches with random observation
spans, change everything a batch holds at observation positions (token ids,
behaviour / proximal / reference log-probs, critic values, the policy's own
log-probs and entropies) and check that no advantage, return, loss value or
gradient moves, for several estimators and corrections. Every property
fails when build_batch ignores the action mask (a changed behaviour
log-prob then changes a TIS weight, a changed token its KL, ...). The
hand-computed cases pin where turn rewards land and how GAE steps over
observations. build_batch runs on the host (NumPy around jitted kernels
that have their own chex variants), hence no jit variant here.
"""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax import models
from rljax.rollout.base import RolloutBatch
from rljax.train import build_batch as bb
from rljax.train import update as update_lib
from rljax.train.config import apply_preset

P, N, RESP = 2, 2, 10  # prompts, samples per prompt, response width
B = P * N
PROMPTS = [[5, 6, 7], [8, 9]]
VOCAB = models.tiny_config().vocab_size

# (preset, overrides): the estimators and corrections the properties cover.
CASES = {
  "grpo_tis": ("grpo", {"loss.correction": "tis"}),
  "grpo_acr": ("grpo", {"loss.correction": "acr"}),
  "grpo_mis": ("grpo", {"loss.correction": "mis"}),
  "gspo_seq_tis": (
    "gspo",
    {"loss.correction": "seq_tis", "loss.tis_cap": 20.0},
  ),
  "drgrpo_tis": ("drgrpo", {"loss.correction": "tis"}),
  "rloo_acr": ("rloo", {"loss.correction": "acr"}),
  "ppo_gae": ("ppo", {"advantage.gamma": 0.9, "kl.coef": 0.01}),
  # α = 0.5: λ = 1 − 2/|y| moves with these short lengths (0.05 clamps to 0).
  "vapo": ("vapo", {"advantage.gamma": 0.95, "advantage.vapo_alpha": 0.5}),
  "reinforce_pp": ("reinforce_pp", {"loss.correction": "tis"}),
  "reinforce_pp_baseline": (
    "reinforce_pp",
    {"advantage.estimator": "reinforce_pp_baseline", "kl.coef": 0.01},
  ),
}


def config(name, **more):
  preset, overrides = CASES[name]
  return apply_preset(
    preset,
    {"rollout.group_size": N, "rollout.max_new_tokens": RESP},
    overrides,
    more,
  )


def turn_ends(mask: np.ndarray) -> list[int]:
  """Indices of the last model token of each turn."""
  nxt = np.append(mask[1:], False)
  return np.flatnonzero(mask & ~nxt).tolist()


def rollout(masks, seed, turn_rewards=False, **fields):
  rng = np.random.default_rng(seed)
  responses = [rng.integers(3, VOCAB, len(m)).tolist() for m in masks]
  behav = [
    np.where(m, -rng.uniform(0.05, 3.0, len(m)), 0.0).astype(np.float32)
    for m in masks
  ]
  turns = None
  if turn_rewards:
    turns = [[(i, float(rng.normal())) for i in turn_ends(m)] for m in masks]
  kw = dict(
    prompt_ids=PROMPTS,
    response_ids=responses,
    behav_logp=behav,
    finish_reason=["stop"] * len(masks),
    n=N,
    action_mask=masks,
    turn_rewards=turns,
  )
  kw.update(fields)
  return RolloutBatch(**kw)


def at_observations(rb: RolloutBatch, seed: int) -> RolloutBatch:
  """`rb` with new token ids and behaviour log-probs on observation tokens."""
  rng = np.random.default_rng(seed)
  ids, behav = [], []
  for r, lp, m in zip(rb.response_ids, rb.behav_logp, rb.action_mask):
    ids.append(np.where(m, r, rng.integers(3, VOCAB, len(r))).tolist())
    behav.append(np.where(m, lp, -rng.uniform(0.0, 8.0, len(r))))
  return RolloutBatch(
    prompt_ids=rb.prompt_ids,
    response_ids=ids,
    behav_logp=[x.astype(np.float32) for x in behav],
    finish_reason=rb.finish_reason,
    n=rb.n,
    action_mask=rb.action_mask,
    turn_rewards=rb.turn_rewards,
  )


def model_inputs(shape, seed):
  rng = np.random.default_rng(seed)
  return {
    "prox_logp": -rng.uniform(0.05, 3.0, shape).astype(np.float32),
    "ref_logp": -rng.uniform(0.05, 3.0, shape).astype(np.float32),
    "values": rng.normal(size=shape).astype(np.float32),
    "logp": -rng.uniform(0.05, 3.0, shape).astype(np.float32),
    "entropy": rng.uniform(0.0, 2.0, shape).astype(np.float32),
  }


def observation_columns(packed) -> np.ndarray:
  return (packed["response_mask"] > 0) & (packed["action_mask"] == 0)


def build(cfg, packed, inputs, rewards):
  batch, metrics = bb.build_batch(
    cfg,
    packed,
    np.ones(B, bool),
    rewards,
    prox_logp=jnp.asarray(inputs["prox_logp"]),
    ref_logp=jnp.asarray(inputs["ref_logp"]) if cfg.uses_reference else None,
    values=jnp.asarray(inputs["values"]) if cfg.uses_critic else None,
  )
  return batch, metrics


def loss_spec(cfg) -> update_lib.UpdateSpec:
  return update_lib.UpdateSpec(
    model_config=None,
    loss=cfg.loss,
    kl_coef=cfg.kl.coef,
    kl_estimator=cfg.kl.estimator,
    entropy_coef=0.01,
  )


_LOSS_STEPS: dict = {}


def loss_and_grads(spec, outputs, batch):
  """(loss, d loss / d (logp, entropy)) of update.py's loss assembly (policy
  loss with its correction, KL and entropy terms, every denominator), the
  model's forward replaced by the given per-token log-probs and entropies:
  the gradient w.r.t. the log-softmax of the logits at each target."""

  def loss(outputs, batch):
    micro = update_lib._split_micro(batch, 1)
    denoms = update_lib._denominators(spec, micro)
    one = jax.tree.map(lambda x: x[0], micro)
    return update_lib.policy_loss_sum(spec, outputs, one, denoms)[0]

  with pytest.MonkeyPatch.context() as mp:  # traced once per spec
    mp.setattr(update_lib, "_policy_logp", lambda s, p, b: p)
    if spec not in _LOSS_STEPS:
      _LOSS_STEPS[spec] = jax.jit(jax.value_and_grad(loss))
    return _LOSS_STEPS[spec](outputs, batch)


def masks_strategy(min_len=1):
  row = st.integers(min_len, RESP).flatmap(
    lambda n: st.lists(st.booleans(), min_size=n, max_size=n)
  )
  return st.lists(row, min_size=B, max_size=B).map(
    lambda rows: [np.array(r, bool) for r in rows]
  )


def has_observations(masks) -> bool:
  return any((~m).any() for m in masks) and any(m.any() for m in masks)


PROPERTY = hypothesis.settings(
  max_examples=12,
  deadline=None,
  suppress_health_check=[hypothesis.HealthCheck.too_slow],
)


@pytest.mark.parametrize("case", sorted(CASES))
@PROPERTY
@hypothesis.given(
  masks=masks_strategy(), seed=st.integers(0, 2**16), turns=st.booleans()
)
def test_observation_tokens_change_no_advantage_loss_or_gradient(
  case, masks, seed, turns
):
  hypothesis.assume(has_observations(masks))
  cfg = config(case)
  rb = rollout(masks, seed, turn_rewards=turns)
  rewards = np.random.default_rng(seed + 1).normal(size=B).astype(np.float32)
  packed = bb.pack(rb, pad_id=0, response_len=RESP)
  obs = observation_columns(packed)
  inputs = model_inputs(obs.shape, seed + 2)
  # Everything at observation positions, drawn anew.
  packed2 = bb.pack(at_observations(rb, seed + 3), pad_id=0, response_len=RESP)
  fresh = model_inputs(obs.shape, seed + 4)
  inputs2 = {k: np.where(obs, fresh[k], x) for k, x in inputs.items()}

  batch, metrics = build(cfg, packed, inputs, rewards)
  batch2, metrics2 = build(cfg, packed2, inputs2, rewards)
  assert not np.asarray(batch["loss_mask"])[obs].any()
  for key in ("loss_mask", "advantages", "returns"):
    if key in batch:
      np.testing.assert_array_equal(batch[key], batch2[key], key)
      assert not np.asarray(batch[key])[obs].any(), key
  assert metrics == metrics2

  spec = loss_spec(cfg)
  outputs = (jnp.asarray(inputs["logp"]), jnp.asarray(inputs["entropy"]))
  outputs2 = (jnp.asarray(inputs2["logp"]), jnp.asarray(inputs2["entropy"]))
  loss, grads = loss_and_grads(spec, outputs, batch)
  loss2, grads2 = loss_and_grads(spec, outputs2, batch2)
  assert np.isfinite(loss)
  np.testing.assert_array_equal(loss, loss2)
  for g, g2 in zip(grads, grads2):
    np.testing.assert_array_equal(g, g2)
    assert not np.asarray(g)[obs].any()  # no gradient reaches a target


@pytest.mark.parametrize("case", ["ppo_gae", "vapo", "reinforce_pp"])
@PROPERTY
@hypothesis.given(
  masks=masks_strategy(), seed=st.integers(0, 2**16), turns=st.booleans()
)
def test_token_level_estimators_see_the_trajectory_without_observations(
  case, masks, seed, turns
):
  """GAE (γ, λ < 1, VAPO's length-adaptive λ) and REINFORCE++ on a
  trajectory equal the same estimators on the response with its
  observation tokens cut out (model tokens, values, log-probs and turn
  rewards kept, in order): observations are skipped, not stepped over."""
  hypothesis.assume(has_observations(masks))
  cfg = config(case)
  rb = rollout(masks, seed, turn_rewards=turns)
  rewards = np.random.default_rng(seed + 1).normal(size=B).astype(np.float32)
  packed = bb.pack(rb, pad_id=0, response_len=RESP)
  model_cols = (packed["response_mask"] > 0) & (packed["action_mask"] > 0)
  cut_turns = None
  if turns:  # a turn's reward index among the model tokens only
    cut_turns = [
      [(int(m[:i].sum()), r) for i, r in pairs]
      for m, pairs in zip(masks, rb.turn_rewards)
    ]
  cut = RolloutBatch(
    prompt_ids=PROMPTS,
    response_ids=[
      np.asarray(r)[m].tolist() for r, m in zip(rb.response_ids, masks)
    ],
    behav_logp=[lp[m] for lp, m in zip(rb.behav_logp, masks)],
    finish_reason=rb.finish_reason,
    n=N,
    turn_rewards=cut_turns,
  )
  packed_cut = bb.pack(cut, pad_id=0, response_len=RESP)
  cut_cols = packed_cut["response_mask"] > 0
  inputs = model_inputs(model_cols.shape, seed + 2)
  inputs_cut = {}
  for k, x in inputs.items():
    inputs_cut[k] = np.zeros_like(x)
    inputs_cut[k][cut_cols] = x[model_cols]  # row-major: same order per row
  batch, _ = build(cfg, packed, inputs, rewards)
  batch_cut, _ = build(cfg, packed_cut, inputs_cut, rewards)
  for key in ("advantages", "returns"):
    if key in batch:
      np.testing.assert_allclose(
        np.asarray(batch[key])[model_cols],
        np.asarray(batch_cut[key])[cut_cols],
        rtol=1e-6,
        atol=1e-7,
        err_msg=key,
      )


@pytest.mark.parametrize("case", ["grpo_acr", "ppo_gae", "reinforce_pp"])
def test_no_action_mask_and_all_ones_are_bit_identical(case):
  cfg = config(case)
  masks = [np.ones(k, bool) for k in (4, 7, 1, 10)]
  with_mask = rollout(masks, seed=3, turn_rewards=False)
  without = rollout(masks, seed=3, turn_rewards=False, action_mask=None)
  packed = bb.pack(without, pad_id=0, response_len=RESP)
  packed_ones = bb.pack(with_mask, pad_id=0, response_len=RESP)
  # A single-turn rollout packs exactly as before the trajectory fields.
  assert "action_mask" not in packed and "turn_rewards" not in packed
  assert set(packed_ones) == set(packed) | {"action_mask"}
  rewards = np.array([1.0, 0.0, 0.5, 2.0], np.float32)
  inputs = model_inputs(packed["response_mask"].shape, 9)
  batch, metrics = build(cfg, packed, inputs, rewards)
  batch_ones, metrics_ones = build(cfg, packed_ones, inputs, rewards)
  assert batch.keys() == batch_ones.keys()
  for key in batch:
    np.testing.assert_array_equal(batch[key], batch_ones[key], key)
  assert metrics == metrics_ones
  assert metrics["response_obs_tokens_mean"] == 0.0
  assert metrics["response_model_tokens_mean"] == 5.5


class TestUpdateStepOnATinyModel:
  """The jitted update step itself (real tiny decoder, SGD with lr 1 so
  that θ − θ' is the gradient) on trajectories."""

  @pytest.fixture(scope="class")
  def tiny(self):
    config = models.tiny_config()
    params = models.init_params(config, jax.random.PRNGKey(0))
    return config, params

  # Rows end with an observation span so that its token ids, which no model
  # token comes after, cannot even reach the loss as context.
  MASKS = [
    np.array([1, 1, 0, 0, 1, 1, 0, 0], bool),
    np.array([1, 0, 1, 1, 1, 0], bool),
    np.array([1, 1, 1, 0, 0, 0, 0, 1, 0, 0], bool),
    np.array([1, 1, 0, 1, 0], bool),
  ]

  def step(self, tiny, cfg, rb, inputs):
    model_config, params = tiny
    packed = bb.pack(rb, pad_id=0, response_len=RESP)
    rewards = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
    batch, _ = build(cfg, packed, inputs, rewards)
    spec = update_lib.UpdateSpec(
      model_config=model_config,
      loss=cfg.loss,
      kl_coef=cfg.kl.coef,
      kl_estimator=cfg.kl.estimator,
      entropy_coef=0.01,
      micro_batches=2,
      uses_critic=cfg.uses_critic,
      response_len=RESP,
    )
    opt = optax.sgd(1.0)
    critic = critic_opt = None
    if cfg.uses_critic:
      critic = models.init_critic(model_config, params, jax.random.PRNGKey(1))
      critic_opt = optax.sgd(1.0)
    state = update_lib.init_train_state(params, opt, critic, critic_opt)
    fn = update_lib.make_update_step(spec, opt, critic_opt, donate=False)
    new_state, metrics = fn(state, batch)
    return new_state, metrics

  @pytest.mark.parametrize("case", ["grpo_acr", "ppo_gae"])
  def test_loss_and_gradients_ignore_observations(self, tiny, case):
    cfg = config(case)
    rb = rollout(self.MASKS, seed=0)
    shape = bb.pack(rb, pad_id=0, response_len=RESP)["response_mask"].shape
    inputs = model_inputs(shape, 1)
    packed = bb.pack(rb, pad_id=0, response_len=RESP)
    obs = observation_columns(packed)
    fresh = model_inputs(shape, 2)
    inputs2 = {k: np.where(obs, fresh[k], x) for k, x in inputs.items()}
    # Token ids change in the trailing spans only (earlier observations are
    # context of later model tokens); log-probs and values everywhere.
    rb2 = at_observations(rb, 3)
    rb2.response_ids = [
      np.where(np.cumsum(m[::-1])[::-1] > 0, r, r2).tolist()
      for r, r2, m in zip(rb.response_ids, rb2.response_ids, self.MASKS)
    ]
    assert rb2.response_ids != rb.response_ids
    state, metrics = self.step(tiny, cfg, rb, inputs)
    state2, metrics2 = self.step(tiny, cfg, rb2, inputs2)
    assert float(metrics["applied"]) == 1.0
    for key in ("loss", "grad_norm", "value_loss", "entropy"):
      if key in metrics:
        np.testing.assert_array_equal(metrics[key], metrics2[key], key)
    leaves = jax.tree.leaves((state.params, state.critic_params))
    leaves2 = jax.tree.leaves((state2.params, state2.critic_params))
    for a, b in zip(leaves, leaves2):
      np.testing.assert_array_equal(a, b)
    # The control: one model token's behaviour log-prob moves the loss.
    rb3 = rollout(self.MASKS, seed=0)
    rb3.behav_logp[0] = rb3.behav_logp[0].copy()
    rb3.behav_logp[0][0] -= 1.5
    _, metrics3 = self.step(tiny, cfg, rb3, inputs)
    assert float(metrics3["loss"]) != float(metrics["loss"])

  def test_no_action_mask_trains_as_all_ones(self, tiny):
    cfg = config("grpo_acr")
    masks = [np.ones(k, bool) for k in (4, 7, 2, 10)]
    rb = rollout(masks, seed=0, action_mask=None)
    rb_ones = rollout(masks, seed=0)
    shape = bb.pack(rb, pad_id=0, response_len=RESP)["response_mask"].shape
    inputs = model_inputs(shape, 1)
    state, metrics = self.step(tiny, cfg, rb, inputs)
    state_ones, metrics_ones = self.step(tiny, cfg, rb_ones, inputs)
    for key in metrics:
      np.testing.assert_array_equal(metrics[key], metrics_ones[key], key)
    for a, b in zip(
      jax.tree.leaves(state.params), jax.tree.leaves(state_ones.params)
    ):
      np.testing.assert_array_equal(a, b)
