"""Value head and separate critic."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models

CONFIG = models.tiny_config()


@pytest.fixture(scope="module")
def params(random_params):
  return random_params(CONFIG)


def _tokens():
  return jnp.asarray(
    np.random.default_rng(0).integers(3, CONFIG.vocab_size, (2, 6)), jnp.int32
  )


def test_zero_init_gives_zero_values(params):
  head = models.init_value_head(CONFIG, jax.random.PRNGKey(0))
  assert head["kernel"].shape == (CONFIG.hidden_size, 1)
  values = models.value_forward(CONFIG, params, head, _tokens())
  assert values.shape == (2, 6) and values.dtype == jnp.float32
  np.testing.assert_array_equal(values, 0.0)


def test_values_are_linear_in_final_hidden(params):
  head = models.init_value_head(CONFIG, jax.random.PRNGKey(0), init_scale=1.0)
  head["bias"] = jnp.array([0.5])
  tokens = _tokens()
  mask = jnp.ones_like(tokens).at[0, 0].set(0)
  _, hidden = models.forward(CONFIG, params, tokens, mask, return_hidden=True)
  expected = hidden @ head["kernel"][:, 0] + 0.5
  np.testing.assert_allclose(
    models.value_forward(CONFIG, params, head, tokens, mask),
    expected,
    atol=1e-5,
  )
  assert float(jnp.std(expected)) > 1e-3


def test_separate_critic_gets_gradients_on_backbone_and_head(params):
  critic = models.init_critic(
    CONFIG, params, jax.random.PRNGKey(1), init_scale=1.0
  )
  jax.tree.map(np.testing.assert_array_equal, critic["backbone"], params)
  tokens = _tokens()

  def loss(c):
    v = models.value_forward(CONFIG, c["backbone"], c["head"], tokens)
    return jnp.mean((v - 1.0) ** 2)

  grads = jax.jit(jax.grad(loss))(critic)
  assert float(jnp.abs(grads["head"]["kernel"]).max()) > 0
  assert (
    float(jnp.abs(grads["backbone"]["layers"]["q_proj"]["kernel"]).max()) > 0
  )
  assert "lm_head" in critic["backbone"]  # unused by the critic: zero grad
  np.testing.assert_array_equal(grads["backbone"]["lm_head"]["kernel"], 0.0)


def test_bad_head_shape(params):
  with pytest.raises(ValueError, match="value head kernel"):
    models.value_forward(
      CONFIG,
      params,
      {"kernel": jnp.zeros((4, 1)), "bias": jnp.zeros(1)},
      _tokens(),
    )


def test_negative_init_scale():
  with pytest.raises(ValueError, match="init_scale"):
    models.init_value_head(CONFIG, jax.random.PRNGKey(0), init_scale=-1.0)
