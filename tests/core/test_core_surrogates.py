"""Tests of rljax.core.surrogates: PPO's clip (clip-higher, dual clip, ACR's
upper scale), CISPO and GSPO, by hand-computed values and gradients."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from rljax.core import importance, objectives, surrogates
from rljax.core.objectives import PolicyLossConfig
from tests.core.test_core_objectives import random_batch


class PpoClipObjectiveTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_value_and_grad(self):
    ratio = jnp.array([0.5, 1.0, 1.5, 1.5])
    adv = jnp.array([-1.0, 1.0, 1.0, -1.0])
    fn = self.variant(surrogates.ppo_clip_objective)
    # min(RA, clip(R)A): [min(-.5,-.8), 1, min(1.5,1.2), min(-1.5,-1.2)].
    np.testing.assert_allclose(
      fn(ratio, adv), [-0.8, 1.0, 1.2, -1.5], rtol=1e-6
    )
    grad = jax.grad(lambda r: fn(r, adv).sum())(ratio)
    np.testing.assert_allclose(grad, [0.0, 1.0, 0.0, -1.0])

  @chex.variants(with_jit=True, without_jit=True)
  def test_clip_higher_and_dual_clip(self):
    fn = self.variant(
      functools.partial(
        surrogates.ppo_clip_objective, eps_low=0.2, eps_high=0.28, dual_clip=3.0
      )
    )
    out = fn(
      jnp.array([1.25, 1.5, 4.0, 2.0]), jnp.array([1.0, 1.0, -1.0, -1.0])
    )
    # 1.25 < 1.28 passes; 1.5 clips to 1.28; R=4, A<0: max(-4, -3) = -3; R=2: -2.
    np.testing.assert_allclose(out, [1.25, 1.28, -3.0, -2.0], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_negative_advantage_keeps_its_gradient_beyond_log_ratio_20(self):
    # A < 0 and log R = 25: min picks R·A (unclipped), so ∂loss/∂logp =
    # −A·R = e^25 (loss = −objective, one token); a ±20 clamp on the
    # log-ratio would give 0 and silence the token. A > 0 at the same R is
    # clipped (0), and dual_clip bounds A < 0 (0 as well). log R = −25 with
    # A > 0: R·A, gradient −e^−25.
    logp = jnp.array([[0.0, 0.0, 0.0, 0.0]])
    prox = jnp.array([[-25.0, -25.0, 25.0, -40.0]])
    mask = jnp.ones((1, 4), bool)

    def grads(adv, **kw):
      config = PolicyLossConfig(
        correction="ignore_behavior", aggregation="seq-mean-token-sum", **kw
      )
      return np.asarray(
        jax.grad(
          self.variant(
            lambda lp: objectives.policy_loss(
              lp, prox, prox, jnp.asarray(adv), mask, config
            )[0]
          )
        )(logp)
      )[0]

    g = grads([[-1.0, 1.0, 1.0, -1.0]])
    np.testing.assert_allclose(g[0], math.exp(25.0), rtol=1e-4)
    self.assertEqual(g[1], 0.0)
    np.testing.assert_allclose(g[2], -math.exp(-25.0), rtol=1e-4)
    # log R = 40 > MAX_EXACT_LOG_RATIO: the tangent's slope e^30, not 0.
    np.testing.assert_allclose(
      g[3], math.exp(importance.MAX_EXACT_LOG_RATIO), rtol=1e-4
    )
    g = grads([[-1.0, 1.0, 1.0, -1.0]], dual_clip=3.0)
    self.assertEqual(g[0], 0.0)
    self.assertEqual(g[3], 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gspo_sequence_ratio_keeps_its_gradient_beyond_log_ratio_20(self):
    logp = jnp.zeros((1, 2))
    old = jnp.full((1, 2), -24.0)  # log s = 24
    adv = jnp.array([[-1.0, -1.0]])
    grad = jax.grad(
      self.variant(
        lambda lp: surrogates.gspo_objective(
          lp, old, adv, jnp.ones((1, 2), bool)
        ).sum()
      )
    )(logp)
    # objective = s·A on both tokens, ∂s/∂logp_t = s/2: ∂/∂logp_t = 2·(s/2)·A.
    np.testing.assert_allclose(grad, [[-math.exp(24.0)] * 2], rtol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_upper_scale_widens_only_upper_bound(self):
    fn = self.variant(surrogates.ppo_clip_objective)
    out = fn(
      jnp.array([1.5, 0.5]),
      jnp.array([1.0, -1.0]),
      upper_scale=jnp.array([2.0, 2.0]),
    )
    np.testing.assert_allclose(out, [1.5, -0.8], rtol=1e-6)


class CispoObjectiveTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_gradient_is_clipped_weight_times_advantage(self):
    logp = jnp.array([[-1.0, -2.0, -0.5, -1.5]])
    prox = logp - jnp.log(
      jnp.array([[0.5, 1.0, 1.5, 1.1]])
    )  # R = [.5, 1, 1.5, 1.1]
    adv = jnp.array([[2.0, -1.0, 1.0, -3.0]])
    mask = jnp.ones((1, 4), bool)
    config = PolicyLossConfig(surrogate="cispo", correction="ignore_behavior")
    loss = self.variant(
      lambda lp: objectives.policy_loss(lp, prox, prox, adv, mask, config)[0]
    )
    grad = jax.grad(loss)(logp)
    clipped = np.array([0.8, 1.0, 1.2, 1.1])
    np.testing.assert_allclose(
      grad[0], -clipped * np.array(adv[0]) / 4, rtol=1e-5
    )
    # Unlike PPO every token keeps a gradient, even the clipped ones.
    self.assertTrue(np.all(np.abs(grad) > 0))

  def test_clip_fraction_counts_either_side(self):
    logp = jnp.zeros((1, 4))
    prox = -jnp.log(jnp.array([[0.5, 1.0, 1.5, 1.1]]))
    adv = jnp.array([[2.0, -1.0, 1.0, -3.0]])
    config = PolicyLossConfig(surrogate="cispo", correction="ignore_behavior")
    _, metrics = objectives.policy_loss(
      logp, prox, prox, adv, jnp.ones((1, 4)), config
    )
    self.assertAlmostEqual(float(metrics["clip_fraction_low"]), 0.25)
    self.assertAlmostEqual(float(metrics["clip_fraction_high"]), 0.25)


class GspoTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_ratio_is_geometric_mean_of_token_ratios(self):
    logp, mask, _ = random_batch(3, batch=4, time=6)
    old = logp + jax.random.normal(jax.random.PRNGKey(1), logp.shape) * 0.3
    log_s = self.variant(surrogates.gspo_sequence_log_ratio)(logp, old, mask)
    ratios = np.exp(np.asarray(logp - old, np.float64))
    m = np.asarray(mask)
    for i in range(3):
      geo = np.prod(ratios[i][m[i]]) ** (1.0 / m[i].sum())
      np.testing.assert_allclose(np.exp(log_s[i]), geo, rtol=1e-5)
    self.assertEqual(float(log_s[3]), 0.0)  # empty sequence: ratio 1, no NaN

  @chex.variants(with_jit=True, without_jit=True)
  def test_sequence_clip_hand_computed(self):
    # Token ratios 2 and 0.5: s = 1 (geometric mean) → not clipped, though
    # token-level PPO would clip both tokens.
    logp = jnp.array([[math.log(2.0), math.log(0.5)]])
    old = jnp.zeros((1, 2))
    adv = jnp.array([[1.0, 1.0]])
    out = self.variant(surrogates.gspo_objective)(
      logp, old, adv, jnp.ones((1, 2), bool)
    )
    np.testing.assert_allclose(out, [[1.0, 1.0]], rtol=1e-6)

  def test_token_form_equals_sequence_form_in_value(self):
    logp, mask, _ = random_batch(4)
    old = logp - 0.1
    adv = jnp.ones(logp.shape)
    seq = surrogates.gspo_objective(logp, old, adv, mask)
    tok = surrogates.gspo_objective(logp, old, adv, mask, token_level=True)
    np.testing.assert_allclose(seq, tok, rtol=1e-6)


if __name__ == "__main__":
  absltest.main()
