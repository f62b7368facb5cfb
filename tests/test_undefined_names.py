"""No name is used that nothing defines.

`ruff check` leaves F821 off (`pyproject.toml`): jaxtyping's shape strings
such as `Float[Array, "B T"]` read to it as undefined names `B` and `T`.
This test runs F821 and keeps the names it finds in code, not inside a
string literal: a module split that leaves a helper behind in its old home
(a `NameError` only on the path that calls it) fails here, not in a run.
"""

import json
import os
import subprocess
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _inside_string(line: str, column: int) -> bool:
  """Whether 0-based `column` of `line` lies inside a '...' or "..." literal
  (shape strings are one-line; escaped quotes do not occur in them)."""
  quote = None
  for ch in line[:column]:
    if quote is None and ch in "\"'":
      quote = ch
    elif ch == quote:
      quote = None
  return quote is not None


def undefined_names(paths: list[str]) -> list[str]:
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "ruff",
      "check",
      "--select",
      "F821",
      "--output-format",
      "json",
      "--no-cache",
      *paths,
    ],
    cwd=_ROOT,
    capture_output=True,
    text=True,
  )
  if proc.returncode not in (0, 1):
    pytest.skip(f"ruff did not run: {proc.stderr.strip()[:200]}")
  found = []
  for item in json.loads(proc.stdout or "[]"):
    path, row, col = (
      item["filename"],
      item["location"]["row"],
      item["location"]["column"],
    )
    with open(path, encoding="utf-8") as f:
      line = f.read().splitlines()[row - 1]
    if not _inside_string(line, col - 1):
      found.append(f"{os.path.relpath(path, _ROOT)}:{row}: {item['message']}")
  return found


def test_inside_string_by_hand():
  assert _inside_string('x: Float[Array, "B T"]', 17)
  assert not _inside_string('x: Float[Array, "B T"] = helper()', 25)
  assert not _inside_string("return Collected(batch=b)", 7)


def test_an_undefined_helper_in_code_is_found(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("def f(x: \"Float[Array, 'B']\"):\n  return _moved_away(x)\n")
  found = undefined_names([str(bad)])
  assert len(found) == 1 and "_moved_away" in found[0], found


def test_no_undefined_names_in_code():
  found = undefined_names(["rljax", "experiments", "tests"])
  assert not found, "names used but never defined:\n" + "\n".join(found)
