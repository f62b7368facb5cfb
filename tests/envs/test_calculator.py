"""The calculator: exact values, refusals before any big computation."""

import time
from fractions import Fraction

import pytest

from rljax.envs import CalculatorTool
from rljax.envs.calculator import (
  CalculatorConfig,
  CalculatorError,
  calculate,
  format_number,
)


class TestCalculate:
  @pytest.mark.parametrize(
    "expression,value",
    [
      ("48213 * 7391 - 120934", 48213 * 7391 - 120934),
      ("123456 \u00d7 654321 \u2212 1", 123456 * 654321 - 1),  # × and −
      ("(2 + 3) * 4", 20),
      ("2^10", 1024),  # ^ is a power, as written in math
      ("2**-2", Fraction(1, 4)),
      ("-2**2", -4),
      ("7 / 2", Fraction(7, 2)),
      ("7 // 2 + 7 % 2", 4),
      ("0.1 + 0.2", Fraction(3, 10)),  # decimals are exact
      ("1,234,567 + 1", 1234568),  # thousands separators
      ("99999999999999999999 * 99999999999999999999", (10**20 - 1) ** 2),
    ],
  )
  def test_exact_values(self, expression, value):
    assert calculate(expression) == value

  @pytest.mark.parametrize(
    "expression,kind",
    [
      ("__import__('os').system('true')", "syntax"),
      ("x + 1", "syntax"),
      ("abs(-1)", "syntax"),
      ("1 < 2", "syntax"),
      ("'a' * 3", "syntax"),
      ("1 +", "syntax"),
      ("", "syntax"),
      ("1 / 0", "math"),
      ("0 ** -1", "math"),
      ("2 ** 0.5", "math"),
      ("10 ** 1000", "limit"),
      ("9**9**9**9", "limit"),
      ("(10**500) * (10**600)", "limit"),
      ("1" + "+1" * 300, "limit"),  # longer than max_chars
    ],
  )
  def test_refusals(self, expression, kind):
    with pytest.raises(CalculatorError) as raised:
      calculate(expression)
    assert raised.value.kind == kind

  def test_power_tower_is_refused_without_computing(self):
    # 9**(9**9) alone has ~370 million digits; a refusal must be instant.
    start = time.monotonic()
    for expression in ("9**9**9**9", "9**9**9", "2**(2**64)", "(-3)**10**9"):
      with pytest.raises(CalculatorError):
        calculate(expression)
    assert time.monotonic() - start < 0.5

  def test_deep_nesting_is_refused(self):
    with pytest.raises(CalculatorError) as raised:
      calculate("-" * 60 + "1")
    assert raised.value.kind == "limit"

  def test_digit_bound_is_a_config_field(self):
    assert calculate("10**20", CalculatorConfig(max_digits=21)) == 10**20
    with pytest.raises(CalculatorError):
      calculate("10**20", CalculatorConfig(max_digits=20))

  @pytest.mark.parametrize(
    "field,value",
    [("max_chars", 0), ("max_digits", 5000), ("max_depth", "3")],
  )
  def test_config_names_the_bad_field(self, field, value):
    with pytest.raises(ValueError, match=rf"CalculatorConfig\.{field}="):
      CalculatorConfig(**{field: value})


class TestFormatNumber:
  @pytest.mark.parametrize(
    "value,text",
    [
      (Fraction(1234), "1234"),
      (Fraction(7, 2), "7/2 = 3.5"),
      (Fraction(-7, 2), "-7/2 = -3.5"),
      (Fraction(1, 3), "1/3 \u2248 0.333333333333"),
      (Fraction(2, 3), "2/3 \u2248 0.666666666667"),
    ],
  )
  def test_text(self, value, text):
    assert format_number(value) == text


class TestCalculatorTool:
  def test_answer_and_named_errors(self):
    tool = CalculatorTool()
    assert tool.run({"expression": "12345 * 6789"}, 1.0).output == str(
      12345 * 6789
    )
    assert tool.run({"expression": "1/0"}, 1.0).error == "math"
    assert tool.run({"expression": "9**9**9**9"}, 1.0).error == "limit"
    assert tool.run({"expression": "open('x')"}, 1.0).error == "arguments"
    assert tool.run({"expr": "1"}, 1.0).error == "arguments"
    assert tool.run({"expression": 5}, 1.0).error == "arguments"
