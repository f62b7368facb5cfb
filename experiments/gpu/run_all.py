"""The GPU performance measurements (where the update step's time goes, the
sampler's throughput at large shapes) in one call of the device tool.

  python experiments/gpu/run_all.py                # on the GPU, into $OUT
  python experiments/gpu/run_all.py --dry          # the same steps, tiny
                                                   # shapes, on this CPU

A lease is ~15 minutes of device time, 10 a call, so the steps run in the
order of their value and each one saves before the next starts:

  1. the update step of a Qwen2.5-0.5B shape (16 x 1024, f32 master weights,
     bf16 compute) with the per-layer remat the trainer uses, traced: the
     device time by kernel category (matmul, attention, elementwise, ...)
     and by JAX scope (the log-prob head, what remat recomputes, the
     backward pass), model-FLOPs MFU and hardware-FLOPs utilisation;
  2. the same with remat "dots" (the projections' outputs saved, nothing
     but elementwise work recomputed): the change the trace points to;
  3. the JAX sampler at a Qwen2.5-7B shape (random weights), decode batch 64
     and 256, bf16, INT8 W8A8, FP8, INT8 weight-only: tokens/s, the GPU's
     busy share and kernels per decode step (the regime where QuRL's
     quantized rollout should pay off: decoding bound by weight bytes);
  4. the update step at a 1.5B shape (remat dots, then full);
  5. the decode loop at 0.5B with XLA command buffers (CUDA graphs) for the
     while loop's body against the default: kernels per step, tokens/s;
  6. the sampler at 1.5B shape.

Each step is one subprocess (`experiments/profile_update.py` or
`experiments/bench_rollout.py`) with its own time limit, cut to what is left
of `--budget_s`; a step that would not fit is skipped and named. After each
step `$OUT/summary.json` holds every step so far ({name: {"rc", "wall_s",
"result"}}), and `$OUT/run_all.log` their output. The first update step's
profiler trace is copied to `$OUT` (perfetto JSON).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import time

from absl import app, flags

_DRY = flags.DEFINE_bool(
  "dry",
  False,
  "Run every step's code path with tiny shapes on the CPU (CI's check).",
)
_OUT = flags.DEFINE_string(
  "out",
  None,
  "Output folder (default $OUT, else runs/gpu_kit, runs/gpu_kit_dry).",
)
_BUDGET_S = flags.DEFINE_float(
  "budget_s",
  520.0,
  "Wall seconds for all steps; a step runs only with its time limit cut to "
  "what is left, and not at all when under 20 s is left.",
)
_ONLY = flags.DEFINE_list(
  "only", [], "Run only these steps (names as in summary.json)."
)

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
_PROFILE = os.path.join(_ROOT, "experiments", "profile_update.py")
_BENCH = os.path.join(_ROOT, "experiments", "bench_rollout.py")

# The decode loop's while body as one CUDA graph: XLA's command buffers for
# every kind of thunk it holds, the loop and its condition included.
_COMMAND_BUFFER_FLAGS = (
  "--xla_gpu_enable_command_buffer="
  "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL "
  "--xla_gpu_graph_min_graph_size=1"
)


@dataclasses.dataclass(frozen=True)
class Step:
  """One measurement: a script, its flags on the GPU and in --dry."""

  name: str
  script: str
  gpu_flags: tuple[str, ...]
  dry_flags: tuple[str, ...]
  timeout_s: float
  xla_flags: str = ""
  keep_trace: bool = False


def _update(name, model, policy, timeout_s, batch=16, keep_trace=False):
  return Step(
    name,
    _PROFILE,
    (
      f"--model={model}",
      f"--batch={batch}",
      "--seq=1024",
      "--param_dtype=float32",
      "--compute_dtype=bfloat16",
      f"--remat_policy={policy}",
      "--steps=3",
    ),
    (
      "--model=tiny",
      "--batch=2",
      "--seq=32",
      "--param_dtype=float32",
      "--compute_dtype=bfloat16",
      f"--remat_policy={policy}",
      "--steps=1",
    ),
    timeout_s,
    keep_trace=keep_trace,
  )


def _rollout(name, model, quants, shapes, timeout_s, xla_flags=""):
  return Step(
    name,
    _BENCH,
    (
      "--random_init",
      f"--model={model}",
      "--engines=jax",
      f"--jax_quants={quants}",
      f"--shapes={shapes}",
      "--kl_rows=0",
    ),
    (
      "--random_init",
      "--model=tiny",
      "--engines=jax",
      f"--jax_quants={quants}",
      "--shapes=2x2x4",
      "--kl_rows=0",
    ),
    timeout_s,
    xla_flags=xla_flags,
  )


# Most valuable first (the lease can end at any step).
STEPS = (
  _update(
    "update_0.5b_remat_full", "qwen2.5-0.5b", "full", 75, keep_trace=True
  ),
  _update("update_0.5b_remat_dots", "qwen2.5-0.5b", "dots", 70),
  _rollout("rollout_7b_bf16", "qwen2.5-7b", "bf16", "8x8x128,32x8x128", 90),
  _rollout("rollout_7b_int8", "qwen2.5-7b", "int8", "8x8x128,32x8x128", 90),
  _rollout("rollout_7b_fp8", "qwen2.5-7b", "fp8", "8x8x128,32x8x128", 90),
  _update("update_1.5b_remat_dots", "qwen2.5-1.5b", "dots", 80),
  _update("update_1.5b_remat_full", "qwen2.5-1.5b", "full", 80),
  _rollout("rollout_7b_int8_wo", "qwen2.5-7b", "int8_wo", "32x8x128", 80),
  _rollout("decode_0.5b_default", "qwen2.5-0.5b", "bf16", "16x8x128", 50),
  _rollout(
    "decode_0.5b_command_buffers",
    "qwen2.5-0.5b",
    "bf16",
    "16x8x128",
    50,
    xla_flags=_COMMAND_BUFFER_FLAGS,
  ),
  _rollout("rollout_1.5b", "qwen2.5-1.5b", "bf16,int8,fp8", "32x8x128", 90),
  _update("update_0.5b_no_remat", "qwen2.5-0.5b", "none", 60),
)


# --dry (CI): each code path once. The GPU steps differ from these only in
# the preset and shapes (1.5B and 7B run the same code as 0.5B) and in
# XLA_FLAGS, which a CPU would ignore.
DRY_STEPS = (
  STEPS[0],
  STEPS[1],
  dataclasses.replace(
    STEPS[2],
    name="rollout_all_formats",
    dry_flags=tuple(
      "--jax_quants=bf16,int8,fp8,int8_wo"
      if f.startswith("--jax_quants")
      else f
      for f in STEPS[2].dry_flags
    ),
  ),
)


def _machine() -> dict:
  info = {"python": sys.version.split()[0]}
  try:
    info["nvidia_smi"] = subprocess.run(
      [
        "nvidia-smi",
        "--query-gpu=name,memory.total,driver_version",
        "--format=csv,noheader",
      ],
      capture_output=True,
      text=True,
      timeout=20,
      check=False,
    ).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    info["nvidia_smi"] = None
  return info


def _summarize(name: str, result: dict) -> str:
  """One line of the step's headline numbers for the log."""
  if "model_flops_utilization" in result:
    return (
      f"{name}: step {result['step_s']:.4f} s, model-FLOPs MFU "
      f"{result['model_flops_utilization']:.1%}, hardware-FLOPs "
      f"{result['hardware_flops_utilization']:.1%}, peak "
      f"{result['peak_flops_per_s'] / 1e12:.0f} TFLOP/s, memory "
      f"{result['peak_memory_bytes'] / 2**30:.1f} GiB"
    )
  parts = []
  for shape, rows in (result.get("shapes") or {}).items():
    for row in rows:
      busy = row.get("trace", {}).get("device_busy", {})
      kernels = sum(b.get("kernels", 0) for b in busy.values())
      frac = [b.get("busy_frac", 0.0) for b in busy.values()]
      text = (
        f"{row.get('quant')} {shape}: "
        f"{row.get('tokens_per_s', float('nan')):.0f} tok/s"
      )
      if kernels:  # the traced rollout: prefill + new_tokens decode steps
        text += (
          f", ~{kernels / max(row.get('new_tokens', 1), 1):.0f} kernels per"
          f" decode step, GPU busy {max(frac):.0%}"
        )
      parts.append(text)
  return f"{name}: " + "; ".join(parts)


