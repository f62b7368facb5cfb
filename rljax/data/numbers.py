"""Plain numbers in answer text: "1,200", "$3.50", "9 (apples)", "2 million".

Shared by dataset answer normalisation (`data.specs`) and the verifiers
(`rewards.equivalence`); data sits below rewards, so it lives here.
"""

from __future__ import annotations

import re
from fractions import Fraction

_PLAIN_NUMBER = re.compile(
  r"^([+-]?)(\d{1,3}(?:,\d{3})+|\d{1,3}(?: \d{3})+|\d+)?(?:\.(\d+))?$"
)
_CURRENCY_PREFIX = re.compile(r"^(?:\\\$|[$\u20ac\u00a3\u00a5])\s*")
# Space-like digit-group separators (only between two digits): ASCII space,
# NBSP, thin space, narrow NBSP, and LaTeX's \, and "\ " spacing commands.
_SPACE_SEPARATOR = re.compile(r"(?<=\d)(?:[ \u00a0\u2009\u202f]|\\,|\\ )(?=\d)")
# A trailing unit: words after a space ("9 apples", "3 600 dollars"), or any
# words in parentheses ("9 (apples)"), optionally ending in a period.
_UNIT_SUFFIX = re.compile(
  r"(?:\s+([A-Za-z][A-Za-z'/-]*(?:\s+[A-Za-z][A-Za-z'/-]*)*)|\s*\(\s*([A-Za-z][A-Za-z'/ -]*?)\s*\))\.?$"
)
# Units written against the number ("10cm", "5kg", "9th").
_ATTACHED_UNIT = re.compile(
  r"(?<=\d)(?:cm|mm|km|m|kg|mg|g|lbs?|oz|ml|hrs?|h|min|s|st|nd|rd|th)$"
)
# Trailing words that change the value or make it an expression: never units.
_NOT_UNITS = frozenset(
  {
    "pi",
    "e",
    "i",
    "sqrt",
    "inf",
    "infinity",
    "squared",
    "cubed",
    "percent",
    "and",
    "or",
    "to",
    "than",
    "more",
    "less",
    "plus",
    "minus",
    "times",
    "divided",
    "over",
    "by",
    "hundred",
    "hundreds",
    "thousands",
    "millions",
    "billions",
    "dozen",
    "dozens",
    "half",
    "halves",
    "thirds",
    "quarter",
    "quarters",
    "degrees",
    "radians",
    "not",
    "no",
    "none",
  }
)
_MULTIPLIERS = {
  "thousand": 10**3,
  "million": 10**6,
  "billion": 10**9,
  "trillion": 10**12,
}


def _strip_unit(s: str) -> tuple[str, int] | None:
  """(number part, multiplier) of ``s`` with a trailing unit removed; None
  when the trailing words are not a unit (they may change the value)."""
  match = _UNIT_SUFFIX.search(s)
  if match is None:
    return _ATTACHED_UNIT.sub("", s), 1
  words = (match.group(1) or match.group(2)).lower().split()
  multiplier = 1
  if match.group(1) and words[0] in _MULTIPLIERS:
    multiplier, words = _MULTIPLIERS[words[0]], words[1:]
  if any(w in _NOT_UNITS or len(w) < 2 for w in words):
    return None
  return s[: match.start()].rstrip(), multiplier


def parse_plain_number(text: str) -> tuple[Fraction, bool] | None:
  """(value, is_integer_literal) for a plain number, else None.

  Accepts a sign, thousands separators (comma or space-like, see the module
  docstring), a decimal part, a leading currency sign and a trailing unit
  ("dollars", "(apples)", "million"); ``1,\\!000`` and the Unicode minus are
  normalised.
  """
  s = text.strip().replace("\u2212", "-").replace("\\!", "").replace("{,}", ",")
  if len(s) > 128:
    return None
  s = _CURRENCY_PREFIX.sub("", s)
  stripped = _strip_unit(s)
  if stripped is None:
    return None
  s, multiplier = stripped
  s = _SPACE_SEPARATOR.sub(" ", s)
  if not s or len(s) > 64:
    return None
  match = _PLAIN_NUMBER.match(s)
  if match is None:
    return None
  sign, integer_part, fraction_part = match.groups()
  if integer_part is None and fraction_part is None:
    return None
  value = Fraction(int(re.sub("[, ]", "", integer_part or "0")))
  if fraction_part:
    value += Fraction(int(fraction_part), 10 ** len(fraction_part))
  value *= multiplier
  if sign == "-":
    value = -value
  return value, fraction_part is None
