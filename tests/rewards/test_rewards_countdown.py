"""The Countdown checker: safe parsing, number usage, exact value."""

from fractions import Fraction

import pytest

from rljax import rewards
from rljax.rewards import countdown


class TestEvaluate:
  @pytest.mark.parametrize(
    "expression,numbers,value",
    [
      ("3 * 5 + 7", [3, 5, 7], 22),
      ("(10 - 4) / 3", [3, 4, 10], 2),
      ("(1 + 1/2) * 4", [1, 1, 2, 4], 6),  # fractional intermediate allowed
      ("3 \\times 5 + 7", [3, 5, 7], 22),
      ("3 \u00d7 5 \u2212 7", [3, 5, 7], 8),
      ("[3 + 5] \\div 2", [2, 3, 5], 4),
      ("3 * 5 + 7 = 22", [3, 5, 7], 22),  # equation: the side with operators
      ("22 = 3 * 5 + 7", [3, 5, 7], 22),
      (
        "$5 + 5$",
        [5, 5],
        10,
      ),  # a repeated number given twice may be used twice
      ("7", [7, 1], 7),
    ],
  )
  def test_values(self, expression, numbers, value):
    assert countdown.evaluate_countdown_expression(
      expression, numbers
    ) == Fraction(value)

  @pytest.mark.parametrize(
    "expression,numbers,reason",
    [
      ("5 + 5", [5, 3], "beyond"),  # 5 used twice, given once
      ("3 + 4", [3, 5], "beyond"),  # 4 not given
      ("2 ** 3", [2, 3], "not allowed"),
      ("-3 + 5", [3, 5], "not allowed"),  # unary minus would invent numbers
      ("3 // 2", [2, 3], "not allowed"),
      ("__import__('os')", [1], "not allowed"),
      ("(3).real", [3], "not allowed"),
      ("3.0 + 1", [3, 1], "not allowed"),
      ("x + 1", [1], "not allowed"),
      ("3 / (2 - 2)", [3, 2, 2], "division by zero"),
      ("3 +", [3], "not an arithmetic"),
      ("1 + " * 100 + "1", [1] * 101, "characters"),
      ("", [1], "empty"),
    ],
  )
  def test_rejections(self, expression, numbers, reason):
    with pytest.raises(countdown.CountdownError, match=reason):
      countdown.evaluate_countdown_expression(expression, numbers)

  def test_require_all(self):
    assert (
      countdown.evaluate_countdown_expression(
        "3 + 5 + 7", [3, 5, 7], require_all=True
      )
      == 15
    )
    with pytest.raises(countdown.CountdownError, match="unused"):
      countdown.evaluate_countdown_expression(
        "3 + 5", [3, 5, 7], require_all=True
      )


class TestCountdownReward:
  @pytest.mark.parametrize(
    "completion,expected",
    [
      ("<think>try</think><answer>(10 - 4) * 3</answer>", 1.0),
      ("<answer>(10 - 4) * 3 = 18</answer>", 1.0),
      ("so \\boxed{3 \\times (10 - 4)}", 1.0),
      ("<answer>10 + 4 + 3</answer>", 0.0),  # valid, wrong value
      ("<answer>18</answer>", 0.0),  # the target itself is not a given number
      ("<answer>(10 - 4) * 3 * 1</answer>", 0.0),  # 1 not given
      ("(10 - 4) * 3", 0.0),  # no answer format
      ("<answer>open('x')</answer>", 0.0),
    ],
  )
  def test_values(self, completion, expected):
    assert rewards.countdown_reward(completion, [3, 4, 10], 18) == expected
