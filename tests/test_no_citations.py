"""No tracked file cites a numbered work item, work log or session.

Code, tests and docs say what the code does and why; a pointer such as
"(issue N, item M)" or "the session-N table" names a work item a reader
outside the team cannot look up. A dated measurement carries its date,
commit and machine instead. `CITATION` is the one definition of such a
pointer; its hand-written cases below show what it catches and what it
leaves alone, and the scan applies it to

  * every line of every tracked text file (`git ls-files`), whatever its
    kind: Python, Markdown, JSON (a config's `_comment`, a benchmark
    record's "what"), shell, TOML, data;
  * every tracked path, so a file or folder named after a session
    (`rollout_s48.png`, `gpu_kit_s43.json`) is caught too.

Exempt, and why:

  * binary files (a NUL byte or not UTF-8: PNG figures, gzipped run
    records): they hold no prose; their names are still checked;
  * this file: its cases are citations on purpose.

Nothing else is. Archived run records (docs/qurl/runs/) and benchmark
JSON (docs/performance/) are data, but they are scanned like any file: a
description typed into a record (a benchmark's "what") is read as prose,
and a session tag in a recorded path or a file name is still a session
tag. The whole scan takes well under a second. third_party/vllm_ext is our
own code and is scanned too.

Legitimate prose the pattern leaves alone: "an issue with", "the first
item", "item 0" (a zero-based index in an error message: work items count
from 1), "questions 2 and 3" (the QuRL study's own questions), "step 3",
upstream URLs such as ".../issues/123", seed suffixes ("fp32_s0", one
digit, or "_s100", three) and XLA's integer types ("s32").
"""

import os
import re
import shutil
import subprocess

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_THIS_FILE = "tests/test_no_citations.py"

CITATION = re.compile(
  r"""
    \b(?:issue|session)s?[ -]?\#?\d+(?![A-Za-z_])
                                  # issue 47, issues 47 and 48, Issue #12,
                                  # issue-46, session-43
  | \b(?:stop|task)s?\ \#?\d+(?![A-Za-z_])
                                  # stop 27's, task 3 (not "stop-1")
  | \bwork[ -]?logs?\b            # a work log, worklogs
  | \bitems?\ [1-9]\d*\b          # item 7, items 21-22 (not "item 0")
  | \bdefects?\ \d+\b             # defect 6
  | \bdeliver(?:ables?)?\ \d+\b   # Deliver 4
  | (?<![\w\#&])\#\d+\b(?!-)       # (#14), see #13 (not "#2026-11-28-...",
                                  # a Markdown anchor of a dated heading)
  | (?-i:(?<![A-Za-z0-9])s(?!(?:16|32|64)(?![0-9]))\d{2}(?![A-Za-z0-9]))
                                  # s48, _s43.json, /tmp/s48/: a session tag
                                  # (two digits; a run's seed suffix such as
                                  # _s100 is not one)
  """,
  re.IGNORECASE | re.VERBOSE,
)

# Every CITATION match, lower-cased, holds one of these (the look-arounds
# and the exact spelling are CITATION's to check).
_PREFILTER = re.compile(
  r"issue|session|stop|task|work|item|defect|deliver|#\d|s\d\d"
)

CITES = [
  '"""In-flight weight updates of the continuous engine (issue 47, item 2)."""',
  "# The gate of experiments/qurl_report_lib/gates.py (issue 44).",
  "# a level or a knob spec (issue 17)",
  "Issue 43 items 21-22: a damaged checkpoint file",
  "see issues 47 and 48",
  "Issue #12",
  "issue-46 ratios",
  "the session-43 table",
  "Session 41: alternated on one machine",
  "sessions 41-43",
  "stop 27's cache",
  "task 3 of the plan",
  "the run's summary line reports it (item 8)",
  "(items 5 and 9)",
  "Issue 12, defect 6: the second group",
  "# ---- defect 7: overlong",
  "writes a run's outputs (Deliver 4)",
  "Issue 46's deliverable 1 asks",
  "as the work log says",
  "see worklog",
  "Multi-host (#14): every process runs the study",
  "docs/figures/rollout_rl_occupancy_s48.png",
  "docs/performance/gpu_kit_2026-11-27_h200_s43.json",
  '"out": "/tmp/s48/rl_workloads.json"',
  "runs/qurl_gpu_s44/qurl_gpu2",
  "measured in s45",
]

