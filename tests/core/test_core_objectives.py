"""Tests of rljax.core.objectives: the policy loss and its config, every
surrogate under every correction and aggregation."""

import dataclasses
import functools
import itertools
import math

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from rljax.core import aggregation, objectives
from rljax.core.objectives import PolicyLossConfig

SETTINGS = hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
MIN_FORM = ("ppo", "gspo", "gspo_token")


def all_configs(**overrides):
  for surrogate, correction in itertools.product(
    objectives.SURROGATES, objectives.CORRECTIONS
  ):
    yield PolicyLossConfig(
      surrogate=surrogate, correction=correction, **overrides
    )
    if surrogate in MIN_FORM and correction == "acr":
      yield PolicyLossConfig(
        surrogate=surrogate, correction=correction, dual_clip=3.0, **overrides
      )


def random_batch(seed, batch=3, time=5, empty_row=True):
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1.0, 0.5, (batch, time)).astype(np.float32)
  mask = rng.random((batch, time)) < 0.8
  mask[:, 0] = True
  if empty_row:
    mask[-1] = False
  adv = rng.normal(0.0, 1.0, (batch,)).astype(np.float32)
  return jnp.asarray(logp), jnp.asarray(mask), jnp.asarray(adv)


@functools.lru_cache(maxsize=None)
def jitted_value_and_grad(config):
  """Compiled once per config (and shape): later calls run at jit speed."""
  return jax.jit(
    jax.value_and_grad(
      lambda lp, prox, behav, adv, mask: objectives.policy_loss(
        lp, prox, behav, adv, mask, config
      )[0]
    )
  )


def loss_metrics_grad(config):
  """Eager: one call per config is cheaper than compiling (~10x here)."""
  return jax.value_and_grad(
    lambda lp, prox, behav, adv, mask: objectives.policy_loss(
      lp, prox, behav, adv, mask, config
    ),
    has_aux=True,
  )


@functools.lru_cache(maxsize=None)
def jitted_per_token(config):
  return jax.jit(
    lambda *args: objectives.policy_loss_per_token(*args, config)[0]
  )


class PolicyLossConfigTest(parameterized.TestCase):
  def test_defaults_and_hashable_static_arg(self):
    config = PolicyLossConfig()
    self.assertEqual((config.surrogate, config.correction), ("ppo", "acr"))
    self.assertEqual(hash(config), hash(PolicyLossConfig(eps_low=0.2)))
    self.assertEqual(PolicyLossConfig(eps_low=1), PolicyLossConfig(eps_low=1.0))
    fn = jax.jit(objectives.policy_loss, static_argnames="config")
    logp, mask, adv = random_batch(0)
    loss, _ = fn(logp, logp, logp, adv, mask, config=config)
    self.assertTrue(np.isfinite(loss))

  @parameterized.parameters(
    (dict(surrogate="trpo"), ValueError, "surrogate='trpo'.*'ppo'"),
    (dict(correction="is"), ValueError, "correction='is'.*'acr'"),
    (dict(aggregation="mean"), ValueError, "aggregation='mean'.*'token-mean'"),
    (dict(eps_low=-0.1), ValueError, "eps_low"),
    (dict(eps_high=float("nan")), ValueError, "eps_high"),
    (dict(eps_high="0.2"), TypeError, "eps_high"),
    (dict(tis_cap=0.5), ValueError, "tis_cap.*0.5"),
    (dict(dual_clip=1.0), ValueError, "dual_clip"),
    (dict(surrogate="cispo", dual_clip=3.0), ValueError, "dual_clip.*cispo"),
    (
      dict(surrogate="reinforce", dual_clip=3.0),
      ValueError,
      "dual_clip.*reinforce",
    ),
    (dict(norm_const=0.0), ValueError, "norm_const"),
  )
  def test_bad_values_name_the_field(self, kwargs, error, match):
    with pytest.raises(error, match=match):
      PolicyLossConfig(**kwargs)

  def test_frozen(self):
    with pytest.raises(Exception):
      PolicyLossConfig().eps_low = 0.3


class PolicyLossTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_ppo_hand_computed_loss_metrics_grad(self):
    logp = jnp.log(jnp.array([[0.5, 1.0, 1.5, 1.5, 7.0]]))  # prox = 0 → R = p
    prox = jnp.zeros((1, 5))
    adv = jnp.array([[-1.0, 1.0, 1.0, -1.0, 9.0]])
    mask = jnp.array([[1, 1, 1, 1, 0]], bool)
    config = PolicyLossConfig(correction="ignore_behavior")
    fn = self.variant(
      lambda lp: objectives.policy_loss(lp, prox, prox, adv, mask, config)
    )
    loss, metrics = fn(logp)
    self.assertAlmostEqual(float(loss), -(-0.8 + 1.0 + 1.2 - 1.5) / 4, places=6)
    self.assertAlmostEqual(float(metrics["clip_fraction_low"]), 0.25)
    self.assertAlmostEqual(float(metrics["clip_fraction_high"]), 0.25)
    self.assertAlmostEqual(float(metrics["clip_fraction"]), 0.5)
    self.assertAlmostEqual(
      float(metrics["ratio_mean"]), (0.5 + 1 + 1.5 + 1.5) / 4, places=6
    )
    grad = jax.grad(lambda lp: fn(lp)[0])(logp)
    # ∂/∂logp of −R·A/4 = −R·A/4 on unclipped tokens, 0 on clipped/padding.
    np.testing.assert_allclose(
      grad[0], [0.0, -0.25, 0.0, 0.375, 0.0], atol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_behaviour_metrics_hand_computed(self):
    prox = jnp.log(jnp.array([[0.2, 0.3, 0.6, 0.9]]))
    behav = jnp.log(jnp.array([[0.4, 0.1, 0.2, 0.9]]))  # ρ = [.5, 3, 3, 1]
    mask = jnp.array([[1, 1, 0, 1]], bool)  # the 3rd token is padding
    config = PolicyLossConfig(correction="mis", tis_cap=2.0)
    _, metrics = self.variant(
      lambda lp: objectives.policy_loss(
        lp, prox, behav, jnp.ones((1,)), mask, config
      )
    )(prox)
    rho_valid = np.array([0.5, 3.0, 1.0])
    # KL(π_behav‖π_prox) by k3 = ρ − log ρ − 1 ≥ 0 (the plotted curve); its
    # k1 mean is negative here (−0.135) and is kept under its own name.
    k3 = np.mean(rho_valid - np.log(rho_valid) - 1.0)
    self.assertAlmostEqual(float(metrics["behav_prox_kl"]), k3, places=5)
    self.assertGreater(float(metrics["behav_prox_kl"]), 0.0)
    k1 = np.mean(np.log([0.4, 0.1, 0.9]) - np.log([0.2, 0.3, 0.9]))
    self.assertLess(k1, 0.0)
    self.assertAlmostEqual(
      float(metrics["behav_prox_log_ratio_mean"]), k1, places=5
    )
    self.assertAlmostEqual(
      float(metrics["max_prox_behav_ratio"]), rho_valid.max(), places=4
    )
    self.assertAlmostEqual(
      float(metrics["tis_truncated_fraction"]), 1 / 3, places=6
    )
    self.assertAlmostEqual(
      float(metrics["mis_masked_fraction"]), 1 / 3, places=6
    )
    self.assertAlmostEqual(
      float(metrics["weight_mean"]), (0.5 + 1.0) / 2, places=5
    )
    self.assertAlmostEqual(float(metrics["ratio_mean"]), 1.0, places=6)

  def test_entropy_metric(self):
    logits = jnp.zeros((1, 2, 4)).at[0, 1, 3].set(-jnp.inf)
    logp = jnp.zeros((1, 2))
    _, metrics = objectives.policy_loss(
      logp,
      logp,
      logp,
      jnp.ones((1,)),
      jnp.ones((1, 2)),
      PolicyLossConfig(),
      logits=logits,
    )
    self.assertAlmostEqual(
      float(metrics["entropy"]), (math.log(4) + math.log(3)) / 2, places=5
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_naive_ratio_uses_behaviour(self):
    zeros = jnp.zeros((1, 1))
    behav = jnp.log(
      jnp.full((1, 1), 0.5)
    )  # R̂ = exp(0 − ln .5) = 2 → clipped to 1.2
    adv = jnp.ones((1,))
    mask = jnp.ones((1, 1), bool)
    naive = self.variant(
      lambda b: objectives.policy_loss(
        zeros, zeros, b, adv, mask, PolicyLossConfig(correction="naive")
      )[0]
    )
    ignore = self.variant(
      lambda b: objectives.policy_loss(
        zeros,
        zeros,
        b,
        adv,
        mask,
        PolicyLossConfig(correction="ignore_behavior"),
      )[0]
    )
    self.assertAlmostEqual(float(naive(behav)), -1.2, places=6)
    self.assertAlmostEqual(float(ignore(behav)), -1.0, places=6)

  def test_acr_widens_upper_bound_where_rho_exceeds_cap(self):
    # ρ = 4 > C = 2 (r = 1/2), R = 1.5, A = 1: tis clips R at 1.2, acr at 2.4.
    logp = jnp.log(jnp.full((1, 1), 1.5))
    zeros = jnp.zeros((1, 1))
    behav = jnp.log(jnp.full((1, 1), 0.25))
    args = (logp, zeros, behav, jnp.ones((1,)), jnp.ones((1, 1), bool))
    tis, _ = objectives.policy_loss(*args, PolicyLossConfig(correction="tis"))
    acr, _ = objectives.policy_loss(*args, PolicyLossConfig(correction="acr"))
    self.assertAlmostEqual(float(tis), -2.0 * 1.2, places=5)
    self.assertAlmostEqual(float(acr), -2.0 * 1.5, places=5)

  def test_mis_drops_token_from_numerator_and_denominator(self):
    logp = jnp.zeros((1, 2))
    prox = jnp.zeros((1, 2))
    behav = jnp.log(jnp.array([[1.0, 0.1]]))  # ρ = [1, 10]
    config = PolicyLossConfig(
      surrogate="reinforce", correction="mis", tis_cap=2.0
    )
    loss, _ = objectives.policy_loss(
      logp - jnp.array([[1.0, 5.0]]),
      prox,
      behav,
      jnp.ones((1,)),
      jnp.ones((1, 2), bool),
      config,
    )
    # Only token 0 remains: −A·logp / 1 = 1.
    self.assertAlmostEqual(float(loss), 1.0, places=6)

  def test_sequence_and_token_advantages_agree(self):
    logp, mask, adv = random_batch(5)
    prox = logp + 0.1
    for config in all_configs():
      a, _ = objectives.policy_loss(logp, prox, prox - 0.2, adv, mask, config)
      (b, _), _ = loss_metrics_grad(config)(
        logp, prox, prox - 0.2, jnp.broadcast_to(adv[:, None], logp.shape), mask
      )
      np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=str(config))

  @parameterized.parameters(*objectives.SURROGATES)
  def test_on_policy_gradient_equals_reinforce(self, surrogate):
    """current = proximal = behaviour: every surrogate/correction is A·∇logp."""
    logp, mask, adv = random_batch(6, batch=4, time=6)
    token_adv = adv[:, None] + jax.random.normal(
      jax.random.PRNGKey(2), logp.shape
    )
    advs = (
      [adv] if surrogate == "gspo" else [adv, token_adv]
    )  # GSPO: one A per sequence
    for mode, a in itertools.product(aggregation.AGGREGATION_MODES, advs):
      reference = PolicyLossConfig(
        surrogate="reinforce", correction="ignore_behavior", aggregation=mode
      )
      expected = jax.grad(
        lambda lp: objectives.policy_loss(lp, logp, logp, a, mask, reference)[0]
      )(logp)
      self.assertGreater(float(jnp.abs(expected).sum()), 0.1)
      for config in all_configs(aggregation=mode):
        # Aggregation acts after the per-token loss: every correction is
        # checked under two modes, the other modes with acr (QuRL's) only.
        if config.surrogate != surrogate or (
          mode not in ("token-mean", "seq-mean-token-mean")
          and config.correction != "acr"
        ):
          continue
        grad = jax.grad(
          lambda lp, c=config: objectives.policy_loss(
            lp, logp, logp, a, mask, c
          )[0]
        )(logp)
        np.testing.assert_allclose(
          grad, expected, rtol=1e-5, atol=1e-7, err_msg=str(config)
        )

  @hypothesis.given(
    seed=st.integers(0, 2**31 - 1), eps_high=st.sampled_from([0.2, 0.28])
  )
  @SETTINGS
  def test_acr_equals_tis_where_rho_below_cap(self, seed, eps_high):
    rng = np.random.default_rng(seed)
    shape = (3, 6)
    logp = jnp.asarray(rng.normal(-1, 0.5, shape), jnp.float32)
    prox = logp + jnp.asarray(rng.normal(0, 0.3, shape), jnp.float32)
    behav = prox + jnp.asarray(rng.normal(0, 1.0, shape), jnp.float32)
    adv = jnp.asarray(rng.normal(0, 1, shape), jnp.float32)
    mask = jnp.ones(shape, bool)
    for surrogate in ("ppo", "cispo", "gspo_token"):
      kw = dict(surrogate=surrogate, eps_high=eps_high, tis_cap=2.0)
      tis = jitted_per_token(PolicyLossConfig(correction="tis", **kw))(
        logp, prox, behav, adv, mask
      )
      acr = jitted_per_token(PolicyLossConfig(correction="acr", **kw))(
        logp, prox, behav, adv, mask
      )
      rho = np.exp(np.asarray(prox - behav))
      below = rho <= 2.0
      np.testing.assert_allclose(
        np.asarray(acr)[below], np.asarray(tis)[below], rtol=1e-6
      )
      if surrogate != "cispo":
        # Above C only the upper bound widens: acr's min-form objective ≥ tis's.
        self.assertTrue(np.all(np.asarray(acr) <= np.asarray(tis) + 1e-6))
    iw = objectives.importance_weights(prox, behav, mask, "acr", 2.0)
    upper = (1 + eps_high) * np.asarray(iw.upper_scale)
    self.assertTrue(np.all(upper >= 1 + eps_high))

  @hypothesis.given(seed=st.integers(0, 2**31 - 1))
  @SETTINGS
  def test_decoupled_with_unit_rho_is_ppo_and_tis_without_cap_is_decoupled(
    self, seed
  ):
    rng = np.random.default_rng(seed)
    shape = (3, 5)
    logp = jnp.asarray(rng.normal(-1, 0.5, shape), jnp.float32)
    prox = logp + jnp.asarray(rng.normal(0, 0.3, shape), jnp.float32)
    behav = prox + jnp.asarray(rng.normal(0, 2.0, shape), jnp.float32)
    adv = jnp.asarray(rng.normal(0, 1, (3,)), jnp.float32)
    mask = jnp.asarray(rng.random(shape) < 0.8)
    for surrogate in objectives.SURROGATES:
      cfg = functools.partial(PolicyLossConfig, surrogate=surrogate)
      loss_and_grad = lambda c, b: jitted_value_and_grad(c)(
        logp, prox, b, adv, mask
      )
      dec = loss_and_grad(cfg(correction="decoupled"), prox)
      ppo = loss_and_grad(cfg(correction="ignore_behavior"), prox)
      chex.assert_trees_all_close(dec, ppo, rtol=1e-6)
      dec = loss_and_grad(cfg(correction="decoupled"), behav)
      tis = loss_and_grad(cfg(correction="tis", tis_cap=float("inf")), behav)
      chex.assert_trees_all_close(dec, tis, rtol=1e-6)

  def test_correction_weights_carry_no_gradient(self):
    logp, mask, _ = random_batch(7)
    adv = jnp.array(
      [1.0, -1.0, 0.5]
    )  # both signs, ratios inside the clip range
    prox = logp + 0.05
    behav = logp - 0.9
    for config in all_configs():
      grads = jax.grad(
        lambda p, b, c=config: objectives.policy_loss(logp, p, b, adv, mask, c)[
          0
        ],
        argnums=(0, 1),
      )(prox, behav)
      for g in grads:
        np.testing.assert_array_equal(g, np.zeros_like(g), err_msg=str(config))

  def test_extreme_log_ratios_give_finite_loss_and_grad(self):
    big = 1e4
    logp = jnp.array(
      [
        [0.0, -big, -1.0, -2.0, 0.0],
        [-3.0, 0.0, -big, -0.5, -1.0],
        [-1.0, -1.0, -1.0, -1.0, -big],
      ]
    )
    prox = logp + jnp.array(
      [
        [big, -big, 0.0, big, 0.0],
        [-big, big, 5.0, 0.0, big],
        [0.0, big, -big, 1.0, big],
      ]
    )
    behav = prox + jnp.array(
      [
        [-big, big, big, 0.0, -big],
        [big, -big, -big, 3.0, 0.0],
        [big, 0.0, 0.0, -big, -big],
      ]
    )
    adv = jnp.array([1.0, -1.0, 2.0])
    mask = jnp.ones(logp.shape, bool)
    for config in all_configs():
      (loss, metrics), grad = loss_metrics_grad(config)(
        logp, prox, behav, adv, mask
      )
      chex.assert_tree_all_finite((loss, metrics, grad))

  def test_empty_mask_and_zero_advantages(self):
    logp, mask, adv = random_batch(8)
    cases = [(jnp.zeros_like(mask), adv), (mask, jnp.zeros_like(adv))]
    for (m, a), config in itertools.product(cases, all_configs()):
      (loss, metrics), grad = loss_metrics_grad(config)(
        logp, logp + 0.2, logp - 0.4, a, m
      )
      self.assertEqual(float(loss), 0.0, msg=str(config))
      chex.assert_tree_all_finite((metrics, grad))
      np.testing.assert_array_equal(
        grad, np.zeros_like(grad), err_msg=str(config)
      )

  def test_padding_garbage_does_not_leak(self):
    logp, mask, adv = random_batch(9)
    garbage = jnp.where(mask, logp, jnp.nan)
    prox = logp + 0.1
    behav = jnp.where(mask, logp - 0.2, -jnp.inf)
    for config in all_configs():
      fn = loss_metrics_grad(config)
      (clean, _), clean_grad = fn(logp, prox, behav, adv, mask)
      (dirty, _), dirty_grad = fn(garbage, prox, behav, adv, mask)
      np.testing.assert_allclose(dirty, clean, rtol=1e-6, err_msg=str(config))
      np.testing.assert_allclose(
        dirty_grad, clean_grad, rtol=1e-6, err_msg=str(config)
      )

  @hypothesis.given(seed=st.integers(0, 2**31 - 1), split=st.integers(1, 4))
  @hypothesis.settings(SETTINGS, max_examples=8)
  def test_micro_batches_accumulate_exactly(self, seed, split):
    logp, mask, adv = random_batch(seed, batch=5, time=4, empty_row=False)
    prox, behav = logp + 0.2, logp - 0.5
    for mode in aggregation.AGGREGATION_MODES:
      config = PolicyLossConfig(aggregation=mode, correction="mis", tis_cap=1.5)
      full, _ = objectives.policy_loss(logp, prox, behav, adv, mask, config)
      parts = [
        objectives.policy_loss_terms(
          logp[s], prox[s], behav[s], adv[s], mask[s], config
        )[:2]
        for s in (slice(0, split), slice(split, None))
      ]
      total = aggregation.finalize(
        sum(p[0] for p in parts), sum(p[1] for p in parts)
      )
      np.testing.assert_allclose(
        total, full, rtol=1e-5, atol=1e-7, err_msg=mode
      )

  def test_denominator_before_forward_equals_the_kernels(self):
    logp, mask, adv = random_batch(11, batch=4, time=6)
    prox, behav = logp + 0.3, logp - 0.6 * jnp.arange(6.0)
    for mode in aggregation.AGGREGATION_MODES:
      for config in all_configs(aggregation=mode, tis_cap=1.5):
        for veto in (None, 0.5):
          config = dataclasses.replace(config, veto_threshold=veto)
          _, denominator, _ = objectives.policy_loss_terms(
            logp, prox, behav, adv, mask, config
          )
          np.testing.assert_allclose(
            objectives.policy_loss_denominator(prox, behav, mask, config),
            denominator,
            err_msg=str(config),
          )

  @parameterized.named_parameters(
    ("mask_shape", dict(mask=jnp.ones((2, 3))), ValueError, "mask has shape"),
    (
      "adv_shape",
      dict(advantages=jnp.ones((3,))),
      ValueError,
      "advantages has shape",
    ),
    (
      "adv_rank",
      dict(advantages=jnp.ones((2, 4, 1))),
      ValueError,
      "advantages must have rank",
    ),
    (
      "int_logp",
      dict(logp=jnp.ones((2, 4), jnp.int32)),
      TypeError,
      "logp must be a floating",
    ),
    ("rank", dict(logp=jnp.ones((8,))), ValueError, "logp must have rank 2"),
    (
      "config",
      dict(config="ppo"),
      TypeError,
      "config must be a PolicyLossConfig",
    ),
  )
  def test_bad_inputs(self, override, error, match):
    args = dict(
      logp=jnp.zeros((2, 4)),
      prox_logp=jnp.zeros((2, 4)),
      behav_logp=jnp.zeros((2, 4)),
      advantages=jnp.ones((2,)),
      mask=jnp.ones((2, 4), bool),
      config=PolicyLossConfig(),
    )
    args.update(override)
    with pytest.raises(error, match=match):
      objectives.policy_loss(**args)


if __name__ == "__main__":
  absltest.main()
