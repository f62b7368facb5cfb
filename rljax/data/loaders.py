"""Loading JSONL / Parquet / in-memory rows into ``Example``s.

Every loader takes ``on_error``: "raise" (default) stops at the first bad row
with a ``DataError`` naming the file and line; "skip" drops bad rows and
counts them, by kind, in ``LoadedDataset.stats``. Nothing is downloaded:
paths are arguments.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Iterator, Literal, Mapping

from rljax.data.records import (
  Compose,
  DataError,
  Example,
  FieldMap,
  LoadedDataset,
  LoadStats,
  answer_text,
)

__all__ = ["from_records", "load_file", "load_hf", "load_jsonl", "load_parquet"]

OnError = Literal["raise", "skip"]
_MAX_LOGGED_ERRORS = 5


class _RowError(Exception):
  def __init__(self, kind: str, message: str):
    super().__init__(message)
    self.kind = kind


def _check_on_error(on_error: str) -> None:
  if on_error not in ("raise", "skip"):
    raise ValueError(f"on_error is {on_error!r}; expected 'raise' or 'skip'")


def _first_present(
  row: Mapping[str, Any], names: tuple[str, ...]
) -> tuple[str, Any] | None:
  for name in names:
    if name in row and row[name] is not None:
      return name, row[name]
  return None


_FINAL_PUNCTUATION = re.compile(r"[.?!:;][\"')\]]*$")


def _composed_question(
  row: Mapping[str, Any], compose: Compose, fields: str
) -> tuple[str, str]:
  """(label, text) of a question joined from several fields."""
  parts = []
  for part in compose.fields:
    names = compose.candidates(part)
    found = _first_present(row, names)
    value = None if found is None else found[1]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      value = str(value)
    if not isinstance(value, str) or not value.strip():
      problem = "missing" if value is None else "empty or not a string"
      raise _RowError(
        "missing_field",
        f"question part {'/'.join(names)!r} of {compose} is {problem} "
        f"(fields: {fields})",
      )
    parts.append(value.strip())
  if compose.sentences:
    parts = [
      p if i == len(parts) - 1 or _FINAL_PUNCTUATION.search(p) else p + "."
      for i, p in enumerate(parts)
    ]
  return str(compose), compose.sep.join(parts)


def _row_to_example(
  row: Any, field_map: FieldMap, source: str, index: int
) -> Example:
  if not isinstance(row, Mapping):
    raise _RowError(
      "not_object", f"row is a JSON {type(row).__name__}, expected an object"
    )
  fields = ", ".join(sorted(map(str, row))) or "none"
  if isinstance(field_map.question, Compose):
    question = _composed_question(row, field_map.question, fields)
    question_fields = field_map.question.names()
  else:
    question = _first_present(row, field_map.candidates("question"))
    if question is None:
      raise _RowError(
        "missing_field",
        f"no question field {'/'.join(field_map.candidates('question'))} (fields: {fields})",
      )
    if not isinstance(question[1], str) or not question[1].strip():
      raise _RowError(
        "missing_field",
        f"question field {question[0]!r} is empty or not a string",
      )
    question_fields = {question[0]}
  answer = _first_present(row, field_map.candidates("answer"))
  if answer is None:
    raise _RowError(
      "missing_field",
      f"no answer field {'/'.join(field_map.candidates('answer'))} (fields: {fields})",
    )
  value = answer[1]
  if field_map.answer_extractor is not None:
    try:
      value = field_map.answer_extractor(value)
    except Exception as error:
      raise _RowError(
        "bad_answer", f"answer extractor failed on field {answer[0]!r}: {error}"
      ) from error
  text = answer_text(value)
  if text is None:
    raise _RowError(
      "bad_answer",
      f"no answer could be read from field {answer[0]!r} (value {str(answer[1])[:80]!r})",
    )
  # A field that needed an extractor (a worked solution) stays in metadata.
  used = (
    question_fields
    if field_map.answer_extractor is not None
    else question_fields | {answer[0]}
  )
  kept = (
    field_map.extra_fields
    if field_map.extra_fields is not None
    else [k for k in row if k not in used]
  )
  metadata = {k: row[k] for k in kept if k in row}
  metadata.update(verifier=field_map.verifier, source=source)
  return Example(
    question=question[1],
    answer=text,
    metadata=metadata,
    uid=f"{source}:{index}",
  )


def _build(
  rows: Iterable[tuple[str, Any]],
  field_map: FieldMap,
  source: str,
  name: str,
  on_error: OnError,
) -> LoadedDataset:
  """rows: (location, row-or-_RowError) pairs; location reads "file:line"."""
  _check_on_error(on_error)
  examples: list[Example] = []
  reasons: dict[str, int] = {}
  messages: list[str] = []
  count = 0
  for location, row in rows:
    count += 1
    try:
      if isinstance(row, _RowError):
        raise row
      examples.append(_row_to_example(row, field_map, name, count - 1))
    except _RowError as error:
      message = f"{location}: {error}"
      if on_error == "raise":
        raise DataError(message) from None
      reasons[error.kind] = reasons.get(error.kind, 0) + 1
      if len(messages) < _MAX_LOGGED_ERRORS:
        messages.append(message)
  if count == 0:
    if on_error == "raise":
      raise DataError(f"{source}: no rows (the file is empty)")
    reasons["empty_file"] = 1
    messages.append(f"{source}: no rows (the file is empty)")
  skipped = count - len(examples)
  stats = LoadStats(
    source, count, len(examples), skipped, reasons, tuple(messages)
  )
  return LoadedDataset(tuple(examples), stats)


def _jsonl_rows(path: str) -> Iterator[tuple[str, Any]]:
  with open(path, "rb") as handle:
    for line_number, raw in enumerate(handle, start=1):
      location = f"{path}:{line_number}"
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as error:
        yield (
          location,
          _RowError(
            "not_utf8",
            f"not valid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1})",
          ),
        )
        continue
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as error:
        row = _RowError(
          "invalid_json", f"invalid JSON ({error.msg} at column {error.colno})"
        )
      except RecursionError:  # a value nested deeper than Python's stack
        row = _RowError("invalid_json", "invalid JSON (nested too deeply)")
      yield location, row


def _dataset_name(path: str, name: str | None) -> str:
  if name:
    return name
  parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
  stem = os.path.splitext(os.path.basename(path))[0]
  return f"{parent}/{stem}" if parent else stem


def load_jsonl(
  path: str | os.PathLike,
  field_map: FieldMap,
  *,
  on_error: OnError = "raise",
  name: str | None = None,
) -> LoadedDataset:
  """Examples from a JSON-lines file (one object per line; blank lines ignored).

  Args:
    path: the file.
    field_map: which fields hold the question and answer.
    on_error: "raise" or "skip" (see module doc).
    name: ``metadata["source"]`` and uid prefix (default: "dir/stem").
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"load_jsonl: no file at {path!r}")
  return _build(
    _jsonl_rows(path), field_map, path, _dataset_name(path, name), on_error
  )