def _run_step(step: Step, out: str, dry: bool, limit_s: float, log) -> dict:
  # Not under `out`: the device tool brings back at most 8 files, and
  # summary.json holds every step's JSON anyway.
  tmp = os.path.join("/tmp", "rljax_gpu_kit_steps")
  os.makedirs(tmp, exist_ok=True)
  json_path = os.path.join(tmp, f"{step.name}.json")
  trace_dir = os.path.join("/tmp", "rljax_gpu_kit_traces", step.name)
  shutil.rmtree(trace_dir, ignore_errors=True)
  cmd = [sys.executable, step.script]
  cmd += list(step.dry_flags if dry else step.gpu_flags)
  cmd += [f"--out={json_path}", f"--trace_dir={trace_dir}"]
  env = dict(os.environ, PYTHONUNBUFFERED="1", RLJAX_HUGE_PAGES="0")
  env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
  if step.xla_flags and not dry:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + step.xla_flags).strip()
  log.write(f"\n=== {step.name}: {' '.join(cmd)}\n")
  if step.xla_flags:
    log.write(f"    XLA_FLAGS={env.get('XLA_FLAGS', '')}\n")
  log.flush()
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(
      cmd,
      stdout=log,
      stderr=subprocess.STDOUT,
      env=env,
      timeout=limit_s,
      check=False,
    )
    rc = proc.returncode
  except subprocess.TimeoutExpired:
    rc = "timeout"
  wall = time.perf_counter() - t0
  result = {}
  if os.path.exists(json_path):
    with open(json_path) as f:
      result = json.load(f)
  if step.keep_trace:
    traces = glob.glob(
      os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True
    )
    if traces:
      shutil.copy(max(traces, key=os.path.getmtime), out)
  return {
    "rc": rc,
    "wall_s": wall,
    "xla_flags": step.xla_flags,
    "result": result,
  }


