"""Generated Countdown problems: reach a target from given numbers.

Rules (checked by ``rewards.countdown_reward``): ``+ - * /`` and parentheses,
each given number used at most once, exact arithmetic. Every generated
problem is solvable by construction: the target is the value of a random
expression over a random subset of the numbers (integer intermediate steps,
so a person could do it), and a target equal to a given number is rejected
(it would need no arithmetic). Same seed, same problems.

Levels (``COUNTDOWN_LEVELS``):
  easy    3 numbers in 1..10, target 1..30
  medium  4 numbers in 1..25, target 10..100
  hard    5 numbers in 1..50, target 50..500, at least 3 numbers used
"""

from __future__ import annotations

import dataclasses
import random
from fractions import Fraction
from typing import Sequence

from rljax.data.records import Example

__all__ = [
  "COUNTDOWN_LEVELS",
  "CountdownConfig",
  "countdown_question",
  "generate_countdown",
  "solve_countdown",
]

_MAX_ATTEMPTS = 10_000


@dataclasses.dataclass(frozen=True)
class CountdownConfig:
  """Knobs of the generator.

  Attributes:
    num_numbers: how many numbers are given.
    number_min, number_max: their range.
    target_min, target_max: the target's range.
    min_numbers_used: the generating expression uses at least this many.
  """

  num_numbers: int = 3
  number_min: int = 1
  number_max: int = 10
  target_min: int = 1
  target_max: int = 30
  min_numbers_used: int = 2

  def __post_init__(self):
    if not 2 <= self.num_numbers <= 8:
      raise ValueError(
        f"CountdownConfig.num_numbers is {self.num_numbers}; expected 2..8"
      )
    if not 1 <= self.number_min <= self.number_max:
      raise ValueError(
        f"CountdownConfig: number_min={self.number_min}, number_max={self.number_max}; "
        "expected 1 <= number_min <= number_max"
      )
    if not self.target_min <= self.target_max:
      raise ValueError(
        f"CountdownConfig: target_min={self.target_min} > target_max={self.target_max}"
      )
    if not 2 <= self.min_numbers_used <= self.num_numbers:
      raise ValueError(
        f"CountdownConfig.min_numbers_used is {self.min_numbers_used}; expected 2..num_numbers ({self.num_numbers})"
      )


COUNTDOWN_LEVELS: dict[str, CountdownConfig] = {
  "easy": CountdownConfig(
    num_numbers=3, number_min=1, number_max=10, target_min=1, target_max=30
  ),
  "medium": CountdownConfig(
    num_numbers=4, number_min=1, number_max=25, target_min=10, target_max=100
  ),
  "hard": CountdownConfig(
    num_numbers=5,
    number_min=1,
    number_max=50,
    target_min=50,
    target_max=500,
    min_numbers_used=3,
  ),
}


def countdown_question(numbers: Sequence[int], target: int) -> str:
  listed = ", ".join(str(n) for n in numbers)
  return (
    f"Using the numbers {listed}, write an arithmetic expression that equals {target}. "
    "You may use +, -, * and / and parentheses, and each number at most once."
  )


def _strip_outer_parentheses(expression: str) -> str:
  if not (expression.startswith("(") and expression.endswith(")")):
    return expression
  depth = 0
  for i, char in enumerate(expression):
    depth += char == "("
    depth -= char == ")"
    if depth == 0 and i < len(expression) - 1:
      return expression  # "(a) + (b)": the outer pair is not one group
  return expression[1:-1]


def solve_countdown(numbers: Sequence[int], target: int) -> str | None:
  """An expression over ``numbers`` (each at most once) equal to ``target``,
  or None if there is none. Exhaustive search over exact rationals: combine
  any two values with each operator and recurse, remembering multisets of
  values already known to fail."""
  goal = Fraction(target)
  for n in numbers:
    if n == goal:
      return str(n)
  failed: set[tuple[Fraction, ...]] = set()

  def search(items: list[tuple[Fraction, str]]) -> str | None:
    key = tuple(sorted(value for value, _ in items))
    if len(items) < 2 or key in failed:
      return None
    for i in range(len(items)):
      for j in range(len(items)):
        if i == j:
          continue
        (a, left), (b, right) = items[i], items[j]
        rest = [items[k] for k in range(len(items)) if k != i and k != j]
        options = [(a - b, "-")]
        if i < j:  # + and * commute: one order is enough
          options += [(a + b, "+"), (a * b, "*")]
        if b != 0:
          options.append((a / b, "/"))
        for value, op in options:
          expression = f"({left} {op} {right})"
          if value == goal:
            return expression
          found = search(rest + [(value, expression)])
          if found is not None:
            return found
    failed.add(key)
    return None

  found = search([(Fraction(n), str(n)) for n in numbers])
  return None if found is None else _strip_outer_parentheses(found)


def _random_expression(
  rng: random.Random, numbers: Sequence[int]
) -> tuple[int, str]:
  """Combines ``numbers`` in random order with integer-valued steps."""
  items = [(n, str(n)) for n in numbers]
  while len(items) > 1:
    i, j = rng.sample(range(len(items)), 2)
    (a, left), (b, right) = items[i], items[j]
    ops = ["+", "*"]
    if a != b:
      ops.append("-")
    if b > 1 and a % b == 0:
      ops.append("/")
    op = rng.choice(ops)
    if op == "-" and a < b:
      (a, left), (b, right) = (b, right), (a, left)
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a // max(b, 1)}[op]
    items = [items[k] for k in range(len(items)) if k not in (i, j)] + [
      (value, f"({left} {op} {right})")
    ]
  value, expression = items[0]
  return value, _strip_outer_parentheses(expression)


def generate_countdown(
  num_examples: int, config: CountdownConfig | str = "easy", *, seed: int
) -> list[Example]:
  """``num_examples`` solvable problems from ``config`` (or a level name).

  Each ``Example`` has ``answer`` = str(target) and ``metadata`` {verifier:
  "countdown", task: "countdown", numbers, target, solution}.
  """
  if isinstance(config, str):
    if config not in COUNTDOWN_LEVELS:
      raise ValueError(
        f"generate_countdown: unknown level {config!r}; expected one of {sorted(COUNTDOWN_LEVELS)}"
      )
    config = COUNTDOWN_LEVELS[config]
  if (
    isinstance(num_examples, bool)
    or not isinstance(num_examples, int)
    or num_examples < 0
  ):
    raise ValueError(
      f"generate_countdown: num_examples is {num_examples!r}; expected an int >= 0"
    )
  rng = random.Random(f"rljax-countdown:{seed}")
  examples = []
  for index in range(num_examples):
    for _ in range(_MAX_ATTEMPTS):
      numbers = [
        rng.randint(config.number_min, config.number_max)
        for _ in range(config.num_numbers)
      ]
      used = rng.sample(
        numbers, rng.randint(config.min_numbers_used, config.num_numbers)
      )
      target, solution = _random_expression(rng, used)
      if (
        config.target_min <= target <= config.target_max
        and target not in numbers
      ):
        break
    else:
      raise ValueError(
        f"CountdownConfig {config} produced no target in range after {_MAX_ATTEMPTS} tries"
      )
    metadata = {
      "verifier": "countdown",
      "task": "countdown",
      "source": "countdown",
      "numbers": numbers,
      "target": target,
      "solution": solution,
    }
    question = countdown_question(numbers, target)
    examples.append(
      Example(question, str(target), metadata, uid=f"countdown-{seed}:{index}")
    )
  return examples