def load_parquet(
  path: str | os.PathLike,
  field_map: FieldMap,
  *,
  on_error: OnError = "raise",
  name: str | None = None,
) -> LoadedDataset:
  """Examples from a Parquet file (needs ``pyarrow``, or ``pandas`` with a
  Parquet engine). Locations in errors read ``file:row N`` (1-based)."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"load_parquet: no file at {path!r}")
  try:
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
  except ImportError:
    try:
      import pandas as pd
    except ImportError as error:
      raise ImportError(
        "load_parquet needs pyarrow (pip install pyarrow) or pandas with a Parquet engine"
      ) from error
    rows = pd.read_parquet(path).to_dict(orient="records")
  located = ((f"{path}:row {i}", row) for i, row in enumerate(rows, start=1))
  return _build(located, field_map, path, _dataset_name(path, name), on_error)


def from_records(
  records: Iterable[Mapping[str, Any]],
  field_map: FieldMap,
  *,
  name: str,
  on_error: OnError = "raise",
) -> LoadedDataset:
  """Examples from in-memory rows (a list of dicts, a Hugging Face
  ``datasets.Dataset``, ...); errors are located as ``name:row N``."""
  located = ((f"{name}:row {i}", row) for i, row in enumerate(records, start=1))
  return _build(located, field_map, name, name, on_error)


def load_hf(
  path: str,
  field_map: FieldMap,
  *,
  split: str = "train",
  on_error: OnError = "raise",
  **kwargs: Any,
) -> LoadedDataset:
  """Examples from ``datasets.load_dataset(path, split=split, **kwargs)``.

  Only if the ``datasets`` package is installed (it is not a dependency);
  offline, ``path`` must be a local directory or cached dataset.
  """
  try:
    import datasets
  except ImportError as error:
    raise ImportError(
      "load_hf needs the 'datasets' package; or load the files with load_jsonl/load_parquet"
    ) from error
  rows = datasets.load_dataset(path, split=split, **kwargs)
  return from_records(
    rows, field_map, name=f"{path}/{split}", on_error=on_error
  )


def load_file(
  path: str | os.PathLike,
  field_map: FieldMap,
  *,
  on_error: OnError = "raise",
  name: str | None = None,
) -> LoadedDataset:
  """``load_jsonl`` or ``load_parquet`` by the file's extension."""
  suffix = os.fspath(path).lower()
  if suffix.endswith((".jsonl", ".ndjson")):
    return load_jsonl(path, field_map, on_error=on_error, name=name)
  if suffix.endswith((".parquet", ".pq")):
    return load_parquet(path, field_map, on_error=on_error, name=name)
  raise ValueError(
    f"load_file: cannot tell the format of {os.fspath(path)!r}; expected .jsonl or .parquet"
  )
