"""The fixed-shape rows of bench_rollout.py: for one PxNxT shape, the JAX
sampler's formats, then the vLLM sidecar's (skipped when vLLM is not
importable), each row handed to `checkpoint` as soon as it is measured."""

from __future__ import annotations

import shutil
import tempfile

from rljax.rollout import base

from bench_rollout_lib import jax_engine
from bench_rollout_lib import vllm_engine
from bench_rollout_lib.rows import make_prompts


def run_shape(model, shape, args, checkpoint=lambda rows: None) -> list[dict]:
  """The rows of `shape` = (P, N, T). `args` holds the run's settings:
  engines, jax_quants, vllm_quants, seed, temperature, max_batch (0: the
  whole rollout), and what the engines read (kl_rows, vllm_kv_gib, ...)."""
  prompts_n, samples, new_tokens = shape
  prompts = make_prompts(
    model.tokenizer, prompts_n, args["seed"], model.config.vocab_size
  )
  sampling = base.SamplingConfig(
    n=samples,
    temperature=args["temperature"],
    max_new_tokens=new_tokens,
    seed=args["seed"],
  )
  args = dict(args, max_batch=args["max_batch"] or prompts_n * samples)
  print(
    f"shape {prompts_n}x{samples}x{new_tokens} prompt_tokens="
    f"{[len(p) for p in prompts]}",
    flush=True,
  )
  rows = []
  if "jax" in args["engines"]:
    for quant in args["jax_quants"]:
      print(f"[jax {quant}] ...", flush=True)
      rows.append(jax_engine.bench_jax(model, quant, prompts, sampling, args))
      checkpoint(rows)
      print(
        f"  {rows[-1]['tokens_per_s']:.1f} tok/s  load {rows[-1]['load']:.1f}",
        flush=True,
      )
  if "vllm" in args["engines"]:
    try:
      import vllm  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError as e:
      print(f"[vllm] skipped: vllm is not importable ({e})")
    else:
      workdir = tempfile.mkdtemp(prefix="bench-rollout-")
      try:
        for quant in args["vllm_quants"]:
          print(f"[vllm {quant}] ...", flush=True)
          try:
            rows.append(
              vllm_engine.bench_vllm(
                model, quant, prompts, sampling, args, workdir
              )
            )
            checkpoint(rows)
          except Exception as e:  # pylint: disable=broad-except
            # One failing engine must not lose the rows measured so far.
            print(f"  [vllm {quant}] failed: {str(e)[:600]}", flush=True)
            continue
          print(f"  {rows[-1]['tokens_per_s']:.1f} tok/s", flush=True)
      finally:
        shutil.rmtree(workdir, ignore_errors=True)
  return rows
