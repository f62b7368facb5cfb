"""Exact arithmetic on a model's expression, without ``eval``.

``calculate("48213 * 7391 - 120934")`` parses the text with ``ast`` and
walks a whitelist of node kinds (numbers, + - * / // % **, unary ±,
parentheses); anything else (names, calls, attributes, comparisons, strings)
is refused. Numbers are ``fractions.Fraction``: big integers and rationals
are exact, a decimal literal is the decimal it reads as (0.1 is 1/10).

Every step is bounded before it is computed, so that no input can take long:
the text's length, the nesting depth, and the size (in decimal digits) of
every intermediate result; a power is refused when its result would pass the
digit bound (``9**9**9**9`` is refused at ``9**387420489``, never computed).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from fractions import Fraction

from rljax.core import _validation as v

__all__ = ["CalculatorConfig", "CalculatorError", "calculate", "format_number"]


class CalculatorError(ValueError):
  """A refused or failed expression; ``kind`` is "syntax", "limit" or
  "math"."""

  def __init__(self, kind: str, message: str):
    super().__init__(message)
    self.kind = kind


@dataclasses.dataclass(frozen=True)
class CalculatorConfig:
  """Bounds of one calculation.

  Attributes:
    max_chars: longest expression text (>= 1).
    max_digits: most decimal digits of any numerator or denominator along
      the way (1..4000; Python refuses to print ints past 4300 digits).
    max_depth: deepest nesting of the expression tree (>= 1).
  """

  max_chars: int = 500
  max_digits: int = 1000
  max_depth: int = 50

  def __post_init__(self):
    for name, rule in (
      ("max_chars", v.all_of(v.is_int, v.at_least(1))),
      ("max_digits", v.all_of(v.is_int, v.in_range(1, 4000))),
      ("max_depth", v.all_of(v.is_int, v.at_least(1))),
    ):
      v.check_field("CalculatorConfig", name, getattr(self, name), rule)


# Written forms models use that Python does not: 2×3, 6÷2, 2^10, 1,234.
_SPELLINGS = (("\u00d7", "*"), ("\u00f7", "/"), ("\u2212", "-"), ("^", "**"))
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d.])")


def _digits(n: int) -> int:
  """Decimal digits of |n| (an upper bound within one, without str())."""
  return max(1, math.floor(abs(n).bit_length() * 0.30103) + 1)


def _size(x: Fraction) -> int:
  return max(_digits(x.numerator), _digits(x.denominator))


class _Evaluator:
  def __init__(self, config: CalculatorConfig):
    self.config = config

  def _check(self, x: Fraction) -> Fraction:
    if _size(x) > self.config.max_digits:
      raise CalculatorError(
        "limit", f"a result has more than {self.config.max_digits} digits"
      )
    return x

  def eval(self, node: ast.AST, depth: int) -> Fraction:
    if depth > self.config.max_depth:
      raise CalculatorError(
        "limit", f"nested deeper than {self.config.max_depth} levels"
      )
    if isinstance(node, ast.Expression):
      return self.eval(node.body, depth + 1)
    if isinstance(node, ast.Constant):
      value = node.value
      if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError("syntax", f"not a number: {value!r}")
      if isinstance(value, float):
        if not math.isfinite(value):
          raise CalculatorError("syntax", f"not a finite number: {value!r}")
        return self._check(Fraction(repr(value)))
      return self._check(Fraction(value))
    if isinstance(node, ast.UnaryOp) and isinstance(
      node.op, (ast.UAdd, ast.USub)
    ):
      x = self.eval(node.operand, depth + 1)
      return -x if isinstance(node.op, ast.USub) else x
    if isinstance(node, ast.BinOp):
      a = self.eval(node.left, depth + 1)
      b = self.eval(node.right, depth + 1)
      return self._binary(node.op, a, b)
    raise CalculatorError(
      "syntax",
      f"{type(node).__name__} is not allowed; use numbers, + - * / // % ** and parentheses",
    )

  def _binary(self, op: ast.operator, a: Fraction, b: Fraction) -> Fraction:
    limit = self.config.max_digits
    if isinstance(op, ast.Add):
      return self._check(a + b)
    if isinstance(op, ast.Sub):
      return self._check(a - b)
    if isinstance(op, ast.Mult):
      if _size(a) + _size(b) > limit + 2:
        raise CalculatorError(
          "limit", f"a product has more than {limit} digits"
        )
      return self._check(a * b)
    if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)):
      if b == 0:
        raise CalculatorError("math", "division by zero")
      if _size(a) + _size(b) > 2 * limit:
        raise CalculatorError(
          "limit", f"a quotient has more than {limit} digits"
        )
      if isinstance(op, ast.Div):
        return self._check(a / b)
      return self._check(
        Fraction(a // b) if isinstance(op, ast.FloorDiv) else a % b
      )
    if isinstance(op, ast.Pow):
      return self._power(a, b)
    raise CalculatorError(
      "syntax", f"operator {type(op).__name__} is not allowed"
    )

  def _power(self, a: Fraction, b: Fraction) -> Fraction:
    if b.denominator != 1:
      raise CalculatorError("math", "only whole-number exponents are exact")
    exponent = b.numerator
    if a == 0 and exponent < 0:
      raise CalculatorError("math", "division by zero")
    if a in (0, 1) or exponent == 0:
      return Fraction(1) if exponent == 0 else a
    if a == -1:
      return Fraction(-1 if exponent % 2 else 1)
    # Size of the result before computing it: |exponent| * log10 of the
    # larger of numerator and denominator.
    base_digits = max(
      math.log10(abs(a.numerator)) if a.numerator else 0.0,
      math.log10(a.denominator),
    )
    if abs(exponent) > 10 * self.config.max_digits or (
      abs(exponent) * base_digits > self.config.max_digits
    ):
      raise CalculatorError(
        "limit",
        f"the power would have more than {self.config.max_digits} digits",
      )
    return self._check(a**exponent)


def calculate(
  expression: str, config: CalculatorConfig = CalculatorConfig()
) -> Fraction:
  """The exact value of an arithmetic expression.

  Raises:
    CalculatorError: kind "syntax" (not an arithmetic expression), "limit"
      (too long, too deep, or a number past ``config.max_digits``) or "math"
      (division by zero, a fractional exponent).
  """
  if not isinstance(expression, str):
    raise CalculatorError(
      "syntax", f"expected text, got {type(expression).__name__}"
    )
  text = expression.strip()
  if len(text) > config.max_chars:
    raise CalculatorError(
      "limit",
      f"the expression has {len(text)} characters; at most {config.max_chars}",
    )
  if not text:
    raise CalculatorError("syntax", "empty expression")
  for written, python in _SPELLINGS:
    text = text.replace(written, python)
  text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
  try:
    tree = ast.parse(text, mode="eval")
  except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
    raise CalculatorError(
      "syntax", f"cannot parse {expression!r}: {error}"
    ) from None
  return _Evaluator(config).eval(tree, 0)


def format_number(x: Fraction, decimals: int = 12) -> str:
  """ "1234" for an integer; "7/2 = 3.5" or "1/3 ≈ 0.333333333333" else
  (the decimal by exact integer arithmetic, rounded half away from zero)."""
  if x.denominator == 1:
    return str(x.numerator)
  scaled = abs(x) * 10**decimals
  rounded = int(scaled + Fraction(1, 2))
  whole, part = divmod(rounded, 10**decimals)
  digits = str(part).rjust(decimals, "0").rstrip("0")
  sign = "-" if x < 0 else ""
  decimal = f"{sign}{whole}" + (f".{digits}" if digits else "")
  exact = Fraction(rounded, 10**decimals) == abs(x)
  relation = "=" if exact else "\u2248"
  return f"{x.numerator}/{x.denominator} {relation} {decimal}"
