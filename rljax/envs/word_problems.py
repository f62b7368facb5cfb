"""A generated task where a Python program beats mental arithmetic.

``generate_tool_word_problems(n, seed, level)`` writes multi-step word
problems whose answer takes a loop, not one expression: a balance after
years of interest rounded down each year, the sum of the primes below N,
numbers up to N divisible by a or b but not c, a recurrence modulo M, the
digit sum of a power, a stock shipped and restocked day by day. A 135M
model does not carry dozens of exact steps in its head; a ten-line
program does. Each ``Example`` carries ``metadata["code"]``, a program that
prints the answer (the demonstrations of ``experiments/tool_sft.py``); the
answers are computed here independently of that text (a test runs the
programs and compares). The verifier is ``score_answer``, as for
``generate_tool_arithmetic``.

``level``: "easy", "medium" or "hard" scales the sizes (years, bounds,
steps), not the kinds.
"""

from __future__ import annotations

import random
from typing import Callable

from rljax.core import _validation as v
from rljax.data.records import Example

__all__ = ["WORD_PROBLEM_LEVELS", "generate_tool_word_problems"]

# level -> the scale of every size drawn.
WORD_PROBLEM_LEVELS = {"easy": 1, "medium": 2, "hard": 4}


def _interest(rng: random.Random, scale: int) -> tuple[str, int, str]:
  start, rate = rng.randint(1_000, 90_000), rng.randint(2, 12)
  years = rng.randint(5, 8) * scale
  balance = start
  for _ in range(years):
    balance += balance * rate // 100
  question = (
    f"A savings account holds {start} dollars and earns {rate}% interest "
    "once a year; each year's interest is rounded down to a whole dollar. "
    f"How many dollars does it hold after {years} years?"
  )
  code = (
    f"balance = {start}\nfor _ in range({years}):\n"
    f"    balance += balance * {rate} // 100\nprint(balance)"
  )
  return question, balance, code


def _primes(rng: random.Random, scale: int) -> tuple[str, int, str]:
  bound = rng.randint(200, 2_000) * scale
  sieve = [True] * bound
  total = 0
  for k in range(2, bound):
    if sieve[k]:
      total += k
      sieve[k * k :: k] = [False] * len(range(k * k, bound, k))
  question = f"What is the sum of all prime numbers below {bound}?"
  code = (
    f"n = {bound}\nprint(sum(k for k in range(2, n)\n"
    "          if all(k % d for d in range(2, int(k ** 0.5) + 1))))"
  )
  return question, total, code


def _divisible(rng: random.Random, scale: int) -> tuple[str, int, str]:
  bound = rng.randint(1_000, 9_000) * scale
  a, b, c = rng.sample(range(3, 14), 3)
  count = sum(
    1 for k in range(1, bound + 1) if (k % a == 0 or k % b == 0) and k % c != 0
  )
  question = (
    f"How many whole numbers from 1 to {bound} are divisible by {a} or by "
    f"{b}, but not by {c}?"
  )
  code = (
    f"print(sum(1 for k in range(1, {bound} + 1)\n"
    f"          if (k % {a} == 0 or k % {b} == 0) and k % {c} != 0))"
  )
  return question, count, code


def _recurrence(rng: random.Random, scale: int) -> tuple[str, int, str]:
  x, m, d = rng.randint(2, 99), rng.randint(3, 19), rng.randint(1, 50)
  modulus, steps = rng.randint(100, 999), rng.randint(6, 12) * scale
  value = x
  for _ in range(steps):
    value = (value * m - d) % modulus
  question = (
    f"A number starts at {x}. At each step it is multiplied by {m}, then "
    f"{d} is subtracted, and the remainder of the result divided by "
    f"{modulus} is kept. What is the number after {steps} steps?"
  )
  code = (
    f"x = {x}\nfor _ in range({steps}):\n"
    f"    x = (x * {m} - {d}) % {modulus}\nprint(x)"
  )
  return question, value, code


def _digit_sum(rng: random.Random, scale: int) -> tuple[str, int, str]:
  base, power = rng.randint(3, 99), rng.randint(15, 40) * scale
  total = sum(int(c) for c in str(base**power))
  question = (
    f"What is the sum of the digits of {base} raised to the power {power}?"
  )
  code = f"print(sum(int(c) for c in str({base} ** {power})))"
  return question, total, code


def _stock(rng: random.Random, scale: int) -> tuple[str, int, str]:
  boxes, ship = rng.randint(500, 20_000), rng.randint(5, 30)
  restock, days = rng.randint(10, 400), rng.randint(5, 10) * scale
  held = boxes
  for _ in range(days):
    held = held - held * ship // 100 + restock
  question = (
    f"A warehouse holds {boxes} boxes. Each day it ships {ship}% of the "
    f"boxes it holds (rounded down to whole boxes) and then receives "
    f"{restock} new boxes. How many boxes does it hold after {days} days?"
  )
  code = (
    f"boxes = {boxes}\nfor _ in range({days}):\n"
    f"    boxes = boxes - boxes * {ship} // 100 + {restock}\nprint(boxes)"
  )
  return question, held, code


_KINDS: dict[str, Callable[[random.Random, int], tuple[str, int, str]]] = {
  "interest": _interest,
  "primes": _primes,
  "divisible": _divisible,
  "recurrence": _recurrence,
  "digit_sum": _digit_sum,
  "stock": _stock,
}


def generate_tool_word_problems(
  n: int, seed: int, level: str = "easy"
) -> list[Example]:
  """``n`` problems, the kinds in turn from a seeded shuffle; metadata:
  ``verifier`` "math", ``source``, ``kind`` and ``code``."""
  if isinstance(n, bool) or not isinstance(n, int) or n < 0:
    raise ValueError(v.field_message("n", n, "an int >= 0"))
  if level not in WORD_PROBLEM_LEVELS:
    raise ValueError(
      v.field_message("level", level, f"one of {sorted(WORD_PROBLEM_LEVELS)}")
    )
  rng = random.Random(f"tool_word_problems:{seed}:{level}")
  kinds = sorted(_KINDS)
  out = []
  for i in range(n):
    kind = rng.choice(kinds)
    question, answer, code = _KINDS[kind](rng, WORD_PROBLEM_LEVELS[level])
    out.append(
      Example(
        question=question,
        answer=str(answer),
        metadata={
          "verifier": "math",
          "source": "tool_word_problems",
          "kind": kind,
          "code": code,
        },
        uid=f"tool_word_problems:{seed}:{i}",
      )
    )
  return out
