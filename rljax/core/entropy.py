"""Policy entropy from logits: per token, and its masked mean (the metric
and the optional bonus term of policy-gradient training)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _validation as v
from rljax.core import aggregation


def token_entropy(logits: Float[ArrayLike, "B T V"]) -> Float[Array, "B T"]:
  """H_t = −Σ_v p_v log p_v of p = softmax(logits), per token.

  The policy entropy monitored (and optionally maximised as a bonus) in policy
  gradient methods (Williams & Peng 1991; Mnih et al. 2016, A3C).
  """
  v.check_rank("logits", logits, 3)
  v.check_floating("logits", logits)
  log_probs = jax.nn.log_softmax(v.as_float(logits), axis=-1)
  # 0·(−inf) is NaN (and so is its gradient): masked-out vocabulary entries
  # (−inf logits) contribute 0, through a double where.
  finite = jnp.isfinite(log_probs)
  safe = jnp.where(finite, log_probs, 0.0)
  return -jnp.sum(jnp.where(finite, jnp.exp(safe) * safe, 0.0), axis=-1)


def entropy_from_logits(
  logits: Float[ArrayLike, "B T V"], mask: Bool[ArrayLike, "B T"]
) -> Float[Array, ""]:
  """Masked token-mean policy entropy (the entropy metric / bonus term)."""
  v.check_rank("mask", mask, 2)
  if v.shape_of(logits)[:2] != v.shape_of(mask):
    raise ValueError(
      f"logits has shape {v.shape_of(logits)} but mask has shape "
      f"{v.shape_of(mask)}; expected logits [B, T, V] with mask [B, T]."
    )
  return aggregation.masked_mean(token_entropy(logits), mask)
