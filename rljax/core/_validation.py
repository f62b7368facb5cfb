"""Input checks shared by the rljax.core kernels.

The kernels run under `jax.jit`, so these checks look only at static facts
(ranks, shapes, dtypes, Python hyper-parameters) and run once per trace. They
raise ValueError/TypeError naming the argument, the bad value and what was
expected, instead of the bare AssertionError that chex would raise, because a
wrong batch layout is a user error, not an internal invariant.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import jax.numpy as jnp
import numpy as np


def shape_of(x: Any) -> tuple[int, ...]:
  return tuple(np.shape(x))


def check_rank(name: str, x: Any, ranks: int | Iterable[int]) -> None:
  allowed = (ranks,) if isinstance(ranks, int) else tuple(ranks)
  if np.ndim(x) not in allowed:
    expected = " or ".join(str(r) for r in allowed)
    raise ValueError(
      f"{name} must have rank {expected}; got shape {shape_of(x)} "
      f"(rank {np.ndim(x)})."
    )


def check_same_shape(**arrays: Any) -> None:
  """All arrays (by keyword name) must share one shape."""
  items = list(arrays.items())
  first_name, first = items[0]
  for name, x in items[1:]:
    if shape_of(x) != shape_of(first):
      raise ValueError(
        f"{name} has shape {shape_of(x)} but {first_name} has shape "
        f"{shape_of(first)}; they must match."
      )


def check_floating(name: str, x: Any) -> None:
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(
      f"{name} must be a floating-point array; got dtype {dtype}."
    )


def as_float(x: Any) -> jnp.ndarray:
  """Array in at least float32: bf16 log-probs lose the ratio's precision."""
  x = jnp.asarray(x)
  dtype = jnp.promote_types(x.dtype, jnp.float32)
  return x.astype(dtype)


def as_mask(name: str, mask: Any) -> jnp.ndarray:
  """Boolean validity mask from a bool or 0/1 numeric array."""
  mask = jnp.asarray(mask)
  if mask.dtype == jnp.bool_:
    return mask
  if not (
    jnp.issubdtype(mask.dtype, jnp.integer)
    or jnp.issubdtype(mask.dtype, jnp.floating)
  ):
    raise TypeError(
      f"{name} must be bool or numeric 0/1; got dtype {mask.dtype}."
    )
  return mask != 0


def check_group_size(
  rewards: Any, group_size: Any, *, min_size: int = 1
) -> int:
  """Validates [N] rewards split into contiguous groups of `group_size`."""
  if isinstance(group_size, bool) or not isinstance(
    group_size, (int, np.integer)
  ):
    raise TypeError(
      f"group_size must be a Python int (it fixes array shapes); got "
      f"{group_size!r} of type {type(group_size).__name__}."
    )
  group_size = int(group_size)
  if group_size < min_size:
    raise ValueError(f"group_size must be >= {min_size}; got {group_size}.")
  check_rank("rewards", rewards, 1)
  n = shape_of(rewards)[0]
  if n % group_size != 0:
    raise ValueError(
      f"rewards has N={n} entries, which group_size={group_size} does not "
      f"divide; rewards must hold n_groups * group_size contiguous samples."
    )
  return group_size


def check_real(
  name: str,
  value: Any,
  *,
  low: float | None = None,
  high: float | None = None,
  low_inclusive: bool = True,
  high_inclusive: bool = True,
  allow_inf: bool = False,
) -> float:
  """A Python real hyper-parameter inside an interval; returns it as float."""
  if isinstance(value, bool) or not isinstance(
    value, (int, float, np.integer, np.floating)
  ):
    raise TypeError(
      f"{name} must be a real number; got {value!r} of type "
      f"{type(value).__name__}."
    )
  value = float(value)
  if math.isnan(value) or (math.isinf(value) and not allow_inf):
    raise ValueError(f"{name} must be finite; got {value}.")
  too_low = low is not None and (value < low if low_inclusive else value <= low)
  too_high = high is not None and (
    value > high if high_inclusive else value >= high
  )
  if too_low or too_high:
    lo = "(-inf" if low is None else ("[" if low_inclusive else "(") + f"{low}"
    hi = (
      "inf)" if high is None else f"{high}" + ("]" if high_inclusive else ")")
    )
    raise ValueError(f"{name} must be in {lo}, {hi}; got {value}.")
  return value


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
  choices = tuple(choices)
  if value not in choices:
    raise ValueError(
      f"{name}={value!r} is not supported; valid values: "
      f"{', '.join(repr(c) for c in choices)}."
    )
  return value
