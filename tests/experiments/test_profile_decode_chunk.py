"""experiments/profile_decode_chunk.py times the continuous engine's decode
chunk per (row bucket, row length, cache dtype, attention) and fits the
step's cost model; bench_workloads' table carries the paged rows' KV
figures."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import bench_workloads  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def test_tiny_dry_run_prints_every_row_and_the_fit(tmp_path):
  out = tmp_path / "rows.json"
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "profile_decode_chunk.py"),
      "--random_init",
      "--model=tiny",
      "--quant=none",
      "--slots=1,2",
      "--n=2",
      "--lengths=8,16",
      "--cache_dtypes=float32",
      "--attention=xla",
      "--prompt_len=8",
      "--steps=2",
      "--repeats=1",
      f"--out={out}",
    ],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  data = json.loads(out.read_text())
  rows = data["rows"]
  assert [(r["slots"], r["length"]) for r in rows] == [
    (1, 8),
    (1, 16),
    (2, 8),
    (2, 16),
  ]
  assert all(r["ms_per_step"] > 0 and r["attention"] == "xla" for r in rows)
  assert set(data["fits"]) == {"xla/float32/wall", "xla/float32/CPU"}
  assert "xla float32: wall ms/step =" in proc.stdout
  assert all(r["cpu_ms_per_step"] > 0 for r in rows)


def test_table_has_the_kv_columns_and_ratios():
  base = {"engine": "jax", "quant": "bf16", "mean_length": 10.0, "seconds": 1.0}
  rows = [
    {**base, "workload": "real", "batching": "static",
     "useful_tokens_per_s": 100.0, "kv_bytes_peak": 4 * 2**20},
    {**base, "workload": "real", "batching": "continuous-s32-p16",
     "useful_tokens_per_s": 120.0, "kv_bytes_peak": 2**20,
     "kv_bytes_held_peak": 2**19, "kv_bytes_written_peak": 2**18,
     "num_compiles": 9, "repeat": 0},
    {**base, "workload": "real", "batching": "continuous-s32-p16",
     "useful_tokens_per_s": 140.0, "kv_bytes_peak": 2**20, "repeat": 1},
    {**base, "workload": "real", "engine": "vllm", "batching": None,
     "useful_tokens_per_s": 100.0},
    {**base, "workload": "longtail", "batching": "continuous-s32-p16",
     "useful_tokens_per_s": 90.0},
    {**base, "workload": "fixed", "batching": "continuous-s32-p16",
     "useful_tokens_per_s": 100.0},
  ]  # fmt: skip
  lines = bench_workloads.format_rows(rows)
  assert "| KV peak MiB | KV held MiB | KV written MiB |" in lines[0]
  assert "| 1.0 | 0.5 | 0.2 | 9 |" in lines[3]
  # Medians over the repeats: (120 + 140) / 2.
  assert "- real bf16: continuous-s32-p16 / static = 1.30x" in lines
  assert "- real bf16: peak KV continuous-s32-p16 / static = 0.25" in lines
  assert (
    "- real bf16: JAX continuous-s32-p16 / vLLM = 1.30x (target >= 1.2)"
    in lines
  )
  assert (
    "- longtail bf16: continuous-s32-p16 / fixed continuous-s32-p16 = 0.90 "
    "(target >= 0.8)" in lines
  )
