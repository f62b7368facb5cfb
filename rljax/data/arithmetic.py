"""Generated multi-step arithmetic problems with exact integer answers.

Needs no download, so the default experiment runs anywhere. Difficulty knobs:
number of operations, operand range, operator set; ``style`` picks a bare
expression ("What is 7 + 5?") or a short word problem. Every intermediate
result is a non-negative integer (unless ``allow_negative``), division is
exact, and the answer is checked by ``rewards.math_reward`` (plain-number
fast path). Same seed, same problems.

Levels (``ARITHMETIC_LEVELS``), meant for a small model trained from a low
but non-zero start on "easy":
  easy    one operation, operands 1..10, + -          ("What is 7 + 5?")
  medium  two operations, operands 1..20, + -         ("What is 12 + 5 - 9?")
  hard    three operations, operands 1..50, + - x
  expert  four operations, operands 1..100, + - x /

Between and beyond the levels, a difficulty *spec* sets the knobs directly
(``parse_difficulty``): a level name optionally followed by ``_key=value``
overrides, or overrides alone on top of "easy", e.g. ``"steps=2_digits=2"``
(two operations on two-digit operands) or ``"medium_max=99"``. Keys: steps
(operations), digits (operands with exactly that many digits), min / max
(operand range), ops (operator characters, e.g. ``+-*``), mult (largest
multiplier), style (expression|word), neg (0|1). Underscores, not commas,
separate the overrides so that a spec fits a ``--grid`` axis and a
directory name.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

from rljax.data.records import Example

__all__ = [
  "ARITHMETIC_LEVELS",
  "ArithmeticConfig",
  "evaluate_steps",
  "generate_arithmetic",
  "parse_difficulty",
  "render_expression",
]

_OPERATORS = ("+", "-", "*", "/")
_SYMBOLS = {"+": "+", "-": "-", "*": "\u00d7", "/": "\u00f7"}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_NAMES = (
  "Ava",
  "Ben",
  "Chloe",
  "Dan",
  "Emma",
  "Finn",
  "Grace",
  "Hugo",
  "Iris",
  "Jack",
  "Lena",
  "Omar",
)
_ITEMS = (
  "apples",
  "marbles",
  "stickers",
  "books",
  "coins",
  "pencils",
  "cookies",
  "stamps",
)
_WORD_STEPS = {
  "+": (
    "{name} buys {n} more {items}.",
    "{name} finds {n} more {items}.",
    "A friend gives {name} {n} more {items}.",
  ),
  "-": (
    "{name} gives away {n} {items}.",
    "{name} loses {n} {items}.",
    "{name} uses {n} {items}.",
  ),
  "*": ("Then the number of {items} {name} has becomes {n} times as large.",),
  "/": (
    "{name} splits the {items} into {n} equal groups and keeps one group.",
  ),
}
_MAX_ATTEMPTS = 1000


@dataclasses.dataclass(frozen=True)
class ArithmeticConfig:
  """Knobs of the generator.

  Attributes:
    num_steps: operations per problem (>= 1).
    operand_min, operand_max: range of the start value and of + - operands.
    operators: subset of "+", "-", "*", "/".
    max_multiplier: the largest operand of * and / (keeps numbers readable).
    style: "expression" or "word".
    allow_negative: let subtraction go below zero.
  """

  num_steps: int = 1
  operand_min: int = 1
  operand_max: int = 10
  operators: tuple[str, ...] = ("+", "-")
  max_multiplier: int = 12
  style: str = "expression"
  allow_negative: bool = False

  def __post_init__(self):
    if (
      isinstance(self.num_steps, bool)
      or not isinstance(self.num_steps, int)
      or self.num_steps < 1
    ):
      raise ValueError(
        f"ArithmeticConfig.num_steps is {self.num_steps!r}; expected an int >= 1"
      )
    if not 0 <= self.operand_min <= self.operand_max:
      raise ValueError(
        f"ArithmeticConfig: operand_min={self.operand_min}, operand_max={self.operand_max}; "
        "expected 0 <= operand_min <= operand_max"
      )
    bad = [op for op in self.operators if op not in _OPERATORS]
    if not self.operators or bad:
      raise ValueError(
        f"ArithmeticConfig.operators is {self.operators!r}; expected a non-empty subset of {_OPERATORS}"
      )
    if self.max_multiplier < 2:
      raise ValueError(
        f"ArithmeticConfig.max_multiplier is {self.max_multiplier}; expected >= 2"
      )
    if self.style not in ("expression", "word"):
      raise ValueError(
        f"ArithmeticConfig.style is {self.style!r}; expected 'expression' or 'word'"
      )


ARITHMETIC_LEVELS: dict[str, ArithmeticConfig] = {
  "easy": ArithmeticConfig(
    num_steps=1, operand_min=1, operand_max=10, operators=("+", "-")
  ),
  "medium": ArithmeticConfig(
    num_steps=2, operand_min=1, operand_max=20, operators=("+", "-")
  ),
  "hard": ArithmeticConfig(
    num_steps=3, operand_min=1, operand_max=50, operators=("+", "-", "*")
  ),
  "expert": ArithmeticConfig(
    num_steps=4, operand_min=1, operand_max=100, operators=("+", "-", "*", "/")
  ),
}


_SPEC_KEYS = ("steps", "digits", "min", "max", "ops", "mult", "style", "neg")


def parse_difficulty(spec: str) -> ArithmeticConfig:
  """The ``ArithmeticConfig`` of a level name or a difficulty spec.

  ``"hard"`` -> ARITHMETIC_LEVELS["hard"]; ``"steps=2_digits=2_ops=+-"`` ->
  "easy" with two operations and operands 10..99; ``"medium_max=99"`` ->
  "medium" with operands up to 99. Later keys win over earlier ones
  (``digits`` sets both ``min`` and ``max``).
  """
  if not isinstance(spec, str) or not spec:
    raise ValueError(
      f"arithmetic difficulty {spec!r}: expected a level {sorted(ARITHMETIC_LEVELS)} or a spec"
    )
  if spec in ARITHMETIC_LEVELS:
    return ARITHMETIC_LEVELS[spec]
  parts = spec.split("_")
  base = ARITHMETIC_LEVELS["easy"]
  if parts[0] in ARITHMETIC_LEVELS:
    base, parts = ARITHMETIC_LEVELS[parts[0]], parts[1:]
  if parts and "=" not in parts[0]:
    raise ValueError(
      f"generate_arithmetic: unknown level {parts[0]!r} in {spec!r}; expected one of "
      f"{sorted(ARITHMETIC_LEVELS)}, optionally followed by _KEY=VALUE overrides (KEY in {_SPEC_KEYS})"
    )
  changes: dict = {}
  for part in parts:
    key, sep, value = part.partition("=")
    if not sep or key not in _SPEC_KEYS or not value:
      raise ValueError(
        f"arithmetic difficulty {spec!r}: {part!r} is not KEY=VALUE with KEY one of {_SPEC_KEYS} "
        f"(or a level {sorted(ARITHMETIC_LEVELS)} first)"
      )
    try:
      if key == "steps":
        changes["num_steps"] = int(value)
      elif key == "digits":
        digits = int(value)
        if digits < 1:
          raise ValueError
        changes["operand_min"] = 10 ** (digits - 1) if digits > 1 else 1
        changes["operand_max"] = 10**digits - 1
      elif key in ("min", "max"):
        changes[f"operand_{key}"] = int(value)
      elif key == "ops":
        changes["operators"] = tuple(value)
      elif key == "mult":
        changes["max_multiplier"] = int(value)
      elif key == "style":
        changes["style"] = value
      else:
        if value not in ("0", "1"):
          raise ValueError
        changes["allow_negative"] = value == "1"
    except ValueError:
      raise ValueError(
        f"arithmetic difficulty {spec!r}: {key}={value!r} is not a valid value"
      ) from None
  return dataclasses.replace(base, **changes)


def evaluate_steps(start: int, steps: Sequence[tuple[str, int]]) -> int:
  """Left-to-right value of ``start op1 n1 op2 n2 ...`` (exact; / must divide)."""
  value = start
  for op, operand in steps:
    if op == "+":
      value += operand
    elif op == "-":
      value -= operand
    elif op == "*":
      value *= operand
    elif op == "/":
      if operand == 0 or value % operand:
        raise ValueError(
          f"{value} / {operand} is not an exact integer division"
        )
      value //= operand
    else:
      raise ValueError(f"unknown operator {op!r}")
  return value


def render_expression(start: int, steps: Sequence[tuple[str, int]]) -> str:
  """The left-to-right computation as an expression that means the same
  under the usual precedence: ``(3 + 4) × 2``, ``12 - 5 - 3``."""
  text, precedence = str(start), 3
  for op, operand in steps:
    if precedence < _PRECEDENCE[op]:
      text = f"({text})"
    text = f"{text} {_SYMBOLS[op]} {operand}"
    precedence = _PRECEDENCE[op]
  return text


def _next_step(
  rng: random.Random, value: int, config: ArithmeticConfig
) -> tuple[str, int] | None:
  op = rng.choice(config.operators)
  low, high = config.operand_min, config.operand_max
  if op == "+":
    return op, rng.randint(low, high)
  if op == "-":
    if config.allow_negative:
      return op, rng.randint(low, high)
    if value < low:
      return None
    return op, rng.randint(low, min(high, value))
  multipliers = range(max(2, low), min(high, config.max_multiplier) + 1)
  if not multipliers:
    return None
  if op == "*":
    return op, rng.choice(multipliers)
  divisors = [d for d in multipliers if value and value % d == 0]
  return (op, rng.choice(divisors)) if divisors else None


def _sample(
  rng: random.Random, config: ArithmeticConfig
) -> tuple[int, list[tuple[str, int]]]:
  for _ in range(_MAX_ATTEMPTS):
    start = rng.randint(config.operand_min, config.operand_max)
    value, steps = start, []
    while len(steps) < config.num_steps:
      for _ in range(_MAX_ATTEMPTS):
        step = _next_step(rng, value, config)
        if step is not None:
          break
      else:
        break
      steps.append(step)
      value = evaluate_steps(value, [step])
    if len(steps) == config.num_steps:
      return start, steps
  raise ValueError(
    f"ArithmeticConfig {config} admits no problem (e.g. only '/' with no exact divisions)"
  )


def _word_problem(
  rng: random.Random, start: int, steps: Sequence[tuple[str, int]]
) -> str:
  name, items = rng.choice(_NAMES), rng.choice(_ITEMS)
  sentences = [f"{name} has {start} {items}."]
  for op, operand in steps:
    sentences.append(
      rng.choice(_WORD_STEPS[op]).format(name=name, n=operand, items=items)
    )
  sentences.append(f"How many {items} does {name} have now?")
  return " ".join(sentences)


def generate_arithmetic(
  num_examples: int, config: ArithmeticConfig | str = "easy", *, seed: int
) -> list[Example]:
  """``num_examples`` problems drawn from ``config`` (or a level name or
  difficulty spec, ``parse_difficulty``).

  Each ``Example`` has the integer answer as ``answer`` and ``metadata``
  {verifier: "math", task: "arithmetic", start, steps, expression}.
  """
  if isinstance(config, str):
    config = parse_difficulty(config)
  if (
    isinstance(num_examples, bool)
    or not isinstance(num_examples, int)
    or num_examples < 0
  ):
    raise ValueError(
      f"generate_arithmetic: num_examples is {num_examples!r}; expected an int >= 0"
    )
  rng = random.Random(f"rljax-arithmetic:{seed}")
  examples = []
  for index in range(num_examples):
    start, steps = _sample(rng, config)
    expression = render_expression(start, steps)
    if config.style == "word":
      question = _word_problem(rng, start, steps)
    else:
      question = f"What is {expression}?"
    metadata = {
      "verifier": "math",
      "task": "arithmetic",
      "source": "arithmetic",
      "start": start,
      "steps": [list(step) for step in steps],
      "expression": expression,
    }
    answer = str(evaluate_steps(start, steps))
    examples.append(
      Example(question, answer, metadata, uid=f"arithmetic-{seed}:{index}")
    )
  return examples
