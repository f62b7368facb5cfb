"""Profiles the jitted RL update step for a model size and batch shape.

  python experiments/profile_update.py --model=smollm2-135m --batch=16 --seq=256

With --aot it is a memory planner instead: nothing runs; the sharded update
step (`rljax.train.sharded`) and, with --decode, the sampler's decode step
are compiled for --mesh on fake CPU devices from `jax.ShapeDtypeStruct`s, and
per-device bytes are printed: params and optimizer state (from their
shardings), activations/temporaries (XLA's `memory_analysis()`), KV cache.

  python experiments/profile_update.py --aot --model=qwen2.5-7b --mesh=1,8,1 \
      --batch=64 --seq=2048 --micro_batches=8 --remat --logprob_chunk=256 \
      --param_dtype=float32 --compute_dtype=bfloat16

Prints compile time, step time, FLOPs and bytes from XLA's cost analysis,
achieved FLOP/s, MFU against a matmul peak measured on the same device and
dtype, and peak memory; writes a `jax.profiler` trace (open it with
TensorBoard's profile plugin or ui.perfetto.dev). `--out=FILE.json` writes
{"step_s", "flops", "bytes", "achieved_flops_per_s", "peak_flops_per_s",
"mfu", "peak_memory_bytes", ...}.
"""

from __future__ import annotations

import json
import os
import resource
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from rljax import hostmem
from rljax import models
from rljax import tracing
from rljax.core import objectives
from rljax.train import optim as optim_lib
from rljax.train import placement
from rljax.train import sharded
from rljax.train import update as update_lib
from rljax.models.logprobs import HEAD_SCOPE
from rljax.train.memory_plan import compiled_bytes, plan, random_batch

_MODEL = flags.DEFINE_string(
  "model",
  "smollm2-135m",
  "Model preset (random weights: speed does not depend on values), or 'tiny'.",
)
_BATCH = flags.DEFINE_integer("batch", 16, "Sequences per update.")
_SEQ = flags.DEFINE_integer("seq", 256, "Tokens per sequence.")
_MICRO = flags.DEFINE_integer(
  "micro_batches", 1, "Gradient-accumulation splits."
)
_DTYPE = flags.DEFINE_enum(
  "dtype", "float32", ["float32", "bfloat16"], "Parameter/compute dtype."
)
_REMAT = flags.DEFINE_bool(
  "remat",
  False,
  "Per-layer rematerialization in the decoder "
  "(UpdateSpec.remat -> token_logprobs(remat=True)).",
)
_REMAT_POLICY = flags.DEFINE_enum(
  "remat_policy",
  None,
  ["none", "full", "dots"],
  "Which activations the backward pass recomputes (overrides --remat): "
  "none; full = every layer's forward again (--remat); dots = keep every "
  "projection's output and the attention output, recompute the rest "
  "(norms, RoPE, SwiGLU's product).",
)
_CHUNK = flags.DEFINE_integer(
  "logprob_chunk", 0, "Sequence chunk of the LM head."
)
_RESPONSE = flags.DEFINE_integer(
  "response_len",
  0,
  "The batch's last N tokens are responses (UpdateSpec.response_len; the "
  "trainer sets rollout.max_new_tokens): the LM head runs on those only. "
  "0 = every position.",
)
_STEPS = flags.DEFINE_integer("steps", 3, "Timed steps (after one warm-up).")
_TRACE = flags.DEFINE_string(
  "trace_dir",
  "runs/profile_update/trace",
  "Where the profiler trace goes ('' = none).",
)
_OUT = flags.DEFINE_string("out", "", "Write the numbers as JSON here.")
_AOT = flags.DEFINE_bool(
  "aot",
  False,
  "Compile only (fake CPU devices, ShapeDtypeStruct inputs) "
  "and print the per-device memory plan; no step runs.",
)
_MESH = flags.DEFINE_string(
  "mesh",
  "1,1,1",
  "--aot: data,fsdp,tensor sizes; their product is the number of fake devices.",
)
_PARAM_DTYPE = flags.DEFINE_enum(
  "param_dtype",
  None,
  ["float32", "bfloat16"],
  "Master-weight dtype (default --dtype); the optimizer state follows it.",
)
_COMPUTE_DTYPE = flags.DEFINE_enum(
  "compute_dtype",
  None,
  ["float32", "bfloat16"],
  "Dtype the decoder runs in (default: param_dtype); a different one casts "
  "the params on entry (sharded.cast_params_transform): mixed precision.",
)
_DECODE = flags.DEFINE_bool(
  "decode", True, "--aot: also compile one sampler decode step."
)
_ROLLOUT_BATCH = flags.DEFINE_integer(
  "rollout_batch",
  0,
  "--aot --decode: sequences decoded at once (default --batch).",
)


