"""experiments/bench_rollout.py --from_json redraws a committed run's table
and plot, and both name the machine that measured the rows, not the one
that redraws them; its flags are checked before anything runs
(bench_rollout_lib/flag_checks.py)."""

import json
import os
import subprocess
import sys

import pytest

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


@pytest.mark.slow  # a whole script run
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


def _flag_checks():
  """experiments/bench_rollout_lib/flag_checks.py, imported by path (the
  script's folder is not a package on the tests' path)."""
  import importlib.util

  path = os.path.join(
    ROOT, "experiments", "bench_rollout_lib", "flag_checks.py"
  )
  spec = importlib.util.spec_from_file_location("bench_flag_checks", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def defaults():
  """{flag: value} of the script's own defaults (with --workloads=real,
  so that the workload flags are read), as its main passes them."""
  probe = (
    "import json, sys; sys.path.insert(0, 'experiments'); "
    "import bench_rollout as b; from absl import flags; "
    "flags.FLAGS(['x', '--workloads=real']); "
    "values, given = b._flag_values(); "
    "print(json.dumps(values))"
  )
  proc = _python("-c", probe)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.splitlines()[-1])


class TestFlagChecks:
  def test_the_scripts_defaults_pass(self, defaults):
    checks = _flag_checks()
    assert checks.problems(defaults, {"workloads"}) == []
    assert checks.problems(dict(defaults, workloads=[]), set()) == []

  @pytest.mark.parametrize(
    "changes,flag",
    [
      ({"workloads": ["real", "foo"]}, "workloads"),
      ({"slots": ["0"]}, "slots"),
      ({"slots": ["x"]}, "slots"),
      ({"workload_repeats": 0}, "workload_repeats"),
      ({"vllm_max_num_seqs": -1}, "vllm_max_num_seqs"),
      ({"math_max_new_tokens": 0}, "math_max_new_tokens"),
      ({"workloads": ["math500"], "math_data": "/no/such.jsonl"}, "math_data"),
      ({"kv_page_sizes": ["-4"]}, "kv_page_sizes"),
      ({"kv_page_sizes": ["abc"]}, "kv_page_sizes"),
      ({"kv_page_sizes": ["513"]}, "kv_page_sizes"),
      ({"batchings": ["dynamic"]}, "batchings"),
      ({"workload_quants": ["int4"]}, "workload_quants"),
      (
        {"engines": ["jax", "vllm"], "workload_quants": ["fp8"]},
        "workload_quants",
      ),
      ({"engines": ["tpu"]}, "engines"),
      ({"jax_quants": ["int3"]}, "jax_quants"),
      ({"vllm_quants": ["fp8"]}, "vllm_quants"),
      ({"shapes": ["16x8"]}, "shapes"),
      ({"decode_ab": "16x0"}, "decode_ab"),
      ({"from_json": "/no/such.json"}, "from_json"),
      ({"temperature": -1.0}, "temperature"),
      ({"kl_chunk": 0}, "kl_chunk"),
      ({"vllm_kv_gib": 0.0}, "vllm_kv_gib"),
      ({"model": "/no/such/model"}, "model"),
      ({"random_init": True, "model": "gpt-9"}, "model"),
      ({"data": "/no/such.jsonl"}, "data"),
      ({"chunk_steps": 0}, "chunk_steps"),
    ],
  )
  def test_each_bad_flag_is_named_alone(self, defaults, changes, flag):
    (line,) = _flag_checks().problems(dict(defaults, **changes), {"workloads"})
    assert line.startswith(f"--{flag}=") and "; expected " in line

  def test_a_page_is_bounded_by_the_longest_response_of_the_workloads(
    self, defaults
  ):
    checks = _flag_checks()
    values = dict(
      defaults,
      workloads=["real", "longtail"],
      max_new_tokens=64,
      long_tail_max=300,
      kv_page_sizes=["300", "301"],
    )
    (line,) = checks.problems(values, {"workloads"})
    assert line.startswith("--kv_page_sizes=301; expected <= 300")

  def test_flags_nothing_reads_are_named(self, defaults):
    checks = _flag_checks()
    # Pages with no continuous row, and workload flags without workloads.
    static = dict(defaults, batchings=["static"], kv_page_sizes=["16"])
    assert checks.problems(static, {"workloads"}) == []  # the default
    (line,) = checks.problems(static, {"workloads", "kv_page_sizes"})
    assert "only continuous rows read it" in line
    alone = dict(defaults, workloads=[], slots=["16"])
    (line,) = checks.problems(alone, {"slots"})
    assert line.startswith("--slots=") and "unset without --workloads" in line
    assert checks.problems(alone, set()) == []  # the default, not typed
