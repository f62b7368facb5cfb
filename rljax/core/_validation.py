"""The one set of input checks of rljax: kernel arguments and config fields.

Kernels: the kernels run under `jax.jit`, so these checks look only at
static facts (ranks, shapes, dtypes, Python hyper-parameters) and run once
per trace. They raise ValueError/TypeError naming the argument, the bad value
and what was expected, instead of the bare AssertionError that chex would
raise, because a wrong batch layout is a user error, not an internal
invariant.

Config fields: a `Rule` maps a value to what was expected of it (a phrase
such as ">= 1" or "one of ('a', 'b')"), or None when the value is fine.
Rules compose (`all_of`, `optional`, `expect`); `check_field` raises the
error of one field ("SamplingConfig.n=0; expected >= 1"), and a validator
that reports every problem at once (train/config/validation.py) collects
the phrases instead. Either way `field_message` words the line: it is the
one place where "field X has the bad value V; expected E" is written.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

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
    interval = interval_text(
      -math.inf if low is None else low,
      math.inf if high is None else high,
      lo_open=not low_inclusive,
      hi_open=not high_inclusive,
    )
    raise ValueError(f"{name} must be in {interval}; got {value}.")
  return value


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
  choices = tuple(choices)
  if value not in choices:
    raise ValueError(
      f"{name}={value!r} is not supported; valid values: "
      f"{', '.join(repr(c) for c in choices)}."
    )
  return value


# -- config fields -------------------------------------------------------------

Rule = Callable[[Any], "str | None"]  # value -> what was expected, or None


def interval_text(
  lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> str:
  """ "[0, 1)", "(0, inf)": an infinite end is always open."""
  left = "(-inf" if lo == -math.inf else ("(" if lo_open else "[") + f"{lo}"
  right = "inf)" if hi == math.inf else f"{hi}" + (")" if hi_open else "]")
  return f"{left}, {right}"


def is_int(value: Any) -> str | None:
  """A Python or numpy int; a bool is not a count."""
  ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
  return None if ok else "an int"


def is_real(value: Any) -> str | None:
  """A Python or numpy int or float (not a bool)."""
  ok = isinstance(
    value, (int, float, np.integer, np.floating)
  ) and not isinstance(value, bool)
  return None if ok else "a number"


def is_bool(value: Any) -> str | None:
  return None if isinstance(value, (bool, np.bool_)) else "a bool"


_TYPE_TEXT = {int: "an int", float: "a number", bool: "a bool", str: "a str"}


def of_type(kind: type) -> Rule:
  """A value of the Python type `kind` itself, as a JSON file holds it (a
  config recorded in a run directory): an int passes for a float, a bool
  never passes for a number, and numpy scalars (not JSON) never pass."""
  allowed = (int, float) if kind is float else (kind,)
  text = _TYPE_TEXT.get(kind, f"a {kind.__name__}")

  def rule(v):
    ok = isinstance(v, allowed) and (kind is bool or not isinstance(v, bool))
    return None if ok else text

  return rule


def non_empty_str(value: Any) -> str | None:
  return None if isinstance(value, str) and value else "a non-empty str"


def one_of(*choices: Any) -> Rule:
  return lambda v: None if v in choices else f"one of {choices}"


def in_range(
  lo: float = -math.inf,
  hi: float = math.inf,
  *,
  lo_open: bool = False,
  hi_open: bool = False,
) -> Rule:
  """A number in the interval; NaN never is."""
  text = "a value in " + interval_text(lo, hi, lo_open=lo_open, hi_open=hi_open)

  def rule(v):
    ok_lo = v > lo if lo_open else v >= lo
    ok_hi = v < hi if hi_open else v <= hi
    return None if ok_lo and ok_hi else text

  return rule


def at_least(lo: float, why: str = "") -> Rule:
  """>= lo; `why` says what the bound means (">= 0 (0 turns it off)")."""
  return lambda v: (
    None if v >= lo else f">= {lo}" + (f" ({why})" if why else "")
  )


def optional(rule: Rule) -> Rule:
  """None, or a value that passes `rule`."""
  return lambda v: None if v is None else rule(v)


def all_of(*rules: Rule) -> Rule:
  """The phrase of the first rule that fails (type rules first, so that
  range rules only see numbers)."""

  def rule(v):
    for r in rules:
      expected = r(v)
      if expected:
        return expected
    return None

  return rule


def expect(rule: Rule, text: str) -> Rule:
  """`rule`, with `text` as what was expected when it fails."""
  return lambda v: text if rule(v) else None


def _shown(value: Any) -> str:
  # np.float64(0.5) -> 0.5: the value as the user wrote it.
  return repr(value.item() if isinstance(value, np.generic) else value)


def field_message(name: str, value: Any, expected: str) -> str:
  """ "{name}={value!r}; expected {expected}": every bad setting of rljax, a
  config field (`check_field`) or a flag (`--loss.eps_high=-1; expected
  ...`), is worded here."""
  return f"{name}={_shown(value)}; expected {expected}"


def check_field(
  owner: str,
  name: str,
  value: Any,
  rule: Rule,
  error: type[Exception] = ValueError,
) -> None:
  """Raises `error("{owner}.{name}={value!r}; expected {phrase}")` when
  `rule` rejects the value."""
  expected = rule(value)
  if expected:
    raise error(field_message(f"{owner}.{name}", value, expected))
