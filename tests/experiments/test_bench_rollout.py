"""experiments/bench_rollout.py --from_json redraws a committed run's table
and plot, and both name the machine that measured the rows, not the one
that redraws them."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
GPU_RUN = os.path.join(ROOT, "docs", "performance", "rollout_gpu_h200.json")


def _python(*args):
  """Run `python *args` in the repository root; the finished process."""
  return subprocess.run(
    [sys.executable, *args],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=ROOT,
  )


def test_redraw_names_the_measuring_machine(tmp_path):
  plot, table = tmp_path / "plot.png", tmp_path / "table.md"
  proc = _python(
    os.path.join(ROOT, "experiments", "bench_rollout.py"),
    f"--from_json={GPU_RUN}",
    f"--plot={plot}",
    f"--markdown={table}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert plot.stat().st_size > 10_000
  assert "backend gpu (NVIDIA H200)" in table.read_text()

  # The title itself, in a fresh process: the script defines absl flags,
  # which another test's in-process import in this worker would collide with.
  probe = (
    "import json, sys; sys.path.insert(0, 'experiments'); "
    "import bench_rollout as b; "
    f"m = json.load(open({GPU_RUN!r}))['machine']; "
    "print(b.plot_title(m)); "
    "print(b.plot_title(dict(m, gpu=False, cpu_model='Some CPU')))"
  )
  proc = _python("-c", probe)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.splitlines() == [
    "Rollout throughput, NVIDIA H200",
    "Rollout throughput, Some CPU",
  ]


def test_trace_and_float_leaves_land_in_the_row(tmp_path):
  # One tiny INT8 rollout of a random SmolLM2: --quant_float_leaves runs the
  # given layout (the accelerator's bf16 leaves, here on a CPU) and
  # --trace_dir puts the traced rollout's longest ops into the row.
  out = tmp_path / "rows.json"
  proc = _python(
    os.path.join(ROOT, "experiments", "bench_rollout.py"),
    "--model=smollm2-135m",
    "--random_init",
    "--engines=jax",
    "--jax_quants=int8",
    "--shapes=1x1x2",
    "--kl_rows=0",
    "--quant_float_leaves=bfloat16",
    "--nofuse_projections",
    f"--trace_dir={tmp_path / 'trace'}",
    f"--out={out}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  (row,) = json.loads(out.read_text())["shapes"]["1x1x2"]
  assert row["quant"] == "int8"
  assert row["float_leaves"] == "bfloat16"
  assert row["fused_projections"] is False
  assert row["trace"]["top_ops"], row["trace"]
  assert row["trace"]["device_busy"] == {}  # a CPU: no accelerator stream
  assert list((tmp_path / "trace").glob("int8_1x1x2/**/*.trace.json.gz"))
