"""A generated task that needs a calculator: long arithmetic.

``generate_tool_arithmetic(n, seed)`` writes problems such as "What is
48213 × 7391 − 120934 + 55120?": 2 to 4 operations on 4- to 6-digit operands
(+, −, ×), so the exact answer has up to ~20 digits, which a small model
gets wrong by heart and right with the calculator. No download; the same
seed gives the same problems. The answer is a non-negative integer,
exact (Python ints).

``score_answer`` is the verifier: 1.0 when the completion's final answer
(``\\boxed{}``, ``<answer>``, "The answer is", or ``####``; thousands
separators allowed) equals the answer as a number, else 0.0. It grades the
answer only, never the path, so a correct answer copied from a tool output
counts (using the tool is the point).
"""

from __future__ import annotations

import dataclasses
import random

from rljax.core import _validation as v
from rljax.data.extraction import extract_final_answer
from rljax.data.numbers import parse_plain_number
from rljax.data.records import Example

__all__ = [
  "ToolArithmeticConfig",
  "generate_tool_arithmetic",
  "score_answer",
]

_SYMBOLS = {"+": "+", "-": "\u2212", "*": "\u00d7"}


@dataclasses.dataclass(frozen=True)
class ToolArithmeticConfig:
  """Knobs of the generator.

  Attributes:
    min_steps, max_steps: operations per problem, drawn uniformly (1 <=
      min_steps <= max_steps <= 8).
    min_digits, max_digits: digits of each operand, drawn uniformly per
      operand (1 <= min_digits <= max_digits <= 9).
    operators: a non-empty subset of "+", "-", "*".
  """

  min_steps: int = 2
  max_steps: int = 4
  min_digits: int = 4
  max_digits: int = 6
  operators: tuple[str, ...] = ("+", "-", "*")

  def __post_init__(self):
    name = "ToolArithmeticConfig"
    v.check_field(
      name, "min_steps", self.min_steps, v.all_of(v.is_int, v.in_range(1, 8))
    )
    v.check_field(
      name,
      "max_steps",
      self.max_steps,
      v.all_of(
        v.is_int,
        v.expect(
          v.in_range(self.min_steps, 8),
          f"an int in [min_steps={self.min_steps}, 8]",
        ),
      ),
    )
    v.check_field(
      name, "min_digits", self.min_digits, v.all_of(v.is_int, v.in_range(1, 9))
    )
    v.check_field(
      name,
      "max_digits",
      self.max_digits,
      v.all_of(
        v.is_int,
        v.expect(
          v.in_range(self.min_digits, 9),
          f"an int in [min_digits={self.min_digits}, 9]",
        ),
      ),
    )
    ops = self.operators
    if (
      not isinstance(ops, tuple)
      or not ops
      or any(o not in _SYMBOLS for o in ops)
    ):
      raise ValueError(
        v.field_message(
          f"{name}.operators", ops, "a non-empty tuple of '+', '-', '*'"
        )
      )


def _operand(rng: random.Random, config: ToolArithmeticConfig) -> int:
  digits = rng.randint(config.min_digits, config.max_digits)
  return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _problem(
  rng: random.Random, config: ToolArithmeticConfig
) -> tuple[str, int]:
  while True:
    text, answer = _draw(rng, config)
    if answer >= 0:  # a product after a subtraction can outgrow the rest
      return text, answer


def _draw(rng: random.Random, config: ToolArithmeticConfig) -> tuple[str, int]:
  """One expression and its value, with the usual precedence (a product
  binds its neighbours), so the text means what it says."""
  steps = rng.randint(config.min_steps, config.max_steps)
  terms = [[_operand(rng, config)]]  # sums of products: [[a, b], [c], ...]
  signs = [1]
  text = str(terms[0][0])
  for _ in range(steps):
    op = rng.choice(config.operators)
    x = _operand(rng, config)
    if op == "*":
      terms[-1].append(x)
    else:
      value = sum(s * _product(t) for s, t in zip(signs, terms))
      if op == "-" and x > value:  # keep the running sum >= 0
        op = "+"
      terms.append([x])
      signs.append(1 if op == "+" else -1)
    text += f" {_SYMBOLS[op]} {x}"
  return text, sum(s * _product(t) for s, t in zip(signs, terms))


def _product(factors: list[int]) -> int:
  out = 1
  for f in factors:
    out *= f
  return out


def generate_tool_arithmetic(
  n: int, seed: int, config: ToolArithmeticConfig = ToolArithmeticConfig()
) -> list[Example]:
  """``n`` problems; metadata carries the expression and ``verifier``
  "math" (the exact answer is a plain integer, so ``math_reward`` also
  grades it)."""
  if isinstance(n, bool) or not isinstance(n, int) or n < 0:
    raise ValueError(v.field_message("n", n, "an int >= 0"))
  rng = random.Random(f"tool_arithmetic:{seed}")
  out = []
  for i in range(n):
    expression, answer = _problem(rng, config)
    out.append(
      Example(
        question=f"What is {expression}?",
        answer=str(answer),
        metadata={
          "verifier": "math",
          "source": "tool_arithmetic",
          "expression": expression,
        },
        uid=f"tool_arithmetic:{seed}:{i}",
      )
    )
  return out


def score_answer(completion: str, answer: str) -> float:
  """1.0 when the completion's final answer equals ``answer`` as a number
  (or, for a non-number, as stripped text), else 0.0."""
  final = extract_final_answer(completion)
  if final is None:
    return 0.0
  got, want = parse_plain_number(final), parse_plain_number(answer)
  if got is not None and want is not None:
    return float(got[0] == want[0])
  return float(final.strip() == answer.strip())
