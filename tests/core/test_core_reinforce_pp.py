"""REINFORCE++ as Hu et al. 2025 define it: the KL penalty as reward-to-go
(Eq. 8, `kl_penalized_returns`) and whitening over every valid token of the
batch (Eq. 10, `reinforce_pp` on token returns; `reinforce_pp_baseline` with
a token mask). Every expected value is worked by hand in the comments.

The two mistakes these tests rule out: adding the penalty summed over the
whole response to every token (row 0 below: 0.7 on all three tokens) and
whitening one number per sequence (the baseline example: ±1.414 and 0
instead of 1.134, −1.890, −0.378).
"""

import functools

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core import advantages

# Two responses: 3 tokens and 2 tokens (+ one padding column).
KL = jnp.array([[0.1, 0.2, 0.3], [0.4, 0.5, 7.0]])
MASK = jnp.array([[1, 1, 1], [1, 1, 0]], bool)
REWARDS = jnp.array([1.0, 0.0])
BETA = 0.5


class KlPenalizedReturnsTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    out = self.variant(advantages.kl_penalized_returns)(REWARDS, KL, MASK, BETA)
    # Row 0: KL to go [.6, .5, .3] → 1 − .5·[.6, .5, .3] = [.7, .75, .85].
    # Row 1: KL to go [.9, .5] → 0 − .5·[.9, .5] = [−.45, −.25]; padding 0
    # (its 7.0 never enters a sum).
    np.testing.assert_allclose(
      out, [[0.7, 0.75, 0.85], [-0.45, -0.25, 0.0]], rtol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_no_penalty_is_the_outcome_on_every_token(self):
    out = self.variant(advantages.kl_penalized_returns)(REWARDS, KL, MASK, 0.0)
    np.testing.assert_array_equal(out, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_masked_token_inside_a_response_is_skipped(self):
    # A masked column in the middle (tool output): its KL is not charged.
    mask = jnp.array([[1, 0, 1], [1, 1, 0]], bool)
    out = self.variant(advantages.kl_penalized_returns)(REWARDS, KL, mask, BETA)
    # Row 0: KL to go at t=0: .1 + .3 = .4 → .8; t=2: .3 → .85.
    np.testing.assert_allclose(out[0], [0.8, 0.0, 0.85], rtol=1e-6)

  def test_no_gradient(self):
    import jax

    g = jax.grad(
      lambda k: advantages.kl_penalized_returns(REWARDS, k, MASK, BETA).sum()
    )(KL)
    np.testing.assert_array_equal(g, np.zeros_like(KL))

  def test_bad_inputs(self):
    with pytest.raises(ValueError, match="one entry per row"):
      advantages.kl_penalized_returns(jnp.zeros(3), KL, MASK, BETA)
    with pytest.raises(ValueError, match="kl_coef"):
      advantages.kl_penalized_returns(REWARDS, KL, MASK, -1.0)
    with pytest.raises(ValueError, match="mask has shape"):
      advantages.kl_penalized_returns(REWARDS, KL, MASK[:, :2], BETA)


class ReinforcePPTokenWhiteningTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_eq10_over_the_tokens_of_eq8(self):
    returns = advantages.kl_penalized_returns(REWARDS, KL, MASK, BETA)
    out = self.variant(functools.partial(advantages.reinforce_pp, eps=0.0))(
      returns, MASK
    )
    # Tokens [.7, .75, .85, −.45, −.25]: mean 1.6/5 = .32; deviations
    # [.38, .43, .53, −.77, −.57], squares sum 1.528, population var .3056.
    std = np.sqrt(0.3056)
    np.testing.assert_allclose(
      out,
      np.array([[0.38, 0.43, 0.53], [-0.77, -0.57, 0.0]]) / std,
      rtol=1e-5,
      atol=1e-6,
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_long_responses_weigh_by_their_tokens(self):
    # Outcome only: tokens [1, 1, 1, 0, 0] → mean .6, var .24, so the
    # 3-token response gets .4/√.24 = .816 and the 2-token one −1.225.
    # Whitened per sequence ([1, 0]) both would be ±1.
    returns = advantages.kl_penalized_returns(REWARDS, KL, MASK, 0.0)
    out = self.variant(functools.partial(advantages.reinforce_pp, eps=0.0))(
      returns, MASK
    )
    s = np.sqrt(0.24)
    np.testing.assert_allclose(
      out, [[0.4 / s] * 3, [-0.6 / s, -0.6 / s, 0.0]], rtol=1e-5
    )


class ReinforcePPBaselineTokenTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    fn = self.variant(
      functools.partial(advantages.reinforce_pp_baseline, group_size=2, eps=0.0)
    )
    # Responses of 3, 1, 2, 2 tokens out of 3 columns.
    mask = jnp.array([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]], bool)
    out = fn(jnp.array([1.0, 0.0, 3.0, 3.0]), mask=mask)
    # Centred [.5, −.5, 0, 0] on 3 + 1 + 2 + 2 = 8 tokens: mean 1/8 = .125;
    # deviations .375 (×3), −.625, −.125 (×4); squares .421875 + .390625 +
    # .0625 = .875, var .109375.
    s = np.sqrt(0.109375)
    a, b, c = 0.375 / s, -0.625 / s, -0.125 / s
    np.testing.assert_allclose(
      out,
      [[a, a, a], [b, 0, 0], [c, c, 0], [c, c, 0]],
      rtol=1e-5,
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_equals_reinforce_pp_of_centred_returns_without_kl(self):
    rewards = jnp.array([1.0, 0.0, 2.0, 5.0])
    mask = jnp.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], bool)
    out = self.variant(
      functools.partial(advantages.reinforce_pp_baseline, group_size=2)
    )(rewards, mask=mask)
    returns = advantages.kl_penalized_returns(
      advantages.drgrpo(rewards, 2), jnp.zeros(mask.shape), mask, 0.0
    )
    np.testing.assert_allclose(
      out, advantages.reinforce_pp(returns, mask), rtol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_filler_groups_stay_out_with_a_token_mask(self):
    mask = jnp.ones((4, 2), bool)
    valid = jnp.array([True, True, False, False])
    out = self.variant(
      functools.partial(advantages.reinforce_pp_baseline, group_size=2)
    )(jnp.array([1.0, 0.0, 9.0, -5.0]), valid=valid, mask=mask)
    # Kept tokens [.5, .5, −.5, −.5]: mean 0, std .5 → ±1; filler 0.
    np.testing.assert_allclose(
      out, [[1, 1], [-1, -1], [0, 0], [0, 0]], rtol=1e-5
    )

  def test_mask_rows_must_match(self):
    with pytest.raises(ValueError, match="one row per reward"):
      advantages.reinforce_pp_baseline(
        jnp.zeros(4), 2, mask=jnp.ones((3, 2), bool)
      )


if __name__ == "__main__":
  pytest.main([__file__])
