"""Field maps of the usual math RL datasets, so loading one is one line.

    ds = load_dataset("gsm8k", "/data/gsm8k/test.jsonl")

A new dataset is a ``FieldMap`` (see records.py) plus ``load_file``; a
question spread over several fields is a ``Compose``:

    SVAMP = FieldMap(question=Compose("Body", "Question"), answer="Answer",
                     answer_extractor=number_answer)
    ds = load_file("/data/svamp/test.jsonl", SVAMP)
"""

from __future__ import annotations

import os
import re
from typing import Any

from rljax.data import extraction
from rljax.data.loaders import OnError, load_file
from rljax.data.records import Compose, FieldMap, LoadedDataset
from rljax.data.numbers import parse_plain_number

__all__ = [
  "AIME24",
  "AMC23",
  "ASDIV",
  "DATASET_SPECS",
  "DEEPSCALER",
  "GSM8K",
  "MATH500",
  "MINERVA_MATH",
  "OLYMPIADBENCH",
  "SVAMP",
  "gsm8k_final_answer",
  "last_boxed_answer",
  "load_dataset",
  "number_answer",
]

_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def gsm8k_final_answer(solution: Any) -> str | None:
  """The text after ``####`` in a GSM8K solution, thousands separators removed."""
  if not isinstance(solution, str):
    return None
  answer = extraction.extract_gsm8k(solution)
  if answer and _THOUSANDS.match(answer):
    answer = answer.replace(",", "")
  return answer or None


def last_boxed_answer(solution: Any) -> str | None:
  """The last ``\\boxed{}`` of a worked solution (MATH / Minerva style)."""
  if not isinstance(solution, str):
    return None
  return extraction.extract_last_boxed(solution)


def number_answer(value: Any) -> str | None:
  """A numeric ground truth written with a unit or separators as the bare
  number: ``"9 (apples)"`` -> "9", ``"1,200 dollars"`` -> "1200", ``3.0`` ->
  "3". Text that is not a number with a unit (``"2/3"``, ``"x+1"``) is kept
  as written, for the symbolic verifier; None when empty."""
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    value = str(value)
  if not isinstance(value, str) or not value.strip():
    return None
  parsed = parse_plain_number(value)
  if parsed is None:
    return value.strip()
  number = parsed[0]  # a Fraction with a power-of-ten denominator
  return (
    str(number.numerator) if number.denominator == 1 else str(float(number))
  )


GSM8K = FieldMap(
  question="question", answer="answer", answer_extractor=gsm8k_final_answer
)
MATH500 = FieldMap(question="problem", answer="answer")
AIME24 = FieldMap(question=("problem", "question"), answer="answer")
AMC23 = FieldMap(question=("problem", "question"), answer="answer")
MINERVA_MATH = FieldMap(
  question="problem", answer="solution", answer_extractor=last_boxed_answer
)
# OlympiadBench exports differ: "problem"/"answer", or "question"/"final_answer" (a list).
OLYMPIADBENCH = FieldMap(
  question=("problem", "question"), answer=("answer", "final_answer")
)
DEEPSCALER = FieldMap(question="problem", answer="answer")
# Questions in two fields: the story ("Body") and the ask ("Question"),
# joined as sentences (a third of SVAMP's bodies end without a full stop).
SVAMP = FieldMap(
  question=Compose("Body", "Question", sentences=True),
  answer="Answer",
  answer_extractor=number_answer,
)
# ASDiv as distributed in JSON Lines writes its fields in lower case
# ("body", "question", "answer": "9 (apples)"); the capitalised names of the
# XML release are read too.
ASDIV = FieldMap(
  question=Compose(("body", "Body"), ("question", "Question"), sentences=True),
  answer=("answer", "Answer"),
  answer_extractor=number_answer,
)

DATASET_SPECS: dict[str, FieldMap] = {
  "gsm8k": GSM8K,
  "math500": MATH500,
  "aime24": AIME24,
  "amc23": AMC23,
  "minerva_math": MINERVA_MATH,
  "olympiadbench": OLYMPIADBENCH,
  "deepscaler": DEEPSCALER,
  "svamp": SVAMP,
  "asdiv": ASDIV,
}


def load_dataset(
  name: str, path: str | os.PathLike, *, on_error: OnError = "raise"
) -> LoadedDataset:
  """A built-in dataset (``DATASET_SPECS`` key) from a local .jsonl/.parquet file."""
  if name not in DATASET_SPECS:
    raise ValueError(
      f"load_dataset: unknown dataset {name!r}; expected one of {sorted(DATASET_SPECS)}"
    )
  stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
  return load_file(
    path, DATASET_SPECS[name], on_error=on_error, name=f"{name}/{stem}"
  )
