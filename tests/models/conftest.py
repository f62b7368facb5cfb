"""Shared helpers for the rljax.models tests."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models


def randomize(config, seed=0, dtype=jnp.float32):
  """Params in the init_params layout with every leaf random (norm scales
  near 1, nonzero biases), so a swapped or mis-transposed tensor changes the
  outputs. Built with numpy: eager jax ops would compile one kernel per shape.
  """
  shapes = jax.eval_shape(
    lambda: models.init_params(config, jax.random.PRNGKey(0))
  )
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = jax.tree_util.keystr(path)
    noise = rng.standard_normal(leaf.shape).astype(np.float32)
    if "scale" in name:
      value = 1.0 + 0.2 * noise
    elif "bias" in name:
      value = 0.1 * noise
    else:
      value = 0.2 * noise
    return jnp.asarray(value, dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.fixture(scope="session")
def random_params():
  return randomize