def main(argv):
  del argv
  dry = _DRY.value
  out = (
    _OUT.value
    or os.environ.get("OUT")
    or ("runs/gpu_kit_dry" if dry else "runs/gpu_kit")
  )
  os.makedirs(out, exist_ok=True)
  steps = [s for s in STEPS if not _ONLY.value or s.name in _ONLY.value]
  if dry and not _ONLY.value:
    steps = list(DRY_STEPS)
  unknown = set(_ONLY.value) - {s.name for s in STEPS}
  if unknown:
    raise app.UsageError(
      f"--only has {sorted(unknown)}; expected names from "
      f"{[s.name for s in STEPS]}"
    )
  summary = {"machine": _machine(), "dry": dry, "steps": {}, "skipped": []}
  summary_path = os.path.join(out, "summary.json")
  start = time.perf_counter()
  with open(os.path.join(out, "run_all.log"), "a") as log:
    for i, step in enumerate(steps):
      left = _BUDGET_S.value - (time.perf_counter() - start)
      if left < 20:
        summary["skipped"] = [s.name for s in steps[i:]]
        print(f"budget spent: skipped {summary['skipped']}", flush=True)
        break
      limit = min(step.timeout_s * (3 if dry else 1), left)
      print(
        f"[{time.perf_counter() - start:6.1f} s] {step.name} ...", flush=True
      )
      record = _run_step(step, out, dry, limit, log)
      summary["steps"][step.name] = record
      print(
        f"  rc={record['rc']} {record['wall_s']:.1f} s  "
        + _summarize(step.name, record["result"]),
        flush=True,
      )
      # Saved after every step: a lease that ends mid-run keeps the rest.
      with open(summary_path, "w") as f:
        json.dump(summary, f, indent=1, default=str)
  with open(summary_path, "w") as f:
    json.dump(summary, f, indent=1, default=str)
  failed = [n for n, r in summary["steps"].items() if r["rc"] != 0]
  print(f"wrote {summary_path}; failed: {failed or 'none'}")
  if dry and (failed or summary["skipped"]):
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
