"""Exact checker for Countdown answers.

Countdown: reach ``target`` with the given ``numbers`` and ``+ - * /``, each
number used at most once (all of them with ``require_all``). The answer
expression is parsed with ``ast`` and evaluated by walking a whitelist of
node types (integer literals, the four binary operators, parentheses) in
exact rational arithmetic: nothing from the completion is ever executed.
Intermediate results may be fractions (``(1 + 1/2) * 4`` is allowed).
"""

from __future__ import annotations

import ast
import collections
import operator
import re
from fractions import Fraction
from typing import Sequence

from rljax.rewards import extraction

__all__ = [
  "MAX_EXPRESSION_CHARS",
  "CountdownError",
  "countdown_reward",
  "evaluate_countdown_expression",
  "normalize_countdown_expression",
]

MAX_EXPRESSION_CHARS = 200

_BINARY_OPERATORS = {
  ast.Add: operator.add,
  ast.Sub: operator.sub,
  ast.Mult: operator.mul,
  ast.Div: operator.truediv,
}
_SYMBOLS = (
  ("\\times", "*"),
  ("\u00d7", "*"),
  ("\\cdot", "*"),
  ("\u00b7", "*"),
  ("\u22c5", "*"),
  ("\\div", "/"),
  ("\u00f7", "/"),
  ("\u2212", "-"),
  ("\\left", ""),
  ("\\right", ""),
  ("[", "("),
  ("]", ")"),
  ("\\{", "("),
  ("\\}", ")"),
)
_OPERATOR_CHARS = re.compile(r"[-+*/]")


class CountdownError(ValueError):
  """An answer that is not a valid Countdown expression (the reason says why)."""


def normalize_countdown_expression(text: str) -> str:
  """Maps LaTeX/Unicode operators to ``+-*/`` and keeps the side of an
  equation that is the expression (``3*5+7 = 22`` -> ``3*5+7``)."""
  expression = extraction.strip_answer_decorations(text)
  for symbol, replacement in _SYMBOLS:
    expression = expression.replace(symbol, replacement)
  sides = [side.strip() for side in expression.split("=")]
  with_operator = [side for side in sides if _OPERATOR_CHARS.search(side)]
  return with_operator[0] if with_operator else sides[0]


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
  if isinstance(node, ast.Expression):
    return _evaluate(node.body, used)
  if isinstance(node, ast.Constant) and type(node.value) is int:
    used.append(node.value)
    return Fraction(node.value)
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
    left = _evaluate(node.left, used)
    right = _evaluate(node.right, used)
    if isinstance(node.op, ast.Div) and right == 0:
      raise CountdownError("division by zero")
    return _BINARY_OPERATORS[type(node.op)](left, right)
  raise CountdownError(
    f"{type(node).__name__} is not allowed; only integers, + - * / and parentheses"
  )


def evaluate_countdown_expression(
  expression: str, numbers: Sequence[int], *, require_all: bool = False
) -> Fraction:
  """Exact value of ``expression``, after checking it only uses ``numbers``.

  Raises:
    CountdownError: too long, not parseable, a disallowed construct, a number
      not available (or used more often than given), a number left unused
      under ``require_all``, or division by zero.
  """
  expression = normalize_countdown_expression(expression)
  if not expression:
    raise CountdownError("empty expression")
  if len(expression) > MAX_EXPRESSION_CHARS:
    raise CountdownError(
      f"expression has {len(expression)} characters; at most {MAX_EXPRESSION_CHARS}"
    )
  try:
    tree = ast.parse(expression, mode="eval")
  except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
    raise CountdownError(
      f"not an arithmetic expression: {expression!r}"
    ) from error
  used: list[int] = []
  value = _evaluate(tree, used)
  available = collections.Counter(int(n) for n in numbers)
  overused = collections.Counter(used) - available
  if overused:
    raise CountdownError(
      f"uses {sorted(overused.elements())} beyond the given numbers {sorted(available.elements())}"
    )
  if require_all and collections.Counter(used) != available:
    unused = sorted((available - collections.Counter(used)).elements())
    raise CountdownError(f"leaves {unused} unused")
  return value


def countdown_reward(
  completion: str,
  numbers: Sequence[int],
  target: int,
  *,
  require_all: bool = False,
) -> float:
  """1.0 if the completion's final answer (``extraction.extract_final_answer``)
  is an expression over ``numbers`` that equals ``target``, else 0.0."""
  try:
    answer = extraction.extract_final_answer(completion)
    if answer is None:
      return 0.0
    value = evaluate_countdown_expression(
      answer, numbers, require_all=require_all
    )
    return 1.0 if value == target else 0.0
  except (CountdownError, TypeError, ValueError):
    return 0.0