PROSE = [
  "an issue with the cache",
  "EngineCore encountered an issue.",
  "the first item of the list",
  'match="item 0: the gold continuation"',
  "f'item {i}: empty context'",
  "with per-item timeouts",
  "ItemTimeout",
  "questions 2 and 3 of the study",
  "Question 6 (H100, q6_acr_fair)",
  "steps 2-20",
  "the loop stops after round 2",
  "target[r, start - 1 : stop - 1] = 1.0",
  "x[start:stop-1]",
  "https://github.com/vllm-project/vllm/issues/12345",
  "docs/qurl/runs/q1_instrument/fp32_s0/metrics.jsonl",
  "int8_acr_s2",
  "int8_tis_c1.05_s100",
  "s32[4,8] dot(s8[4,16], s8[16,8])",
  "a session-scoped fixture",
  '@pytest.fixture(scope="session")',
  "tasks such as arithmetic",
  "sha 5f0f3b3c0717d44a63129adcb49534f58d27ca66",
  "- [2026-11-28: Rollouts](#2026-11-28-rollouts-shaped-like-rl): the table",
  "color #1f77b4",
  "measured 2026-11-27 on an AMX Xeon, commit 5f0f3b3",
]


@pytest.mark.parametrize("text", CITES)
def test_pattern_catches_citation(text):
  assert CITATION.search(text), text


@pytest.mark.parametrize("text", CITES)
def test_prefilter_keeps_every_citation(text):
  # The scan only looks at lines the pre-filter lets through.
  assert _PREFILTER.search(text.lower()), text


@pytest.mark.parametrize("text", PROSE)
def test_pattern_leaves_prose_alone(text):
  match = CITATION.search(text)
  assert match is None, (text, match)


def _tracked_files() -> list[str]:
  """The repository's tracked paths, or a skip when this is no git clone."""
  if shutil.which("git") is None:
    pytest.skip("git is not installed: no list of tracked files to scan")
  proc = subprocess.run(
    ["git", "-C", _ROOT, "ls-files", "-z"],
    capture_output=True,
    check=False,
  )
  if proc.returncode != 0:
    pytest.skip(
      f"{_ROOT} is not a git checkout: no list of tracked files to scan "
      f"({proc.stderr.decode(errors='replace').strip()})"
    )
  return [p for p in proc.stdout.decode().split("\0") if p]


def _text(root: str, path: str) -> str | None:
  """The file's text, or None for a binary file or one missing on disk."""
  try:
    with open(os.path.join(root, path), "rb") as f:
      data = f.read()
  except (FileNotFoundError, IsADirectoryError):
    return None  # deleted in the working tree, or a submodule
  if b"\0" in data:
    return None
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return None


def _cited_lines(text: str) -> list[tuple[int, str]]:
  """(line number, line) of each line of `text` that CITATION matches.

  Fast path: CITATION with its look-arounds and IGNORECASE costs seconds
  over the ~10 MB of tracked text, so a literal pre-filter on the
  lower-cased text finds the few candidate lines first (`lower` keeps every
  newline, so line k of the one is line k of the other)."""
  low = text.lower()
  lines, found = None, []
  line, pos, last = 0, 0, -1
  for m in _PREFILTER.finditer(low):
    line += low.count("\n", pos, m.start())
    pos = m.start()
    if line == last:
      continue
    last = line
    if lines is None:
      lines = text.split("\n")
    if CITATION.search(lines[line]):
      found.append((line + 1, lines[line]))
  return found


def citations(root: str, paths: list[str]) -> list[str]:
  """What cites a work item among `paths` (relative to `root`): a line
  `path: the file name ...` for each such path, `path:line: text` for each
  such line of a text file."""
  found = []
  for path in paths:
    if CITATION.search(path):
      found.append(f"{path}: the file name carries a citation")
    if path == _THIS_FILE:
      continue
    text = _text(root, path)
    if text is not None:
      found += [
        f"{path}:{n}: {line.strip()[:160]}" for n, line in _cited_lines(text)
      ]
  return found


def test_scan_names_each_offending_line(tmp_path):
  # The scan itself, on files made here: a cited line, a session-tagged
  # name, a binary file (not read), clean prose and a path gone from disk.
  (tmp_path / "a.py").write_text('x = 1\n"""Docs (issue 12)."""\n')
  (tmp_path / "b_s43.json").write_text('{"what": "clean"}\n')
  (tmp_path / "c.png").write_bytes(b"\x89PNG\0issue 12")
  (tmp_path / "d.md").write_text("an issue with the cache\n")
  paths = ["a.py", "b_s43.json", "c.png", "d.md", "gone.py"]
  assert citations(str(tmp_path), paths) == [
    'a.py:2: """Docs (issue 12)."""',
    "b_s43.json: the file name carries a citation",
  ]


def test_no_tracked_file_cites_a_work_item():
  found = citations(_ROOT, _tracked_files())
  assert not found, (
    f"{len(found)} citations of numbered work items, work logs or sessions "
    "(say what the code does and why; a measurement carries its date, "
    "commit and machine):\n" + "\n".join(found)
  )
