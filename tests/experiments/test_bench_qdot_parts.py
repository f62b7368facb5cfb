"""experiments/bench_qdot_parts.py times every part of a W8A8 qdot and
rejects a malformed shape by name."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "bench_qdot_parts.py")


def _run(*args):
  return subprocess.run(
    [sys.executable, SCRIPT, *args],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=ROOT,
  )


def test_times_every_part(tmp_path):
  out = tmp_path / "parts.json"
  proc = _run("--shapes=8x16x32", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  row = json.loads(out.read_text())["8x16x32"]
  assert set(row) == {
    "int8_dot_in_out",
    "int8_dot_out_in",
    "quantize_acts",
    "qdot_int8",
    "bf16_dot",
    "f32_dot",
  }
  assert all(us > 0 for us in row.values())


def test_bad_shape_is_named():
  proc = _run("--shapes=12x3")
  assert proc.returncode != 0
  assert "'12x3' is not MxKxN" in proc.stderr + proc.stdout
