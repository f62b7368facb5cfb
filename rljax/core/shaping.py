"""Reward shaping and group filtering (DAPO and length-control recipes).

All functions are pure and jittable; lengths count response tokens.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from rljax.core import _validation as v


def soft_overlong_punishment(
  lengths: Int[ArrayLike, "N"], max_len: int, cache_len: int
) -> Float[Array, "N"]:
  """DAPO soft overlong punishment R_length(y), added to the task reward.

  Yu et al. 2025, DAPO Eq. 13:
    0                                  |y| ≤ L_max − L_cache
    ((L_max − L_cache) − |y|) / L_cache   L_max − L_cache < |y| ≤ L_max
    −1                                 |y| > L_max
  """
  max_len = v.check_real("max_len", max_len, low=0.0, low_inclusive=False)
  cache_len = v.check_real(
    "cache_len", cache_len, low=0.0, high=max_len, low_inclusive=False
  )
  v.check_rank("lengths", lengths, 1)
  lengths = v.as_float(lengths)
  start = max_len - cache_len
  ramp = (start - lengths) / cache_len
  return jnp.where(
    lengths <= start, 0.0, jnp.where(lengths <= max_len, ramp, -1.0)
  )


def overlong_filter_mask(
  truncated: Bool[ArrayLike, "B"], mask: Bool[ArrayLike, "B T"]
) -> Bool[Array, "B T"]:
  """DAPO overlong filtering (Yu et al. 2025 §3.4): truncated responses are
  masked out of the loss entirely, since a cut-off answer may be right."""
  v.check_rank("truncated", truncated, 1)
  v.check_rank("mask", mask, 2)
  if v.shape_of(truncated)[0] != v.shape_of(mask)[0]:
    raise ValueError(
      f"truncated has shape {v.shape_of(truncated)} but mask has "
      f"{v.shape_of(mask)[0]} rows; expected one flag per sequence."
    )
  return v.as_mask("mask", mask) & ~v.as_mask("truncated", truncated)[:, None]


def length_penalty(
  lengths: Int[ArrayLike, "N"],
  target_len: float | Float[ArrayLike, "N"],
  alpha: float = 1.0,
) -> Float[Array, "N"]:
  """L1-style length penalty  −α·|len − target| / target.

  After Aggarwal & Welleck 2025, L1 / LCPO (reward r − α·|n_target − n_y|),
  divided by the target so α is unit-free across budgets. `target_len` is a
  scalar or one budget per sample [N] (all > 0).
  """
  v.check_rank("lengths", lengths, 1)
  alpha = v.check_real("alpha", alpha, low=0.0)
  if isinstance(target_len, (int, float)):
    v.check_real("target_len", target_len, low=0.0, low_inclusive=False)
  else:
    v.check_rank("target_len", target_len, (0, 1))
    if v.shape_of(target_len) not in ((), v.shape_of(lengths)):
      raise ValueError(
        f"target_len has shape {v.shape_of(target_len)}; expected a "
        f"scalar or {v.shape_of(lengths)} like lengths."
      )
  lengths = v.as_float(lengths)
  target = v.as_float(target_len)
  return -alpha * jnp.abs(lengths - target) / target


def zero_variance_groups(
  rewards: Float[ArrayLike, "N"], group_size: int
) -> Bool[Array, "G"]:
  """True for each group whose rewards are all equal: zero advantage, no signal.

  Yu et al. 2025, DAPO dynamic sampling: keep only groups with
  0 < #correct < G (here: max_g r > min_g r, which covers graded rewards).
  """
  group_size = v.check_group_size(rewards, group_size)
  groups = v.as_float(rewards).reshape(-1, group_size)
  return groups.max(axis=-1) == groups.min(axis=-1)


def group_keep_mask(
  rewards: Float[ArrayLike, "N"], group_size: int
) -> Bool[Array, "N"]:
  """Per-sample DAPO dynamic-sampling mask: True where the sample's group has
  reward variance (see `zero_variance_groups`)."""
  keep_groups = ~zero_variance_groups(rewards, group_size)
  return jnp.repeat(keep_groups, group_size)


def informative_group_indices(
  rewards: Float[ArrayLike, "N"], group_size: int, max_groups: int
) -> tuple[Int[Array, "K"], Bool[Array, "K"]]:
  """Fixed-size selection for dynamic sampling under jit.

  Returns (indices, valid), both [max_groups]: the indices of the groups with
  reward variance in their original order, then padding (index 0, valid
  False). The caller gathers the kept groups and refills the rest from an
  oversampled batch (DAPO, Yu et al. 2025).
  """
  if (
    isinstance(max_groups, bool)
    or not isinstance(max_groups, int)
    or max_groups < 1
  ):
    raise ValueError(f"max_groups must be a positive int; got {max_groups!r}.")
  keep = ~zero_variance_groups(rewards, group_size)
  n_groups = keep.shape[0]
  # Stable sort puts kept groups first, in their original order.
  order = jnp.argsort(~keep, stable=True)
  valid = keep[order]
  pad = max_groups - n_groups
  if pad > 0:
    order = jnp.concatenate([order, jnp.zeros((pad,), order.dtype)])
    valid = jnp.concatenate([valid, jnp.zeros((pad,), bool)])
  order, valid = order[:max_groups], valid[:max_groups]
  return jnp.where(valid, order, 0), valid
