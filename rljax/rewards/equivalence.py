"""Is an extracted answer mathematically equal to the ground truth?

Two stages. ``plain_numbers_equal`` is an exact fast path for plain numbers
(``1,000``, ``-3``, ``$18.00``), which is what GSM8K and the generated tasks
produce. Everything else goes to ``symbolic_equal``, which hands the LaTeX to
math-verify (fractions, radicals, pi, sets, intervals, percentages, units in
``\\text{}``) with its own timeouts off: the caller bounds time by running it
in an ``IsolatedWorker`` (see math_verifier.py).

Decisions (math-verify's rules where it has one):
- ``50\\%`` equals both ``50`` and ``0.5``: datasets write percentages either
  way, so the scale of a percent answer is not held against the model.
- Decimals equal fractions after rounding to 6 places (``0.3333333`` = 1/3,
  ``0.333`` != 1/3).
- Numbers spelled in words ("twelve") are not numbers: never equal.
- Units are ignored: ``10\\text{ cm}``, ``5 dollars``, ``90^\\circ``,
  ``9 apples``, ``9 (apples)`` equal the bare number. A trailing word is a
  unit only if it cannot change the value: ``2 pi``, ``5 x``, ``3 squared``,
  ``20 percent`` and ``3 or more`` are not plain numbers (math-verify decides),
  and ``3 million`` is 3,000,000.
- Thousands separators are read as a person reads them: ``,``, an ASCII space,
  NBSP (U+00A0), thin space (U+2009), narrow NBSP (U+202F) and LaTeX ``\\,``
  all group digits, so ``3 600`` = ``3\u2009600`` = ``3,600.00`` = ``$3,600``
  = 3600. Only well-formed groups count (1-3 leading digits, then groups of
  exactly 3), one separator kind per number: ``1 2``, ``12 34`` and
  ``1 2 3`` are lists, not numbers, and never equal ``12``/``1234``/``123``.
"""

from __future__ import annotations

import functools
import logging

from rljax.data.numbers import parse_plain_number

__all__ = [
  "MAX_ANSWER_CHARS",
  "warm_up",
  "parse_plain_number",
  "plain_numbers_equal",
  "symbolic_equal",
]

# Longer "answers" are not answers; bounding them also bounds parse time.
MAX_ANSWER_CHARS = 1000


def plain_numbers_equal(pred: str, gold: str) -> bool | None:
  """True/False when both are plain numbers and that decides it, else None.

  Exact equality is decisive; inequality is decisive only between integer
  literals (two decimals may still agree to math-verify's 6 places).
  """
  parsed_pred = parse_plain_number(pred)
  parsed_gold = parse_plain_number(gold)
  if parsed_pred is None or parsed_gold is None:
    return None
  (pred_value, pred_is_int), (gold_value, gold_is_int) = (
    parsed_pred,
    parsed_gold,
  )
  if pred_value == gold_value:
    return True
  if pred_is_int and gold_is_int:
    return False
  return None


class _DropTimeoutDisabledWarning(logging.Filter):
  """math-verify warns once that its timeouts are off; ours are on."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Timeout is disabled")


@functools.cache
def _math_verify():
  import math_verify  # imported lazily: it pulls in sympy (about 1 s)

  for name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
  return math_verify


@functools.lru_cache(maxsize=4096)
def _parse(answer: str):
  math_verify = _math_verify()
  # Wrapping in \boxed makes math-verify take the whole string as the answer
  # instead of searching it for one.
  parsed = math_verify.parse("\\boxed{" + answer + "}", parsing_timeout=None)
  if not parsed:
    parsed = math_verify.parse(answer, parsing_timeout=None)
  return tuple(parsed)


def symbolic_equal(pred: str, gold: str) -> bool:
  """math-verify's verdict on two extracted answers (no time limit here).

  May be slow on adversarial input; call it through ``IsolatedWorker``
  unless you already run inside one.
  """
  if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
    return False
  parsed_gold = _parse(gold)
  parsed_pred = _parse(pred)
  if not parsed_gold or not parsed_pred:
    return False
  return bool(
    _math_verify().verify(
      list(parsed_gold), list(parsed_pred), timeout_seconds=None
    )
  )


def warm_up() -> None:
  """Imports math-verify and builds its parsers (a few seconds, once per
  process), so that a worker's first item is not charged for it."""
  _parse.cache_clear()
  symbolic_equal("\\frac{1}{2}", "0.5")
  _parse.cache_clear()
