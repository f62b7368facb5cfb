"""Tests of rljax.core.critic: PPO's clipped value loss."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

from rljax.core import critic


class ValueLossTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    values = jnp.array([[1.5, 1.1, 7.0]])
    old = jnp.array([[1.0, 1.0, 0.0]])
    returns = jnp.array([[2.0, 2.0, 0.0]])
    mask = jnp.array([[1, 1, 0]], bool)
    fn = self.variant(
      lambda v: critic.value_loss(v, old, returns, mask, clip_eps=0.2)
    )
    loss, metrics = fn(values)
    # Token 0: max(.25, (1.2−2)²=.64)/2 = .32 (clipped); token 1: .81/2 = .405.
    self.assertAlmostEqual(float(loss), (0.32 + 0.405) / 2, places=6)
    self.assertAlmostEqual(float(metrics["value_clip_fraction"]), 0.5)
    grad = jax.grad(lambda v: fn(v)[0])(values)
    np.testing.assert_allclose(grad[0], [0.0, (1.1 - 2.0) / 2, 0.0], atol=1e-6)

  def test_unclipped_and_errors(self):
    loss, _ = critic.value_loss(
      jnp.array([[3.0]]),
      jnp.array([[0.0]]),
      jnp.array([[1.0]]),
      jnp.ones((1, 1)),
      clip_eps=None,
    )
    self.assertAlmostEqual(float(loss), 2.0)
    with pytest.raises(ValueError, match="clip_eps"):
      critic.value_loss(
        jnp.ones((1, 1)),
        jnp.ones((1, 1)),
        jnp.ones((1, 1)),
        jnp.ones((1, 1)),
        clip_eps=-1.0,
      )
    with pytest.raises(ValueError, match="returns has shape"):
      critic.value_loss(
        jnp.ones((1, 2)), jnp.ones((1, 2)), jnp.ones((1, 3)), jnp.ones((1, 2))
      )


if __name__ == "__main__":
  absltest.main()
