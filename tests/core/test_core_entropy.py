"""Tests of rljax.core.entropy: per-token and masked-mean policy entropy."""

import math

import chex
import jax
import jax.numpy as jnp
import pytest
from absl.testing import absltest

from rljax.core import entropy


class EntropyTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    logits = jnp.stack(
      [
        jnp.zeros((2, 4)),
        jnp.log(
          jnp.array([[0.5, 0.5, 1e-30, 1e-30], [1.0, 1e-30, 1e-30, 1e-30]])
        ),
      ]
    )
    mask = jnp.array([[1, 1], [1, 0]], bool)
    ent = self.variant(entropy.entropy_from_logits)(logits, mask)
    self.assertAlmostEqual(
      float(ent), (2 * math.log(4) + math.log(2)) / 3, places=5
    )
    per_token = entropy.token_entropy(logits)
    self.assertAlmostEqual(float(per_token[1, 1]), 0.0, places=5)

  def test_masked_vocab_gradient_finite(self):
    logits = jnp.array([[[0.0, 1.0, -jnp.inf]]])
    grad = jax.grad(lambda x: entropy.entropy_from_logits(x, jnp.ones((1, 1))))(
      logits
    )
    chex.assert_tree_all_finite(grad)

  def test_shape_error(self):
    with pytest.raises(ValueError, match="logits has shape"):
      entropy.entropy_from_logits(jnp.zeros((2, 3, 4)), jnp.ones((2, 4)))


if __name__ == "__main__":
  absltest.main()
