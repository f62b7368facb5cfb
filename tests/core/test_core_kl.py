"""Tests of rljax.core.kl: k1/k2/k3 estimators and their loss / reward uses."""

import functools
import math

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

from rljax.core import aggregation, kl

LOGP = jnp.array([0.0, math.log(0.5), -1.0])
REF = jnp.array([math.log(2.0), math.log(0.5), -3.0])


class K1Test(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    np.testing.assert_allclose(
      self.variant(kl.k1)(LOGP, REF),
      [-math.log(2.0), 0.0, 2.0],
      rtol=1e-6,
      atol=1e-7,
    )

  def test_unbiased_on_samples(self):
    # E_{x~p}[log p(x) − log q(x)] = KL(p‖q), checked on 200k samples.
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    q = np.array([0.1, 0.3, 0.2, 0.2, 0.2])
    exact = float(np.sum(p * np.log(p / q)))
    samples = jax.random.categorical(
      jax.random.PRNGKey(0), jnp.log(p), shape=(200_000,)
    )
    logp, ref = jnp.log(p)[samples], jnp.log(q)[samples]
    for estimator in (kl.k1, kl.k3):
      values = np.asarray(estimator(logp, ref), np.float64)
      stderr = values.std() / math.sqrt(values.size)
      self.assertLess(
        abs(values.mean() - exact), 4 * stderr + 1e-6, msg=estimator.__name__
      )
    # k2 is biased: its mean misses by far more than its standard error.
    k2 = np.asarray(kl.k2(logp, ref), np.float64)
    self.assertGreater(
      abs(k2.mean() - exact), 10 * k2.std() / math.sqrt(k2.size)
    )


class K2Test(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    np.testing.assert_allclose(
      self.variant(kl.k2)(LOGP, REF),
      [0.5 * math.log(2.0) ** 2, 0.0, 2.0],
      rtol=1e-6,
      atol=1e-7,
    )


class K3Test(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # x = ref − logp: e^x − x − 1.
    expected = [2.0 - math.log(2.0) - 1.0, 0.0, math.exp(-2.0) + 2.0 - 1.0]
    np.testing.assert_allclose(
      self.variant(kl.k3)(LOGP, REF), expected, rtol=1e-6
    )

  @hypothesis.given(logp=st.floats(-30, 0), diff=st.floats(-20, 20))
  @hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
  def test_nonnegative_and_zero_iff_equal(self, logp, diff):
    value = float(kl.k3(jnp.float32(logp), jnp.float32(logp + diff)))
    self.assertGreaterEqual(value, 0.0)
    self.assertEqual(float(kl.k3(jnp.float32(logp), jnp.float32(logp))), 0.0)
    if abs(diff) >= 1e-2:
      self.assertGreater(value, 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_extreme_inputs_finite_with_finite_grad(self):
    logp = jnp.array([0.0, -1e4, 1e4, -5.0])
    ref = jnp.array([-1e4, 0.0, -1e4, 1e4])
    fn = self.variant(kl.k3)
    value, grad = jax.value_and_grad(lambda x: fn(x, ref).sum())(logp)
    chex.assert_tree_all_finite((value, grad))

  @chex.variants(with_jit=True, without_jit=True)
  def test_gradient_is_one_minus_ref_over_pi_beyond_log_ratio_20(self):
    # ∂k3/∂logp = 1 − π_ref/π = 1 − e^x, x = ref − logp, also where |x| > 20:
    # a ±20 clamp on x would give 0 at logp = −1, ref = −30 (x = −29).
    logp = jnp.array([-1.0, -1.0, -30.0, -5.0, -2.0, -45.0])
    ref = jnp.array(
      [-30.0, -80.0, -5.0, -5.0, -1.0, -20.0]
    )  # x: −29 −79 25 0 1 25
    grad = jax.grad(lambda lp: self.variant(kl.k3)(lp, ref).sum())(logp)
    x = np.asarray(ref, np.float64) - np.asarray(logp, np.float64)
    np.testing.assert_allclose(grad, 1.0 - np.exp(x), rtol=1e-5, atol=1e-6)
    value = self.variant(kl.k3)(logp, ref)
    np.testing.assert_allclose(value, np.expm1(x) - x, rtol=1e-5, atol=1e-6)

  @hypothesis.given(logp=st.floats(-60, 0), x=st.floats(-60, 29.5))
  @hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
  def test_gradient_matches_closed_form(self, logp, x):
    lp, ref = np.float32(logp), np.float32(logp + x)
    grad = float(jax.grad(kl.k3)(jnp.float32(lp), jnp.float32(ref)))
    x32 = float(ref) - float(lp)
    np.testing.assert_allclose(grad, 1.0 - math.exp(x32), rtol=1e-4, atol=1e-5)

  def test_tangent_above_overflow_guard_keeps_gradient_finite_and_signed(self):
    k = kl.K3_MAX_LOG_RATIO
    logp = jnp.array([-(k + 10.0), -(k + 60.0)])
    value, grad = jax.value_and_grad(lambda lp: kl.k3(lp, jnp.zeros(2)).sum())(
      logp
    )
    chex.assert_tree_all_finite((value, grad))
    np.testing.assert_allclose(grad, [-math.expm1(k)] * 2, rtol=1e-5)

  def test_shape_mismatch(self):
    with pytest.raises(ValueError, match="ref_logp has shape"):
      kl.k3(jnp.zeros((2, 3)), jnp.zeros((3, 2)))
    with pytest.raises(ValueError, match="estimator='k4'"):
      kl.kl_estimate(LOGP, REF, "k4")


class KlLossTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_equals_aggregated_estimator_and_ref_is_constant(self):
    logp = jnp.array([[0.0, -1.0, -2.0], [-0.5, -0.5, 0.0]])
    ref = jnp.array([[-0.3, -1.0, jnp.nan], [-0.1, -0.9, 0.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1]], bool)
    fn = self.variant(
      functools.partial(
        kl.kl_loss, estimator="k3", aggregation_mode="seq-mean-token-mean"
      )
    )
    expected = aggregation.aggregate_mean(
      kl.k3(logp, jnp.where(mask, ref, 0.0)), mask, "seq-mean-token-mean"
    )
    self.assertAlmostEqual(
      float(fn(logp, ref, mask)), float(expected), places=6
    )
    g_logp, g_ref = jax.grad(fn, argnums=(0, 1))(logp, ref, mask)
    chex.assert_tree_all_finite(g_logp)
    self.assertGreater(float(jnp.abs(g_logp).sum()), 0.0)
    np.testing.assert_array_equal(g_ref, np.zeros((2, 3)))


class KlPenalizedRewardsTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_and_no_gradient(self):
    rewards = jnp.array([[0.0, 0.0, 1.0, 5.0]])
    logp = jnp.array([[-1.0, -2.0, -0.5, -1.0]])
    ref = jnp.array([[-1.5, -2.0, -1.0, 0.0]])
    mask = jnp.array([[1, 1, 1, 0]], bool)
    fn = self.variant(functools.partial(kl.kl_penalized_rewards, coef=0.1))
    out = fn(rewards, logp, ref, mask)
    np.testing.assert_allclose(
      out, [[-0.05, 0.0, 0.95, 0.0]], rtol=1e-6, atol=1e-7
    )
    grad = jax.grad(lambda x: fn(rewards, x, ref, mask).sum())(logp)
    np.testing.assert_array_equal(grad, np.zeros((1, 4)))

  def test_bad_inputs(self):
    with pytest.raises(ValueError, match="coef"):
      kl.kl_penalized_rewards(
        jnp.zeros((1, 2)),
        jnp.zeros((1, 2)),
        jnp.zeros((1, 2)),
        jnp.ones((1, 2)),
        coef=-1.0,
      )
    with pytest.raises(ValueError, match="mask has shape"):
      kl.kl_penalized_rewards(
        jnp.zeros((1, 2)),
        jnp.zeros((1, 2)),
        jnp.zeros((1, 2)),
        jnp.ones((1, 3)),
        coef=0.1,
      )


if __name__ == "__main__":
  absltest.main()