def measure_matmul_peak(dtype, n: int = 0, repeats: int = 5) -> float:
  """Best FLOP/s of a jitted n×n @ n×n matmul on the default device
  (n = 8192 on a GPU, whose peak small matmuls do not reach; else 2048).

  On a CPU a bf16 matmul is timed as the update step runs it there, bf16
  operands with a float32 result (`quant.bf16_dot`); a bf16-output dot is
  ~1.3x slower on CPUs and is not the step's kernel."""
  n = n or (8192 if jax.default_backend() == "gpu" else 2048)
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  a = jax.random.normal(k1, (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(k2, (n, n), jnp.float32).astype(dtype)
  out = jnp.float32 if jax.default_backend() == "cpu" else None
  mm = jax.jit(lambda x, y: jax.lax.dot(x, y, preferred_element_type=out))
  mm(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    mm(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n**3 / best


def remat_setting() -> bool | str:
  """UpdateSpec.remat from --remat_policy (or --remat)."""
  policy = _REMAT_POLICY.value or ("full" if _REMAT.value else "none")
  return {"none": False, "full": True, "dots": "dots"}[policy]


def flops_accounting(
  config, n_params: int, batch: int, seq: int, head_cols: int, remat, chunk
) -> dict:
  """Model FLOPs (what the step must compute) and hardware FLOPs (what it
  does compute, recomputation included) of one update step, analytically.

  Model FLOPs, per sequence: 6·N'·T for the decoder's weights (N' = params
  less the [D, V] head; forward 2, backward 4), 6·D·V·C for the head on the
  C columns it runs on, and 6·L·T²·Hq·Dh for causal attention (QKᵀ and PV,
  2·2·T²·Hq·Dh forward per layer, half of it under the causal mask; backward
  twice the forward). This is the PaLM-style MFU numerator with the causal
  half counted once.
  Hardware FLOPs add what is run twice: flash attention's backward
  recomputes QKᵀ (+1/6 of the attention term); remat "full" re-runs each
  layer's forward (+2·N'·T and the attention forward, 2·L·T²·Hq·Dh); "dots"
  saves every projection and the attention output (nothing but elementwise
  work is recomputed); a chunked head is recomputed in the backward
  (+2·D·V·C).
  """
  head = config.hidden_size * config.vocab_size
  body = n_params - head
  attn_unit = config.num_layers * seq * seq * config.num_heads * config.head_dim
  model = batch * (6.0 * body * seq + 6.0 * head * head_cols + 6.0 * attn_unit)
  hw = model + batch * attn_unit  # flash backward: QKᵀ once more
  if remat is True:
    hw += batch * (2.0 * body * seq + 2.0 * attn_unit)
  if chunk:
    hw += batch * 2.0 * head * head_cols
  return {
    "model_flops": model,
    "hardware_flops": hw,
    "attention_model_flops": 6.0 * batch * attn_unit,
  }


def peak_memory_bytes(compiled) -> int:
  dev = jax.devices()[0]
  stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
  if stats and "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"])
  try:
    return compiled_bytes(compiled)["peak"]
  except Exception:  # pylint: disable=broad-except
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def compiled_memory(compiled) -> dict:
  """XLA's static memory plan of the compiled step: temporaries (where
  remat saves) and the peak (arguments + outputs + temporaries − aliased)."""
  try:
    mem = compiled_bytes(compiled)
  except Exception:  # pylint: disable=broad-except
    return {}
  return {
    "compiled_temp_bytes": mem["temp"],
    "compiled_peak_bytes": mem["peak"],
  }


def main_aot():
  from rljax.models import sharding as sharding_lib  # pylint: disable=g-import-not-at-top

  mesh_config = sharding_lib.MeshConfig.parse(_MESH.value)
  n = int(
    np.prod(
      [abs(x) for x in (mesh_config.data, mesh_config.fsdp, mesh_config.tensor)]
    )
  )
  if min(mesh_config.data, mesh_config.fsdp, mesh_config.tensor) < 1:
    raise ValueError(
      f"--mesh={_MESH.value!r}; --aot needs explicit sizes "
      "(they set the number of fake devices)"
    )
  # Fake devices: must be set before the backend starts.
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", n)
  config = (
    models.tiny_config()
    if _MODEL.value == "tiny"
    else models.preset(_MODEL.value)
  )
  param_dtype = _PARAM_DTYPE.value or _DTYPE.value
  compute_dtype = _COMPUTE_DTYPE.value or param_dtype
  result = {
    "model": _MODEL.value,
    "mesh": _MESH.value,
    "param_dtype": param_dtype,
    "compute_dtype": compute_dtype,
    "batch": _BATCH.value,
    "seq": _SEQ.value,
    "micro_batches": _MICRO.value,
    "remat": _REMAT.value,
    "logprob_chunk": _CHUNK.value,
  }
  result.update(
    plan(
      config,
      mesh_config.build(),
      _BATCH.value,
      _SEQ.value,
      _MICRO.value,
      _REMAT.value,
      _CHUNK.value,
      param_dtype,
      compute_dtype,
      _DECODE.value,
      _ROLLOUT_BATCH.value,
    )
  )
  _print(result)
  return result


def top_ops(trace_dir: str, n: int = 12) -> list[list]:
  """The `n` XLA ops that took longest in the newest perfetto trace under
  `trace_dir`, as [name, total ms, calls] (`rljax.tracing.summarize`:
  kernels on an accelerator, host ops on a CPU)."""
  return tracing.summarize(trace_dir, n).get("top_ops", [])


def _print(result: dict) -> None:
  width = max(len(k) for k in result)
  for k, v in result.items():
    if k in ("top_ops", "time_shares"):
      continue
    if isinstance(v, float):
      v = f"{v:.4g}"
    elif isinstance(v, int) and k.endswith("_bytes"):
      v = f"{v} ({v / 2**30:.2f} GiB)"
    print(f"{k:<{width}}  {v}")
  shares = result.get("time_shares") or {}
  if shares.get("total_ms"):
    total = shares["total_ms"]
    print(f"device time by kernel category (of {total:.1f} ms):")
    for cat, ms in shares["by_category"].items():
      print(f"  {cat:<12} {ms:10.1f} ms  {ms / total:6.1%}")
    for scope, ms in shares["by_scope"].items():
      print(f"  scope {scope:<14} {ms:10.1f} ms  {ms / total:6.1%}")
  if result.get("top_ops"):
    print("longest XLA ops in the traced step (ms, calls):")
    for name, ms, n in result["top_ops"]:
      print(f"  {ms:10.1f}  {n:5d}  {name}")
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump(result, f, indent=1)


def main(argv):
  del argv
  if _AOT.value:
    main_aot()
    return
  dtype = jnp.dtype(_PARAM_DTYPE.value or _DTYPE.value)
  compute_dtype = jnp.dtype(_COMPUTE_DTYPE.value or dtype)
  if _MODEL.value == "tiny":
    config = models.tiny_config()
  else:
    config = models.preset(_MODEL.value)
  # The peaks first, on an idle process: timed after the step (14 GiB of
  # freed buffers at SmolLM2 16x256) the same f32 matmul ran ~1.6x slower.
  # The decoder's matmuls run in the compute dtype: that is the peak to beat.
  peak = measure_matmul_peak(compute_dtype)
  # The f32 peak is the CPU's reference (its update step runs f32); on an
  # accelerator it costs seconds of a short lease and means nothing there.
  peak_f32 = (
    peak
    if compute_dtype == jnp.float32
    else measure_matmul_peak(jnp.float32)
    if jax.default_backend() == "cpu"
    else float("nan")
  )
  params = models.init_params(config, jax.random.PRNGKey(0), dtype=dtype)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  loss = objectives.PolicyLossConfig(
    surrogate="ppo",
    correction="acr",
    eps_low=0.2,
    eps_high=0.28,
    aggregation="token-mean",
  )
  spec = update_lib.UpdateSpec(
    model_config=config,
    loss=loss,
    micro_batches=_MICRO.value,
    remat=remat_setting(),
    logprob_chunk=_CHUNK.value,
    param_transform=(
      sharded.cast_params_transform(compute_dtype)
      if compute_dtype != dtype
      else None
    ),
    # bf16 compute on a CPU: f32 activations, bf16 x bf16 -> f32 dots (the
    # Trainer's rule, placement.activation_dtype).
    activation_dtype=placement.activation_dtype_for(compute_dtype.name),
    response_len=_RESPONSE.value or None,
  )
  optimizer = optim_lib.make_optimizer(optim_lib.OptimConfig(1e-6, 100))
  state = update_lib.init_train_state(params, optimizer)
  batch = random_batch(config, _BATCH.value, _SEQ.value, jax.random.PRNGKey(1))
  step_fn = update_lib.make_update_step(spec, optimizer)

  t0 = time.perf_counter()
  compiled = step_fn.lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost.get("flops", 0.0))
  bytes_accessed = float(cost.get("bytes accessed", 0.0))
  # Analytic count for comparison: 6·N·tokens (forward + backward), the LM
  # head (D·V of N) counted only on the columns it runs on.
  head = config.hidden_size * config.vocab_size
  head_cols = _SEQ.value - spec.logprob_start(_SEQ.value)
  analytic = (
    6.0 * _BATCH.value * ((n_params - head) * _SEQ.value + head * head_cols)
  )

  state, m = compiled(state, batch)  # warm-up
  jax.block_until_ready(m)
  times = []
  for _ in range(_STEPS.value):
    t0 = time.perf_counter()
    state, m = compiled(state, batch)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
  step_s = float(np.median(times))
  shares = {}
  if _TRACE.value:
    os.makedirs(_TRACE.value, exist_ok=True)
    with jax.profiler.trace(_TRACE.value, create_perfetto_trace=True):
      state, m = compiled(state, batch)
      jax.block_until_ready(m)
    path = tracing.newest_trace(_TRACE.value)
    if path:
      shares = tracing.time_shares(
        tracing.load_events(path),
        scopes=(HEAD_SCOPE, "rematted_computation", "transpose("),
        op_names=tracing.hlo_op_names(compiled.as_text()),
      )
  accounting = flops_accounting(
    config,
    n_params,
    _BATCH.value,
    _SEQ.value,
    head_cols,
    spec.remat,
    _CHUNK.value,
  )
  # XLA's cost analysis counts the body of a while loop once; the update step
  # scans over layers and micro-batches, so on such programs it undercounts by
  # the trip counts. MFU then uses the analytic 6·N·tokens instead.
  used_flops = flops if flops >= 0.5 * analytic else analytic
  achieved = used_flops / step_s
  result = {
    "device": str(jax.devices()[0].device_kind),
    "backend": jax.default_backend(),
    "host_huge_pages": hostmem.huge_pages_state(),
    "model": _MODEL.value,
    "params": int(n_params),
    "param_dtype": dtype.name,
    "compute_dtype": compute_dtype.name,
    "logprob_chunk": _CHUNK.value,
    "batch": _BATCH.value,
    "seq": _SEQ.value,
    "micro_batches": _MICRO.value,
    "remat": _REMAT.value,
    "remat_policy": _REMAT_POLICY.value or ("full" if _REMAT.value else "none"),
    "compile_s": compile_s,
    "step_s": step_s,
    "flops": used_flops,
    "xla_cost_analysis_flops": flops,
    "analytic_flops_6nt": analytic,
    "bytes": bytes_accessed,
    "achieved_flops_per_s": achieved,
    "peak_flops_per_s": peak,
    "mfu": achieved / peak,
    **accounting,
    "model_flops_utilization": accounting["model_flops"] / step_s / peak,
    "hardware_flops_utilization": accounting["hardware_flops"] / step_s / peak,
    "peak_f32_flops_per_s": peak_f32,
    "mfu_vs_f32_peak": achieved / peak_f32,
    "activation_dtype": spec.activation_dtype or compute_dtype.name,
    "tokens_per_s": _BATCH.value * _SEQ.value / step_s,
    "peak_memory_bytes": peak_memory_bytes(compiled),
    **compiled_memory(compiled),
    "trace_dir": _TRACE.value,
    "top_ops": top_ops(_TRACE.value) if _TRACE.value else [],
    "time_shares": shares,
  }
  _print(result)


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
