"""experiments/gpu/run_all.py --dry: the GPU kit's steps run their code
paths (the update step under each remat policy, traced; the sampler in every
weight format) with tiny shapes on the CPU, and summary.json holds what the
GPU run reports: model- and hardware-FLOPs utilisation, the device time by
kernel category, tokens/s per format."""

import json
import os
import subprocess
import sys

import compile_cache_util
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.slow
def test_dry_run_writes_every_step(tmp_path):
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=compile_cache_util.FAST_COMPILE_XLA_FLAGS,
  )  # and the run's compilation cache, inherited
  out = tmp_path / "out"
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "gpu", "run_all.py"),
      "--dry",
      f"--out={out}",
    ],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=ROOT,
    env=env,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  steps = summary["steps"]
  assert summary["dry"] and not summary["skipped"]
  assert list(steps) == [
    "update_0.5b_remat_full",
    "update_0.5b_remat_dots",
    "rollout_all_formats",
  ]
  assert all(s["rc"] == 0 for s in steps.values())

  full = steps["update_0.5b_remat_full"]["result"]
  dots = steps["update_0.5b_remat_dots"]["result"]
  assert (full["remat_policy"], dots["remat_policy"]) == ("full", "dots")
  # Same model, same batch: the same model FLOPs; full remat re-runs the
  # layers' forward, so its hardware FLOPs are larger.
  assert full["model_flops"] == dots["model_flops"] > 0
  assert full["hardware_flops"] > dots["hardware_flops"] > full["model_flops"]
  for r in (full, dots):
    assert 0 < r["model_flops_utilization"] <= r["hardware_flops_utilization"]
    assert r["time_shares"]["total_ms"] > 0
    assert r["time_shares"]["by_category"]
  # The first update step's profiler trace is kept beside the summary.
  assert list(out.glob("*.trace.json.gz"))

  rows = steps["rollout_all_formats"]["result"]["shapes"]["2x2x4"]
  assert sorted(r["quant"] for r in rows) == ["bf16", "fp8", "int8", "int8_wo"]
  assert all(r["tokens_per_s"] > 0 for r in rows)
  assert "rollout_all_formats: bf16 2x2x4" in proc.stdout
