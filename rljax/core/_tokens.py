"""Input handling shared by the token-level loss kernels: shape checks of
[B, T] arrays against their mask, padding zeroed before any arithmetic, and
masked fractions for metrics."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import ArrayLike

from rljax.core import _validation as v
from rljax.core import aggregation


def check_tokens(mask, **arrays) -> jnp.ndarray:
  """Checks each array is floating [B, T] with the mask's shape; the mask."""
  for name, x in arrays.items():
    v.check_rank(name, x, 2)
    v.check_floating(name, x)
  v.check_same_shape(**arrays, mask=mask)
  return v.as_mask("mask", mask)


def masked(x: ArrayLike, valid: jnp.ndarray) -> jnp.ndarray:
  # Zero padding before any arithmetic: -inf/NaN there must not reach grads.
  return jnp.where(valid, v.as_float(x), 0.0)


def fraction(indicator: jnp.ndarray, valid: jnp.ndarray) -> jnp.ndarray:
  """Share of the valid tokens where `indicator` holds (f32)."""
  return aggregation.masked_mean(indicator.astype(jnp.float32), valid)
