"""The critic's loss: PPO's clipped value loss, micro-batch exact."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _tokens
from rljax.core import _validation as v
from rljax.core import aggregation


def value_loss_terms(
  values: Float[ArrayLike, "B T"],
  old_values: Float[ArrayLike, "B T"],
  returns: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  clip_eps: float | None = 0.2,
  aggregation_mode: str = "token-mean",
  norm_const: float | None = None,
) -> tuple[Float[Array, ""], Float[Array, ""], dict[str, Array]]:
  """(sum, denominator, metrics) of the PPO clipped value loss.

  Schulman et al. 2017 (PPO, as in OpenAI baselines):
    ℓ_t = ½ max((V − G)², (clip(V, V_old − ε, V_old + ε) − G)²),
  or ½ (V − G)² when clip_eps is None. Returns G and V_old are constants.
  Metrics: value_clip_fraction (the clipped branch is the max), value_error.
  """
  valid = _tokens.check_tokens(
    mask, values=values, old_values=old_values, returns=returns
  )
  if clip_eps is not None:
    clip_eps = v.check_real("clip_eps", clip_eps, low=0.0, low_inclusive=False)
  vals = _tokens.masked(values, valid)
  old = jax.lax.stop_gradient(_tokens.masked(old_values, valid))
  target = jax.lax.stop_gradient(_tokens.masked(returns, valid))
  unclipped = jnp.square(vals - target)
  if clip_eps is None:
    per_token = 0.5 * unclipped
    clipped_active = jnp.zeros(v.shape_of(values), bool)
  else:
    clipped = jnp.square(
      old + jnp.clip(vals - old, -clip_eps, clip_eps) - target
    )
    per_token = 0.5 * jnp.maximum(unclipped, clipped)
    clipped_active = clipped > unclipped
  total, denominator = aggregation.aggregate(
    per_token, valid, aggregation_mode, norm_const
  )
  metrics = {
    "value_clip_fraction": _tokens.fraction(clipped_active, valid),
    "value_error": aggregation.masked_mean(
      jax.lax.stop_gradient(unclipped), valid
    ),
  }
  return total, denominator, metrics


def value_loss(
  values: Float[ArrayLike, "B T"],
  old_values: Float[ArrayLike, "B T"],
  returns: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  clip_eps: float | None = 0.2,
  aggregation_mode: str = "token-mean",
  norm_const: float | None = None,
) -> tuple[Float[Array, ""], dict[str, Array]]:
  """PPO clipped value loss (scalar) and metrics; see `value_loss_terms`."""
  total, denominator, metrics = value_loss_terms(
    values, old_values, returns, mask, clip_eps, aggregation_mode, norm_const
  )
  return aggregation.finalize(total, denominator), metrics
