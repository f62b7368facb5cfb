"""experiments/bench_sync.py runs end to end (a tiny model, two syncs) and
writes every phase of every sync, and the change fraction of the second."""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.slow  # a whole script run
def test_bench_sync_tiny(tmp_path):
  out = tmp_path / "sync.json"
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "bench_sync.py"),
      "--model=tiny",
      "--syncs=2",
      "--step_size=1e-2",
      f"--out={out}",
    ],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "| diagnostics |" in proc.stdout
  result = json.loads(out.read_text())
  assert result["quant"] == "int8" and result["machine"]
  assert result["host_huge_pages"].startswith(("on (", "off ("))
  assert len(result["syncs"]) == 2
  for row in result["syncs"]:
    assert all(row[p] >= 0.0 for p in ("quantize", "diagnostics", "push"))
  # No previous sync to compare with at the first; a 1% move flips codes.
  assert math.isnan(result["syncs"][0]["quantized_change_fraction"])
  assert 0.0 < result["syncs"][1]["quantized_change_fraction"] < 1.0
