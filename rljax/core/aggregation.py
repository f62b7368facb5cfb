"""Aggregation of per-token losses into one scalar, micro-batch exact.

Every mode is written as a ratio `sum / denominator` where both parts are
sums over sequences. Summing `sum` and `denominator` over micro-batches (split
along the batch axis) and dividing once therefore gives exactly the full-batch
loss, which a plain mean of per-micro-batch means would not (Yu et al. 2025,
DAPO token-level loss; Liu et al. 2025, Dr. GRPO).

Modes, for per-token loss l_{i,t} and mask m_{i,t}, n_i = Σ_t m_{i,t}, and
S = #{i : n_i > 0} (sequences with at least one valid token):

  token-mean               Σ_{i,t} m l / Σ_{i,t} m                 (DAPO)
  seq-mean-token-mean      Σ_i (Σ_t m l / n_i) / S                 (GRPO, Shao et al. 2024)
  seq-mean-token-sum       Σ_i (Σ_t m l) / S
  seq-mean-token-sum-norm  Σ_i (Σ_t m l / norm_const) / S          (Dr. GRPO)

Sequences without valid tokens (padding rows, filtered groups) do not count in
S: a filtered sequence must not dilute the others.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _validation as v

AGGREGATION_MODES = (
  "token-mean",
  "seq-mean-token-mean",
  "seq-mean-token-sum",
  "seq-mean-token-sum-norm",
)


def check_norm_const(norm_const: Any) -> float | None:
  if norm_const is None:
    return None
  return v.check_real("norm_const", norm_const, low=0.0, low_inclusive=False)


def aggregate(
  per_token_loss: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  mode: str = "token-mean",
  norm_const: float | None = None,
) -> tuple[Float[Array, ""], Float[Array, ""]]:
  """(sum, denominator) of a masked per-token loss; see the module docstring.

  Args:
    per_token_loss: [B, T] loss per token; values at masked positions are
      ignored (even if NaN/inf).
    mask: [B, T] bool (or 0/1) validity mask.
    mode: one of AGGREGATION_MODES.
    norm_const: constant divisor of `seq-mean-token-sum-norm` (Dr. GRPO uses
      the maximum generation length). None means T, the padded length; pass it
      explicitly when micro-batches are padded to different lengths.

  Returns:
    (sum, denominator), f32 scalars. `finalize(sum, denominator)` is the loss.
  """
  v.check_rank("per_token_loss", per_token_loss, 2)
  v.check_same_shape(per_token_loss=per_token_loss, mask=mask)
  v.check_choice("aggregation", mode, AGGREGATION_MODES)
  norm_const = check_norm_const(norm_const)
  v.check_floating("per_token_loss", per_token_loss)

  loss = v.as_float(per_token_loss)
  valid = v.as_mask("mask", mask)
  # `where` instead of a product so NaN/inf at padding never leaks (nor its grad).
  masked = jnp.where(valid, loss, 0.0)
  n_tokens = valid.sum(axis=-1).astype(loss.dtype)

  if mode == "token-mean":
    return masked.sum(), n_tokens.sum()

  seq_total = masked.sum(axis=-1)
  has_tokens = n_tokens > 0
  n_sequences = has_tokens.sum().astype(loss.dtype)
  if mode == "seq-mean-token-mean":
    seq_value = seq_total / jnp.where(has_tokens, n_tokens, 1.0)
  elif mode == "seq-mean-token-sum":
    seq_value = seq_total
  else:  # seq-mean-token-sum-norm
    divisor = (
      float(v.shape_of(per_token_loss)[1]) if norm_const is None else norm_const
    )
    seq_value = seq_total / divisor
  return seq_value.sum(), n_sequences


def finalize(
  total: Float[ArrayLike, ""], denominator: Float[ArrayLike, ""]
) -> Float[Array, ""]:
  """total / denominator, and 0 (not NaN) when nothing was valid.

  The double `where` keeps the gradient finite when denominator == 0.
  """
  total = v.as_float(total)
  denominator = v.as_float(denominator)
  nonzero = denominator > 0
  return jnp.where(nonzero, total / jnp.where(nonzero, denominator, 1.0), 0.0)


def aggregate_mean(
  per_token_loss: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  mode: str = "token-mean",
  norm_const: float | None = None,
) -> Float[Array, ""]:
  """finalize(*aggregate(...)): the aggregated loss of one (full) batch."""
  return finalize(*aggregate(per_token_loss, mask, mode, norm_const))


def masked_mean(
  x: Float[ArrayLike, "..."], mask: Bool[ArrayLike, "..."]
) -> Float[Array, ""]:
  """Mean of x over the valid entries; 0 when there are none."""
  v.check_same_shape(x=x, mask=mask)
  valid = v.as_mask("mask", mask)
  x = v.as_float(x)
  return finalize(jnp.where(valid, x, 0.0).sum(), valid.sum().astype(x.dtype))
