"""Final-answer extraction from model completions.

Four answer formats are recognised, tried in this order (the first format
present wins; within a format the last occurrence wins):

1. ``<answer>...</answer>`` (the R1 template); a ``\\boxed{}`` inside the tag is
   unwrapped.
2. ``\\boxed{...}`` / ``\\fbox{...}`` with nested braces, or ``\\boxed 5``.
3. GSM8K ``#### x`` (rest of the line).
4. "The answer is x" / "Final answer: x" (rest of the sentence).

Explicit markers beat prose because a completion that boxes an answer and then
chats ("so the answer is five") meant the boxed one. Every function here is a
linear scan or a linear regex: a long or adversarial completion cannot make
extraction slow.
"""

from __future__ import annotations

import re

__all__ = [
  "extract_answer_phrase",
  "extract_answer_tag",
  "extract_boxed_all",
  "extract_final_answer",
  "extract_gsm8k",
  "extract_last_boxed",
  "extract_last_number",
  "strip_answer_decorations",
]

_BOXED_COMMANDS = ("\\boxed", "\\fbox")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_PHRASE = re.compile(
  r"(?:\bthe\s+)?(?:\bfinal\s+)?\banswer\s*(?:is\b\s*:?|:)[ \t]*([^\n]*)",
  re.IGNORECASE,
)
# A sentence ends at a period followed by white space or the end; "3.5." ends
# after the second period, not inside the number.
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
# Digit groups join across commas and the typographic spaces (NBSP, thin,
# narrow NBSP), which in running text are only ever thousands separators; not
# across ASCII spaces, which in prose separate numbers ("rolls 5 120 times").
_NUMBER = re.compile(
  r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:[\u00a0\u2009\u202f]\d{3})+|\d+)(?:\.\d+)?(?!\d)"
)
_BRACE_TOKENS = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])|\\.|[{}]", re.DOTALL)
# Longer "answers" are rejected before any further processing.
MAX_EXTRACTED_CHARS = 10_000
_MAX_UNWRAP = 4


def extract_boxed_all(text: str) -> list[str]:
  """Contents of every top-level ``\\boxed{}`` / ``\\fbox{}``, in order.

  Nested braces are matched (``\\{`` and ``\\}`` are literal braces, not
  grouping); a box inside a box is part of the outer content; an unclosed box
  is ignored. ``\\boxed 5`` (space form) yields the next token. One pass
  over the text, so unbalanced input cannot make it quadratic.
  """
  spans: list[tuple[int, int]] = []
  open_braces: list[
    int | None
  ] = []  # content start for a box's brace, else None
  box_brace_at = -1  # index of the "{" that opens the box just seen
  for token in _BRACE_TOKENS.finditer(text):
    kind = token.group()
    if kind.startswith(("\\boxed", "\\fbox")):
      after = token.end()
      j = after
      while j < len(text) and text[j] in " \t":
        j += 1
      if j < len(text) and text[j] == "{":
        box_brace_at = j
      elif j > after and j < len(text):
        end = j
        while end < len(text) and not text[end].isspace() and text[end] != "$":
          end += 1
        spans.append((j, end))
    elif kind == "{":
      open_braces.append(token.end() if token.start() == box_brace_at else None)
    elif kind == "}":
      if open_braces:
        content_start = open_braces.pop()
        if content_start is not None:
          spans.append((content_start, token.start()))
  spans.sort()
  found, covered_until = [], -1
  for start, stop in spans:
    if start > covered_until:  # not inside an earlier (outer) box
      found.append(text[start:stop])
      covered_until = stop
  return found


def extract_last_boxed(text: str) -> str | None:
  """Content of the last top-level ``\\boxed{}`` (boxes in boxes unwrapped)."""
  boxes = extract_boxed_all(text)
  if not boxes:
    return None
  content = boxes[-1]
  for _ in range(_MAX_UNWRAP):  # bounded: deep nesting must stay linear
    if not content.strip().startswith(_BOXED_COMMANDS):
      break
    inner = extract_boxed_all(content)
    if not inner:
      break
    content = inner[-1]
  return content.strip()


def extract_answer_tag(text: str) -> str | None:
  """Content of the last ``<answer>...</answer>``; a box inside is unwrapped."""
  close = text.rfind("</answer>")
  if close < 0:
    return None
  open_ = text.rfind("<answer>", 0, close)
  if open_ < 0:
    return None
  content = text[open_ + len("<answer>") : close]
  boxed = extract_last_boxed(content)
  return boxed if boxed is not None else content.strip()


def extract_gsm8k(text: str) -> str | None:
  """The rest of the line after the last ``####`` (GSM8K solutions)."""
  matches = _GSM8K.findall(text)
  if not matches:
    return None
  return matches[-1].strip()


def extract_answer_phrase(text: str) -> str | None:
  """The ``x`` of the last "The answer is x" / "Final answer: x" sentence."""
  matches = _ANSWER_PHRASE.findall(text)
  if not matches:
    return None
  rest = matches[-1]
  end = _SENTENCE_END.search(rest)
  if end is not None:
    rest = rest[: end.start()]
  boxed = extract_last_boxed(rest)
  return boxed if boxed is not None else rest.strip()


def strip_answer_decorations(answer: str) -> str:
  """Removes math delimiters, markdown emphasis and trailing punctuation.

  ``$12$.`` -> ``12``; ``**\\(x+1\\)**`` -> ``x+1``. Content is left as is;
  units and LaTeX are math-verify's business.
  """
  text = answer.strip()
  previous = None
  while text != previous:
    previous = text
    text = text.strip().rstrip(".").strip()
    for left, right in (
      ("**", "**"),
      ("$$", "$$"),
      ("$", "$"),
      ("\\(", "\\)"),
      ("\\[", "\\]"),
    ):
      if (
        len(text) >= len(left) + len(right)
        and text.startswith(left)
        and text.endswith(right)
      ):
        text = text[len(left) : len(text) - len(right)]
  return text.strip()


def extract_final_answer(text: str) -> str | None:
  """The completion's final answer, or None when no answer format is present.

  Formats in priority order: ``<answer>`` tag, last ``\\boxed{}``, ``####``,
  "The answer is". The result has delimiters (``$``, ``**``) and a trailing
  period removed; an empty answer is None.
  """
  for extractor in (
    extract_answer_tag,
    extract_last_boxed,
    extract_gsm8k,
    extract_answer_phrase,
  ):
    answer = extractor(text)
    if answer is not None:
      if len(answer) > MAX_EXTRACTED_CHARS:
        return None
      answer = strip_answer_decorations(answer)
      return answer or None
  return None


def extract_last_number(text: str) -> str | None:
  """The last number in the text ("... 7 - 5 = 2." -> "2"), for the lenient
  fallback of small models that answer without any answer format. Not one
  of the formats of ``extract_final_answer``: opt in where wanted."""
  last = None
  for last in _NUMBER.finditer(text):
    pass
  return None if last is None else last.group()
