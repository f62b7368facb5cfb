"""VAPO's positive-example NLL (`rljax.core.nll`): hand-computed values, the
micro-batch-exact (sum, denominator) split, and gradients only into the
positive responses' tokens."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core import nll

LOGP = jnp.array(
  [[-1.0, -2.0, -3.0], [-0.5, -0.5, jnp.inf], [-4.0, -4.0, -4.0]]
)
MASK = jnp.array([[1, 1, 0], [1, 1, 0], [1, 1, 1]], bool)
REWARDS = jnp.array([1.0, 0.5, 0.0])


class PositiveNllTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # Positive: rows 0 and 1 (row 2 has reward 0). Tokens −1, −2, −.5, −.5
    # (row 0's −3 is padding, row 1's inf too): NLL 4 over 4 tokens = 1.
    out = self.variant(nll.positive_nll)(LOGP, MASK, REWARDS)
    np.testing.assert_allclose(out, 1.0, rtol=1e-6)
    s, d = self.variant(nll.positive_nll_terms)(LOGP, MASK, REWARDS)
    np.testing.assert_allclose([s, d], [4.0, 4.0], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_no_positive_response_is_zero(self):
    out = self.variant(nll.positive_nll)(LOGP, MASK, jnp.array([0.0, -1, 0]))
    np.testing.assert_array_equal(out, 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_terms_sum_over_micro_batches(self):
    terms = self.variant(nll.positive_nll_terms)
    s0, d0 = terms(LOGP[:1], MASK[:1], REWARDS[:1])
    s1, d1 = terms(LOGP[1:], MASK[1:], REWARDS[1:])
    np.testing.assert_allclose((s0 + s1) / (d0 + d1), 1.0, rtol=1e-6)

  def test_gradient_reaches_only_positive_valid_tokens(self):
    logp = jnp.where(jnp.isfinite(LOGP), LOGP, 0.0)
    g = jax.grad(lambda x: nll.positive_nll(x, MASK, REWARDS))(logp)
    # −1/4 on the 4 counted tokens, 0 elsewhere.
    np.testing.assert_allclose(
      g,
      [[-0.25, -0.25, 0.0], [-0.25, -0.25, 0.0], [0.0, 0.0, 0.0]],
      rtol=1e-6,
    )

  def test_bad_shapes(self):
    with pytest.raises(ValueError, match="one entry per row"):
      nll.positive_nll(LOGP, MASK, jnp.zeros(2))
    with pytest.raises(ValueError, match="mask has shape"):
      nll.positive_nll(LOGP, MASK[:, :2], REWARDS)


if __name__ == "__main__":
  pytest.main([__file__])
