"""The archived study runs in the repository stay lean: a run's metrics and
its per-problem held-out records are stored gzip-compressed (rljax.train
.metrics.read_metrics and rljax.study.read_eval_records read both forms;
experiments/qurl_report.sh archives new studies that way)."""

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHIVE = "docs/qurl/runs"


def _archived_files():
  try:
    out = subprocess.run(
      ["git", "ls-files", "--", ARCHIVE],
      capture_output=True,
      text=True,
      cwd=ROOT,
      check=True,
    ).stdout.split()
  except (OSError, subprocess.CalledProcessError):  # not a git checkout
    out = [
      os.path.relpath(os.path.join(d, f), ROOT)
      for d, _, files in os.walk(os.path.join(ROOT, ARCHIVE))
      for f in files
    ]
  return out


def test_run_records_are_stored_compressed():
  files = _archived_files()
  assert files, f"no archived runs under {ARCHIVE}"
  raw = [
    f
    for f in files
    if os.path.basename(f).startswith(("metrics", "eval_step"))
    and f.endswith(".jsonl")
  ]
  assert not raw, (
    f"{len(raw)} uncompressed run records (gzip them; the readers take"
    " .jsonl.gz):\n" + "\n".join(raw[:20])
  )
