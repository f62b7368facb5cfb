"""Modules stay small enough to read: every tracked Python file has at most
600 lines, and the `Trainer` class, the loop a newcomer reads first, at
most 250 (one screen). A file that grows past the limit is split by
concern, not trimmed of its comments.
"""

import ast
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_MODULE_LINES = 600
MAX_TRAINER_LINES = 250
TRAINER = ("rljax/train/loop.py", "Trainer")


def _python_files() -> list[str]:
  """The repository's tracked .py files (relative paths); every .py file
  outside hidden folders when this is not a git checkout."""
  try:
    out = subprocess.run(
      ["git", "ls-files", "-z", "--", "*.py"],
      cwd=ROOT,
      capture_output=True,
      check=True,
    ).stdout.decode()
    files = [f for f in out.split("\0") if f]
  except (OSError, subprocess.CalledProcessError):
    files = []
    for dirpath, dirnames, names in os.walk(ROOT):
      dirnames[:] = [d for d in dirnames if not d.startswith(".")]
      rel = os.path.relpath(dirpath, ROOT)
      files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    files = [f for f in files if f.endswith(".py")]
  # A file deleted in the work tree but still in the index is not a module.
  return sorted(f for f in files if os.path.isfile(os.path.join(ROOT, f)))


def _line_count(path: str) -> int:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return sum(1 for _ in f)


def test_the_file_list_is_the_repository():
  files = _python_files()
  assert "rljax/train/loop.py" in files and __file__.endswith(
    "test_module_size.py"
  )
  assert len(files) > 100, files


def test_every_python_file_is_at_most_600_lines():
  too_long = [
    f"{path}: {n} lines"
    for path in _python_files()
    if (n := _line_count(path)) > MAX_MODULE_LINES
  ]
  assert not too_long, (
    f"{len(too_long)} file(s) over {MAX_MODULE_LINES} lines; split each by "
    "concern:\n  " + "\n  ".join(too_long)
  )


def test_the_trainer_class_is_at_most_250_lines():
  path, name = TRAINER
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  (cls,) = [
    node
    for node in tree.body
    if isinstance(node, ast.ClassDef) and node.name == name
  ]
  first = min([cls.lineno] + [d.lineno for d in cls.decorator_list])
  n = cls.end_lineno - first + 1
  assert n <= MAX_TRAINER_LINES, (
    f"{path}: class {name} is {n} lines; expected <= {MAX_TRAINER_LINES} "
    "(move a cohesive group of its methods to a module of its own)"
  )
