"""What a dataset row becomes: ``Example``, and how fields map to it: ``FieldMap``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping, Sequence, Union, overload

__all__ = [
  "Compose",
  "DataError",
  "Example",
  "FieldMap",
  "LoadStats",
  "LoadedDataset",
  "answer_text",
]


class DataError(ValueError):
  """A bad input file or row; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Example:
  """One verifiable problem.

  Attributes:
    question: the problem text, without any prompt template.
    answer: the ground-truth final answer as a string ("72", "\\frac{1}{2}").
    metadata: ``verifier`` ("math" or "countdown", for
      ``rewards.correctness_reward``), ``source``, task data (countdown
      ``numbers``/``target``) and the row's other fields.
    uid: a stable identifier, ``source:index``.
  """

  question: str
  answer: str
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  uid: str = ""


@dataclasses.dataclass(frozen=True)
class Compose:
  """A question written across several fields, joined in order.

  ``Compose("Body", "Question")`` turns SVAMP's ``{"Body": "Jack had 8
  pens.", "Question": "How many pens does he have now?"}`` into "Jack had 8
  pens. How many pens does he have now?". Every field must be present and a
  non-empty string (or a number); a row lacking one is a "missing_field"
  error that names it. A part may be a tuple of candidate names, the first
  present taken (``("body", "Body")``: exports differ in case).

  Attributes:
    fields: the field names (or candidate tuples), in reading order.
    sep: put between the stripped field values.
    sentences: end every part but the last with a full stop when it has
      no final punctuation. SVAMP's Body is a clause without one in about a
      third of the problems ("... If there is a discount of 25 dollars on
      each pack" + "How much do you have to pay?"); joined as is, the
      question is a run-on sentence.
  """

  fields: tuple[str | tuple[str, ...], ...]
  sep: str = " "
  sentences: bool = False

  def __init__(
    self, *fields: str | tuple[str, ...], sep: str = " ", sentences=False
  ):
    def ok(f):
      if isinstance(f, tuple):
        return bool(f) and all(isinstance(n, str) and n for n in f)
      return isinstance(f, str) and bool(f)

    if not fields or not all(ok(f) for f in fields):
      raise ValueError(
        f"Compose fields={fields!r}; expected one or more field names "
        "(or tuples of candidate names)"
      )
    object.__setattr__(self, "fields", tuple(fields))
    object.__setattr__(self, "sep", sep)
    object.__setattr__(self, "sentences", bool(sentences))

  def candidates(self, part: str | tuple[str, ...]) -> tuple[str, ...]:
    """The names one part may have, in order."""
    return (part,) if isinstance(part, str) else tuple(part)

  def names(self) -> set[str]:
    """Every field name a part may be read from."""
    return {n for part in self.fields for n in self.candidates(part)}

  def __str__(self) -> str:
    return "+".join("/".join(self.candidates(f)) for f in self.fields)


FieldNames = Union[str, Sequence[str]]


@dataclasses.dataclass(frozen=True)
class FieldMap:
  """How a file's rows map onto ``Example``.

  Attributes:
    question: the question field, or candidates tried in order, or a
      ``Compose`` of several fields joined into one question.
    answer: the answer field, or candidates tried in order.
    answer_extractor: applied to the answer field's value (e.g. the text
      after ``####``, the last ``\\boxed{}`` of a solution); returns None
      when there is no answer.
    verifier: written to ``metadata["verifier"]``.
    extra_fields: row fields copied into metadata; None copies all others.
  """

  question: FieldNames | Compose
  answer: FieldNames
  answer_extractor: Callable[[Any], str | None] | None = None
  verifier: str = "math"
  extra_fields: tuple[str, ...] | None = None

  def candidates(self, role: str) -> tuple[str, ...]:
    names = getattr(self, role)
    if isinstance(names, Compose):
      raise TypeError(
        f"FieldMap.{role} is {names!r}: a composition, not candidates"
      )
    return (names,) if isinstance(names, str) else tuple(names)


def _nonfinite_number(text: str) -> bool:
  """ "NaN", "inf", "-Infinity", "1e999": a number no answer can equal."""
  try:
    return not math.isfinite(float(text))
  except ValueError:
    return False


def answer_text(value: Any) -> str | None:
  """A ground-truth value as a string: ``27.0`` -> "27", ``["3"]`` -> "3",
  ``[1, 2]`` -> "1, 2"; None for empty or non-scalar values, and for a
  non-finite number ("#### NaN": no completion could be graded right)."""
  if value is None or isinstance(value, bool):
    return None
  if isinstance(value, str):
    text = value.strip()
    return text if text and not _nonfinite_number(text) else None
  if isinstance(value, int):
    return str(value)
  if isinstance(value, float):
    if not math.isfinite(value):
      return None
    return str(int(value)) if value.is_integer() else repr(value)
  if isinstance(value, (list, tuple)):
    parts = [answer_text(v) for v in value]
    if not parts or any(p is None for p in parts):
      return None
    return ", ".join(parts)
  return None


@dataclasses.dataclass(frozen=True)
class LoadStats:
  """What happened while loading one source.

  Attributes:
    source: file path (or a name for in-memory records).
    rows: non-blank rows read.
    loaded: examples produced.
    skipped: rows skipped (``on_error="skip"``).
    skip_reasons: kind -> count ("invalid_json", "not_utf8", "missing_field",
      "bad_answer", "not_object", "empty_file").
    first_errors: the first few skip messages, for the log.
  """

  source: str
  rows: int
  loaded: int
  skipped: int
  skip_reasons: dict[str, int]
  first_errors: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class LoadedDataset(Sequence[Example]):
  """Examples plus the ``LoadStats`` of the load."""

  examples: tuple[Example, ...]
  stats: LoadStats

  def __len__(self) -> int:
    return len(self.examples)

  @overload
  def __getitem__(self, index: int) -> Example: ...
  @overload
  def __getitem__(self, index: slice) -> tuple[Example, ...]: ...
  def __getitem__(self, index):
    return self.examples[index]

  def __iter__(self) -> Iterator[Example]:
    return iter(self.examples)
