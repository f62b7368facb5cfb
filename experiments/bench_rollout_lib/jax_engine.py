"""The JAX sampler's side of bench_rollout.py: one timed rollout per weight
format (f32, bf16, int8, int8h, int8_wo, fp8), its weight sync, CPU time,
KL to full precision and, with --trace_dir, the profile of one more run."""

from __future__ import annotations

import os
import time

import jax

from rljax import models
from rljax import quant as quant_lib
from rljax import tracing
from rljax.rollout.jax_sampler import JaxSampler

from bench_rollout_lib.mismatch import policy_mismatch
from bench_rollout_lib.rows import row as make_row


def _traced(sampler, prompts, sampling, quant: str, args) -> dict:
  """One more rollout under the profiler (not the timed one: tracing
  slows the host's launches); `rljax.tracing.summarize` of it."""
  if not args.get("trace_dir"):
    return {}
  shape = f"{len(prompts)}x{sampling.n}x{sampling.max_new_tokens}"
  where = os.path.join(args["trace_dir"], f"{quant}_{shape}")
  t0 = time.perf_counter()
  with jax.profiler.trace(where, create_perfetto_trace=True):
    sampler.generate(prompts, sampling)
  summary = tracing.summarize(where)
  summary["traced_wall_ms"] = (time.perf_counter() - t0) * 1e3
  for dev, b in summary.get("device_busy", {}).items():
    print(
      f"  trace {quant} {shape} {dev}: busy {b['busy_ms']:.1f} of "
      f"{b['window_ms']:.1f} ms ({100 * b['busy_frac']:.0f} %), "
      f"{b['kernels']} kernels"
    )
  for name, ms, n in summary.get("top_ops", [])[:8]:
    print(f"  trace {quant} {shape} {ms:9.2f} ms {n:6d}x  {name[:90]}")
  return summary


def bench_jax(model, quant: str, prompts, sampling, args) -> dict:
  backend = jax.default_backend()
  mode = {"f32": "none", "int8h": "int8"}.get(quant, quant)
  # FP8 off a GPU is emulated (no native f8 dot there).
  fake = quant == "fp8" and backend != "gpu"
  # A fixed float-leaf dtype: the sampler runs weights prepared here, as the
  # trainer's does (quant="none"), so the label keeps its format.
  leaves = args.get("quant_float_leaves", "auto")
  prepared = leaves != "auto" and quant_lib.is_quantized(mode)
  sampler = JaxSampler(
    model.config,
    quant="none" if prepared else mode,
    fake_quant=fake,
    max_prompt_len=max(len(p) for p in prompts),
    max_batch=args["max_batch"],
    pad_id=0,
    head_quant="int8" if quant == "int8h" else "none",
    fuse_projections=args.get("fuse_projections"),
  )

  def weights():
    if not prepared:
      return model.params
    return quant_lib.prepare_rollout_weights(
      model.config,
      model.params,
      mode,
      fake=fake,
      float_dtype=None if leaves == "float32" else leaves,
    )

  sampler.update_weights(weights())  # the first sync also traces ops
  sync = sampler.update_weights(weights())
  compile_s = sampler.warmup(prompts, sampling)
  load = os.getloadavg()[0]
  cpu0 = time.process_time()
  batch = sampler.generate(prompts, sampling)
  cpu_s = time.process_time() - cpu0
  load = max(load, os.getloadavg()[0])
  trace = _traced(sampler, prompts, sampling, quant, args)
  kl, k1 = policy_mismatch(
    sampler.rollout_config,
    sampler.params,
    model.params,
    batch,
    sampling.temperature,
    args["kl_rows"],
    args["kl_chunk"],
    f32_config=model.config,
    activation_dtype=sampler.activation_dtype,
  )
  row = make_row("jax", quant, batch, sync, kl, k1, sampling)
  row.update(
    compile_s=compile_s,
    float_leaves=str(models.compute_dtype(sampler.params)),
    fused_projections=sampler.fuse_projections,
    fake_quant=sampler.fake_quant,
    backend=backend,
    load=load,
    cpu_s=cpu_s,
    tokens_per_cpu_s=row["tokens"] / max(cpu_s, 1e-9),
    **({"trace": trace} if trace else {}),
    sync_phases={
      "quantize_s": float(sync.seconds),
      "transfer_s": 0.0,
      "reload_s": 0.0,
    },
  )
  sampler.close()
  return row
