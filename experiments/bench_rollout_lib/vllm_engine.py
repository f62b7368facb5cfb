"""The vLLM sidecar's side of bench_rollout.py: a bf16 or int8 checkpoint
exported for vLLM, the weight syncs an RL step makes (timed, median of
several, each moving every tensor), one timed rollout, the CPU time of the
sidecar's process tree, and the k1 KL to full precision."""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp

from rljax import models
from rljax import quant as quant_lib
from rljax.rollout import base

from bench_rollout_lib.mismatch import policy_mismatch
from bench_rollout_lib.rows import row as make_row


def bench_vllm(model, quant: str, prompts, sampling, args, workdir) -> dict:
  from rljax.rollout import vllm_sidecar  # pylint: disable=g-import-not-at-top

  ckpt = os.path.join(workdir, f"vllm-{quant}")
  if quant == "bf16":
    models.save_hf(
      model.config, model.params, ckpt, model.tokenizer, dtype="bfloat16"
    )
  elif quant == "int8":
    models.export_compressed_tensors_int8(
      model.config, model.params, ckpt, model.tokenizer
    )
  else:
    raise ValueError(
      f"--vllm_quants has {quant!r}; expected bf16 or int8 "
      "(vLLM has no FP8 on CPU; on GPU add an fp8 export)"
    )
  max_len = max(len(p) for p in prompts) + sampling.max_new_tokens + 16
  config = vllm_sidecar.VLLMSidecarConfig(
    max_model_len=max(256, max_len),
    cpu_kvcache_gib=args["vllm_kv_gib"],
    max_concurrent_requests=len(prompts),
    extra_args=("--max-num-batched-tokens", str(args["vllm_batched_tokens"])),
  )
  # Every tensor of `perturbed` differs from the model's (as after an RL
  # step), so alternating syncs move every tensor.
  leaves, treedef = jax.tree_util.tree_flatten(model.params)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  perturbed = jax.tree_util.tree_unflatten(
    treedef,
    [
      x + 1e-2 * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
      for x, k in zip(leaves, keys)
    ],
  )
  with vllm_sidecar.VLLMSidecar(ckpt, config, model_config=model.config) as eng:
    # As the trainer syncs (`train.actor`): Q(θ) (or the bf16 cast) on the
    # device, then the engine's update; the first sync also traces the
    # conversion and fills the sidecar's buffers, so it is not timed.
    def synced(params):
      start = time.perf_counter()
      rparams = quant_lib.prepare_rollout_weights(model.config, params, quant)
      jax.block_until_ready(rparams)
      quantize_s = time.perf_counter() - start
      stats = eng.update_weights(rparams)
      total = base.SyncStats(
        seconds=quantize_s + stats.seconds, bytes=stats.bytes
      )
      phases = dict(getattr(eng, "last_sync_timing", None) or {})
      return total, {"quantize_s": quantize_s, **phases}

    synced(perturbed)
    runs = [
      synced(model.params if i % 2 == 0 else perturbed)
      for i in range(max(1, args["vllm_syncs"]))
    ]
    for i, (s, p) in enumerate(runs):
      print(
        f"vllm {quant} sync {i}: {s.seconds:.3f} s, "
        f"{s.bytes / 2**20:.1f} MiB, "
        + ", ".join(
          f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
          for k, v in p.items()
        )
      )
    # The sync of median total time; the last one restored model.params
    # only when the count is odd, so restore them for the rollout below.
    sync, phases = sorted(runs, key=lambda r: r[0].seconds)[len(runs) // 2]
    if len(runs) % 2 == 0:
      synced(model.params)
    start = time.perf_counter()
    eng.generate(prompts[:1], base.SamplingConfig(n=1, max_new_tokens=4))
    compile_s = time.perf_counter() - start
    load = os.getloadavg()[0]
    cpu0 = _process_tree_cpu_s(eng.pid)
    batch = eng.generate(prompts, sampling)
    cpu_s = _process_tree_cpu_s(eng.pid) - cpu0
    load = max(load, os.getloadavg()[0])
    startup_s = eng.startup_seconds
  _, k1 = policy_mismatch(
    model.config,
    None,
    model.params,
    batch,
    sampling.temperature,
    args["kl_rows"],
    args["kl_chunk"],
  )
  row = make_row("vllm", quant, batch, sync, k1, k1, sampling)
  row.update(
    compile_s=compile_s,
    startup_s=startup_s,
    kl_method="k1",
    load=load,
    cpu_s=cpu_s,
    tokens_per_cpu_s=row["tokens"] / max(cpu_s, 1e-9),
    sync_phases={k: float(v) for k, v in phases.items() if k.endswith("_s")},
  )
  return row


def _process_tree_cpu_s(pid) -> float:
  """user + system CPU seconds of a process and its live descendants (vLLM's
  engine core runs in a child of the API server), from /proc; nan without."""
  if pid is None:
    return float("nan")
  tick = os.sysconf("SC_CLK_TCK")
  total, todo, seen = 0.0, [int(pid)], set()
  while todo:
    p = todo.pop()
    if p in seen:
      continue
    seen.add(p)
    try:
      with open(f"/proc/{p}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
      total += (int(fields[11]) + int(fields[12])) / tick
      with open(f"/proc/{p}/task/{p}/children") as f:
        todo += [int(c) for c in f.read().split()]
    except (OSError, ValueError, IndexError):
      continue
  return total
