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
- Units are ignored: ``10\\text{ cm}``, ``5 dollars``, ``90^\\circ`` equal the
  bare number.
"""
from __future__ import annotations

import functools
import logging
import re
from fractions import Fraction

__all__ = [
    "MAX_ANSWER_CHARS",
    "warm_up",
    "parse_plain_number",
    "plain_numbers_equal",
    "symbolic_equal",
]

# Longer "answers" are not answers; bounding them also bounds parse time.
MAX_ANSWER_CHARS = 1000

_PLAIN_NUMBER = re.compile(r"^([+-]?)(\d{1,3}(?:,\d{3})+|\d+)?(?:\.(\d+))?$")
_DOLLAR_PREFIX = re.compile(r"^(?:\\\$|\$)\s*")
_UNIT_WORD_SUFFIX = re.compile(r"\s+(?:dollars?|cents?|units?)$", re.IGNORECASE)


def parse_plain_number(text: str) -> tuple[Fraction, bool] | None:
    """(value, is_integer_literal) for a plain number, else None.

    Accepts a sign, thousands separators, a decimal part, a leading ``$`` and a
    trailing "dollars"; ``1,\\!000`` and the Unicode minus are normalised.
    """
    s = text.strip().replace("\u2212", "-").replace("\\!", "").replace("{,}", ",")
    s = _DOLLAR_PREFIX.sub("", s)
    s = _UNIT_WORD_SUFFIX.sub("", s).strip()
    if not s or len(s) > 64:
        return None
    match = _PLAIN_NUMBER.match(s)
    if match is None:
        return None
    sign, integer_part, fraction_part = match.groups()
    if integer_part is None and fraction_part is None:
        return None
    value = Fraction(int((integer_part or "0").replace(",", "")))
    if fraction_part:
        value += Fraction(int(fraction_part), 10 ** len(fraction_part))
    if sign == "-":
        value = -value
    return value, fraction_part is None


def plain_numbers_equal(pred: str, gold: str) -> bool | None:
    """True/False when both are plain numbers and that decides it, else None.

    Exact equality is decisive; inequality is decisive only between integer
    literals (two decimals may still agree to math-verify's 6 places).
    """
    parsed_pred = parse_plain_number(pred)
    parsed_gold = parse_plain_number(gold)
    if parsed_pred is None or parsed_gold is None:
        return None
    (pred_value, pred_is_int), (gold_value, gold_is_int) = parsed_pred, parsed_gold
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
    return bool(_math_verify().verify(list(parsed_gold), list(parsed_pred), timeout_seconds=None))


def warm_up() -> None:
    """Imports math-verify and builds its parsers (a few seconds, once per
    process), so that a worker's first item is not charged for it."""
    _parse.cache_clear()
    symbolic_equal("\\frac{1}{2}", "0.5")
    _parse.cache_clear()
