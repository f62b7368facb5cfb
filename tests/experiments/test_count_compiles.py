"""experiments/count_compiles.py trains the tiny model a few steps with the
continuous sampler and reports compiles that stop after the first step."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.slow  # a whole script run
def test_continuous_sampler_compiles_only_in_the_first_step(tmp_path):
  out = tmp_path / "compiles.json"
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "count_compiles.py"),
      "--rollout.batching=continuous",
      "--run.steps=3",
      f"--run.run_dir={tmp_path / 'run'}",
      f"--out={out}",
    ],
    capture_output=True,
    text=True,
    timeout=900,
    cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["batching"] == "continuous" and result["steps"] == 3
  per_step = result["per_step"]
  # 2 prompts x 4 samples fit the slots at once: the weights' decode
  # layout, the slot state's init, one prefill size, one decode capacity.
  assert per_step["sampler_programs"] == [4, 4, 4]
  assert per_step["rollout_xla"][0] > 0
  assert per_step["rollout_xla"][1:] == [0, 0]
