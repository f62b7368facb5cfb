"""experiments/fusion_ab_cpu.py: both samplers timed, alternated, one JSON line."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.slow  # a whole script run
def test_times_both_sides_each_round():
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "fusion_ab_cpu.py"),
      "--quant=int8",
      "--random_init",
      "--model=smollm2-135m",
      "--prompts=2",
      "--samples=2",
      "--new_tokens=3",
      "--prompt_len=8",
      "--rounds=2",
    ],
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  result = json.loads(lines[-1])
  assert result["quant"] == "int8" and result["backend"] == "cpu"
  assert len(result["separate"]) == len(result["fused"]) == 2
  assert all(r > 0 for r in result["separate"] + result["fused"])
  # Round 2 runs the fused sampler first (the order alternates).
  sides = [line.split()[1] for line in lines[:-1] if "tok/s" in line]
  assert sides == ["separate:", "fused:", "fused:", "separate:"]
