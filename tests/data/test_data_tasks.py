"""Generated tasks: determinism, independent checks of answers, solvability."""

import ast
import dataclasses
import itertools
import operator
import random
from fractions import Fraction

import pytest

from rljax import data, rewards
from rljax.data import arithmetic


def evaluate_rendered(expression):
  """Independent evaluation of a rendered question with Python's own
  precedence rules (ast walk, exact rationals)."""
  ops = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
  }

  def walk(node):
    if isinstance(node, ast.Constant):
      return Fraction(node.value)
    return ops[type(node.op)](walk(node.left), walk(node.right))

  return walk(
    ast.parse(
      expression.replace("\u00d7", "*").replace("\u00f7", "/"), mode="eval"
    ).body
  )


class TestArithmetic:
  @pytest.mark.parametrize("level", sorted(data.ARITHMETIC_LEVELS))
  def test_answers_match_independent_evaluation(self, level):
    config = data.ARITHMETIC_LEVELS[level]
    for ex in data.generate_arithmetic(200, level, seed=7):
      expression = ex.question.removeprefix("What is ").removesuffix("?")
      assert evaluate_rendered(expression) == Fraction(int(ex.answer)), (
        ex.question
      )
      steps = ex.metadata["steps"]
      assert len(steps) == config.num_steps
      assert {op for op, _ in steps} <= set(config.operators)
      # Every intermediate value is a non-negative integer.
      value = ex.metadata["start"]
      for op, n in steps:
        value = arithmetic.evaluate_steps(value, [(op, n)])
        assert value >= 0

  def test_word_problems_follow_their_steps(self):
    config = dataclasses.replace(data.ARITHMETIC_LEVELS["hard"], style="word")
    for ex in data.generate_arithmetic(100, config, seed=3):
      assert ex.question.endswith("have now?")
      assert int(ex.answer) == arithmetic.evaluate_steps(
        ex.metadata["start"], ex.metadata["steps"]
      )

  def test_easy_is_one_small_operation(self):
    for ex in data.generate_arithmetic(100, "easy", seed=0):
      a, op, b = ex.question.removeprefix("What is ").removesuffix("?").split()
      assert op in "+-" and 1 <= int(a) <= 10 and 1 <= int(b) <= 10

  def test_deterministic_from_seed(self):
    assert data.generate_arithmetic(
      20, "hard", seed=1
    ) == data.generate_arithmetic(20, "hard", seed=1)
    assert data.generate_arithmetic(
      20, "hard", seed=1
    ) != data.generate_arithmetic(20, "hard", seed=2)

  def test_checked_by_math_reward(self):
    ex = data.generate_arithmetic(1, "medium", seed=0)[0]
    assert (
      rewards.correctness_reward(
        "", f"\\boxed{{{ex.answer}}}", ex.answer, ex.metadata
      ).score
      == 1.0
    )
    assert (
      rewards.correctness_reward(
        "", f"\\boxed{{{int(ex.answer) + 1}}}", ex.answer, ex.metadata
      ).score
      == 0.0
    )

  @pytest.mark.parametrize(
    "kwargs,match",
    [
      ({"num_steps": 0}, "num_steps"),
      ({"operand_min": 5, "operand_max": 2}, "operand_min"),
      ({"operators": ("^",)}, "operators"),
      ({"style": "poem"}, "style"),
    ],
  )
  def test_bad_config(self, kwargs, match):
    with pytest.raises(ValueError, match=match):
      data.ArithmeticConfig(**kwargs)

  def test_unknown_level(self):
    with pytest.raises(ValueError, match="unknown level 'trivial'"):
      data.generate_arithmetic(1, "trivial", seed=0)


def brute_force_reachable(numbers):
  """Every value of every expression over every sub-multiset of numbers
  (each used at most once), by splitting ordered sequences into two
  sub-expressions: an algorithm unlike the library's pairwise reduction."""

  def values(seq):
    if len(seq) == 1:
      return {Fraction(seq[0])}
    out = set()
    for split in range(1, len(seq)):
      for a in values(seq[:split]):
        for b in values(seq[split:]):
          out.update({a + b, a - b, a * b})
          if b != 0:
            out.add(a / b)
    return out

  reachable = set()
  for size in range(1, len(numbers) + 1):
    for seq in itertools.permutations(numbers, size):
      reachable |= values(seq)
  return reachable


class TestCountdown:
  @pytest.mark.parametrize(
    "level,count", [("easy", 25), ("medium", 6)]
  )  # 4-number brute force is slow
  def test_generated_problems_are_solvable(self, level, count):
    for ex in data.generate_countdown(count, level, seed=11):
      numbers, target = ex.metadata["numbers"], ex.metadata["target"]
      assert Fraction(target) in brute_force_reachable(numbers)
      assert target not in numbers
      assert ex.answer == str(target)
      # The stored solution and the solver's both pass the checker.
      assert (
        rewards.countdown_reward(
          f"<answer>{ex.metadata['solution']}</answer>", numbers, target
        )
        == 1.0
      )
      solution = data.solve_countdown(numbers, target)
      assert (
        rewards.countdown_reward(
          f"<answer>{solution}</answer>", numbers, target
        )
        == 1.0
      )

  def test_solver_agrees_with_brute_force(self):
    rng = random.Random(0)
    solvable = unsolvable = 0
    for _ in range(60):
      numbers = [rng.randint(1, 9) for _ in range(3)]
      target = rng.randint(1, 300)
      found = data.solve_countdown(numbers, target)
      expected = Fraction(target) in brute_force_reachable(numbers)
      assert (found is not None) == expected, (numbers, target)
      if found is not None:
        assert rewards.evaluate_countdown_expression(found, numbers) == target
      solvable += expected
      unsolvable += not expected
    assert solvable > 5 and unsolvable > 5  # both branches exercised

  def test_hard_level_ranges(self):
    config = data.COUNTDOWN_LEVELS["hard"]
    for ex in data.generate_countdown(20, "hard", seed=5):
      assert len(ex.metadata["numbers"]) == config.num_numbers
      assert config.target_min <= ex.metadata["target"] <= config.target_max
      assert all(
        config.number_min <= n <= config.number_max
        for n in ex.metadata["numbers"]
      )

  def test_deterministic_from_seed(self):
    assert data.generate_countdown(
      10, "medium", seed=4
    ) == data.generate_countdown(10, "medium", seed=4)
    assert data.generate_countdown(
      10, "medium", seed=4
    ) != data.generate_countdown(10, "medium", seed=5)

  def test_question_states_the_rules(self):
    ex = data.generate_countdown(1, "easy", seed=0)[0]
    assert (
      str(ex.metadata["target"]) in ex.question
      and "at most once" in ex.question
    )

  def test_bad_config(self):
    with pytest.raises(ValueError, match="min_numbers_used"):
      data.CountdownConfig(num_numbers=3, min_numbers_used=4)
    with pytest.raises(ValueError, match="number_min"):
      data.CountdownConfig(number_min=0)
