"""Rollouts shaped like RL for `bench_rollout.py --workloads=...`.

  real      GSM8K questions (../shared/data/gsm8k/test.jsonl) in the model's
            chat template, n samples each, temperature 1, stop at EOS,
            max_new_tokens 512 by default: responses end at very different
            lengths, some at the limit.
  math500   MATH-500 problems (../shared/data/math500/test.jsonl), the same
            way, 1,024 new tokens by default: longer answers, a longer tail.
  longtail  the GSM8K prompts, no stop token, each sample's length drawn
            from a fixed, seeded heavy-tailed distribution (80 % uniform
            in 8..64, 15 % log-uniform in 65..L-1, 5 % exactly L); both
            engines get the same lengths (the JAX sampler's
            `max_new_tokens_per_sample`, vLLM's per-request `max_tokens`
            with `ignore_eos`), so they do identical work.
  fixed     every sample exactly T tokens, no stop (the figure rljax
            published before), at the same slot count.

Engines are interleaved: for each format, one vLLM sidecar is started
(`vllm_config`: its KV space, --max-num-seqs, batch token budget,
chunked prefill, thread binding), then for each repeat and workload the
JAX rows run, then the vLLM row, so a machine whose load changes biases
neither engine (the idle sidecar takes ~3 % of a core). Each row reports
useful tokens/s (response tokens up to and including the stop), the
decode batch's occupancy (live row-steps / row-steps run), the KV bytes
(reserved, held, written), the compile count and seconds, and the load
average; `report` prints the table and the ratios the targets name.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import time

import numpy as np

from rljax.data import prompts as prompts_lib
from rljax.rollout import base
from rljax.rollout.jax_sampler import JaxSampler

from bench_rollout_lib.vllm_engine import (
  _process_tree_cpu_s as process_tree_cpu_s,
)

# The table, the ratios and the plot (re-exported: bench_rollout prints them).
from bench_rollout_lib.workload_report import format_rows  # noqa: F401
from bench_rollout_lib.workload_report import plot_occupancy  # noqa: F401

_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
GSM8K = os.path.join(_DATA, "gsm8k", "test.jsonl")
MATH500 = os.path.join(_DATA, "math500", "test.jsonl")


def gsm8k_prompts(
  tokenizer, path: str, count: int, field: str = "question"
) -> list[list[int]]:
  """The first `count` questions (`field` of each JSON line: "question" in
  GSM8K, "problem" in MATH-500), chat-templated and tokenized."""
  template = prompts_lib.ChatTemplate(tokenizer)
  out = []
  with open(path) as f:
    for line in f:
      if line.strip():
        text = template(json.loads(line)[field])
        out.append(tokenizer.encode(text, add_special_tokens=False))
      if len(out) == count:
        break
  return out


def long_tail_lengths(count: int, most: int, seed: int) -> np.ndarray:
  """Heavy-tailed per-sample lengths in [8, most]: 80 % in 8..64, 15 %
  log-uniform in 65..most-1, 5 % at most (seeded, so every engine gets the
  same list)."""
  rng = np.random.default_rng(seed)
  kind = rng.random(count)
  short = rng.integers(8, 65, count)
  mid = np.exp(rng.uniform(np.log(65), np.log(max(66, most)), count))
  lengths = np.where(kind < 0.80, short, mid.astype(np.int64))
  lengths = np.where(kind >= 0.95, most, lengths)
  return np.clip(lengths, 1, most).astype(np.int64)


def _figures(batch: base.RolloutBatch, slots: int) -> dict:
  timing = batch.timing
  tokens = int(timing["tokens"])
  row = {
    "tokens": tokens,
    "seconds": float(timing["seconds"]),
    "useful_tokens_per_s": tokens / max(float(timing["seconds"]), 1e-9),
    "slots": slots,
    "mean_length": float(np.mean(batch.response_lengths)),
    "at_limit": float(np.mean([r == "length" for r in batch.finish_reason])),
  }
  slot_steps = timing.get("slot_steps")
  if slot_steps:
    # Decode row-steps that produced a token over those run: the first
    # token of each row comes from its prefill, not a decode step.
    live = timing.get("live_row_steps", tokens - len(batch.response_ids))
    row["occupancy"] = live / slot_steps
    row["idle_fraction"] = 1.0 - row["occupancy"]
  if "kv_bytes_peak" in timing:
    row["kv_bytes_peak"] = int(timing["kv_bytes_peak"])
  for name in ("kv_bytes_held_peak", "kv_bytes_written_peak"):
    if name in timing:
      row[name] = int(timing[name])
  return row


def bench_jax(
  model,
  quant: str,
  prompts,
  sampling,
  *,
  batching: str,
  slots: int,
  chunk_steps: int,
  limits=None,
  page_size: int = 0,
) -> dict:
  """One timed rollout of the JAX sampler after `warmup` (which compiles
  every program the rollout may run: the timed one compiles nothing)."""
  sampler = JaxSampler(
    model.config,
    model.params,
    quant={"f32": "none"}.get(quant, quant),
    max_prompt_len=max(len(p) for p in prompts),
    max_batch=slots,
    decode_slots=slots,
    chunk_steps=chunk_steps,
    batching=batching,
    pad_id=0,
    kv_page_size=page_size,
  )
  start = time.perf_counter()
  sampler.warmup(prompts, sampling)
  compile_s = time.perf_counter() - start
  load = os.getloadavg()[0]
  cpu0 = time.process_time()
  batch = sampler.generate(prompts, sampling, max_new_tokens_per_sample=limits)
  cpu_s = time.process_time() - cpu0
  if batching == "static":
    # Rows x decode steps of each chunk (`generate` counts the steps).
    per_chunk = min(len(prompts), max(1, slots // sampling.n)) * sampling.n
    batch.timing["slot_steps"] = per_chunk * batch.timing["decode_steps"]
  label = batching if batching == "static" else f"continuous-s{slots}"
  if page_size:
    label = f"{label}-p{page_size}"
  row = {
    "engine": "jax",
    "batching": label,
    "quant": quant,
    "compile_s": compile_s,
    "num_compiles": sampler.num_compiles,
    "load_before": load,
    "load_after": os.getloadavg()[0],
    "cpu_s": cpu_s,
    **_figures(batch, slots),
  }
  row["tokens_per_cpu_s"] = row["tokens"] / max(cpu_s, 1e-9)
  stats = sampler.last_stats if batching == "continuous" else {}
  row["bucket_steps"] = stats.get("bucket_steps", {})
  row["attention"] = stats.get("attention")
  row["timeline"] = list(stats.get("timeline", []))
  row["kv_timeline"] = list(stats.get("kv_timeline", []))
  sampler.close()
  return row


def bench_vllm(engine, quant: str, prompts, sampling, limits=None) -> dict:
  """One timed rollout on a running vLLM sidecar: the engine's own
  `generate`, or with `limits` one request per sample with its own
  `max_tokens` (and `ignore_eos`, as every rljax request)."""
  load = os.getloadavg()[0]
  cpu0 = process_tree_cpu_s(engine.pid)
  if limits is None:
    batch = engine.generate(prompts, sampling)
    cpu_s = process_tree_cpu_s(engine.pid) - cpu0
    row = _figures(batch, 0)
    return {
      "engine": "vllm",
      "quant": quant,
      "load_before": load,
      "load_after": os.getloadavg()[0],
      "cpu_s": cpu_s,
      "tokens_per_cpu_s": row["tokens"] / max(cpu_s, 1e-9),
      **row,
    }
  from rljax.rollout.vllm import api  # pylint: disable=g-import-not-at-top

  client = engine._client  # pylint: disable=protected-access
  name = client.config.served_model_name
  n = sampling.n
  bodies = [
    api.completion_request(
      name,
      prompts[r // n],
      base.SamplingConfig(
        n=1,
        temperature=sampling.temperature,
        max_new_tokens=int(limits[r]),
        seed=sampling.seed,
      ),
      sampling.seed * 100003 + r,
    )
    for r in range(len(prompts) * n)
  ]
  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(max_workers=len(bodies)) as pool:
    results = list(pool.map(client.http.complete, bodies))
  seconds = time.perf_counter() - start
  cpu_s = process_tree_cpu_s(engine.pid) - cpu0
  rows = [api.parse_completion(r, 1)[0] for r in results]
  tokens = int(sum(len(ids) for ids, _, _ in rows))
  return {
    "cpu_s": cpu_s,
    "tokens_per_cpu_s": tokens / max(cpu_s, 1e-9),
    "engine": "vllm",
    "quant": quant,
    "tokens": tokens,
    "seconds": seconds,
    "useful_tokens_per_s": tokens / seconds,
    "mean_length": tokens / len(rows),
    "load_before": load,
    "load_after": os.getloadavg()[0],
  }


def workload_requests(model, workload: str, settings: dict):
  """(prompts, sampling, per-sample limits or None) of one workload."""
  tok = model.tokenizer
  n, count = settings["samples"], settings["prompts"]
  eos = model.config.eos_token_id
  stop = tuple(eos) if isinstance(eos, (tuple, list)) else (int(eos),)
  seed = settings["seed"]
  if workload == "math500":
    prompts = gsm8k_prompts(
      tok, settings.get("math_data") or MATH500, count, field="problem"
    )
    sampling = base.SamplingConfig(
      n=n,
      temperature=1.0,
      max_new_tokens=settings["math_max_new_tokens"],
      stop_token_ids=stop,
      seed=seed,
    )
    return prompts, sampling, None
  prompts = gsm8k_prompts(tok, settings["data"], count)
  if workload == "real":
    sampling = base.SamplingConfig(
      n=n,
      temperature=1.0,
      max_new_tokens=settings["max_new_tokens"],
      stop_token_ids=stop,
      seed=seed,
    )
    return prompts, sampling, None
  if workload == "longtail":
    most = settings["long_tail_max"]
    sampling = base.SamplingConfig(
      n=n, temperature=1.0, max_new_tokens=most, seed=seed
    )
    return prompts, sampling, long_tail_lengths(count * n, most, seed)
  if workload == "fixed":
    sampling = base.SamplingConfig(
      n=n, temperature=1.0, max_new_tokens=settings["fixed_tokens"], seed=seed
    )
    return prompts, sampling, None
  raise ValueError(
    f"--workloads has {workload!r}; expected real, math500, longtail or fixed"
  )


def vllm_config(settings: dict, requests: dict):
  """The sidecar's settings for the workloads (its best on this CPU are
  docs/performance.md's): KV space, --max-num-seqs (default: every
  sample at once), the batch token budget, chunked prefill, and thread
  binding (VLLM_CPU_OMP_THREADS_BIND) when given."""
  from rljax.rollout import vllm_sidecar  # pylint: disable=g-import-not-at-top

  longest = max(
    len(p) + s.max_new_tokens for ps, s, _ in requests.values() for p in ps
  )
  rows = max(len(ps) * s.n for ps, s, _ in requests.values())
  args = ["--max-num-batched-tokens", str(settings["vllm_batched_tokens"])]
  args += ["--max-num-seqs", str(settings.get("vllm_max_num_seqs") or rows)]
  env = ()
  if settings.get("vllm_threads_bind"):
    env = (("VLLM_CPU_OMP_THREADS_BIND", settings["vllm_threads_bind"]),)
  return vllm_sidecar.VLLMSidecarConfig(
    max_model_len=longest + 16,
    cpu_kvcache_gib=settings["vllm_kv_gib"],
    max_concurrent_requests=rows,
    extra_args=tuple(args),
    env=env,
    chunked_prefill=settings.get("vllm_chunked_prefill"),
  )


def run_workloads(model, settings: dict, machine: dict) -> list[dict]:
  """Every (repeat, workload, engine, batching, quant) row, interleaved:
  per format one vLLM sidecar, then per repeat and workload the JAX rows
  and the vLLM row (the module doc)."""
  import tempfile  # pylint: disable=g-import-not-at-top

  rows = []
  requests = {
    w: workload_requests(model, w, settings) for w in settings["workloads"]
  }

  def keep(row, workload, repeat):
    row["workload"], row["repeat"] = workload, repeat
    rows.append(row)
    print(
      json.dumps(
        {k: v for k, v in row.items() if k not in ("timeline", "kv_timeline")}
      ),
      flush=True,
    )
    if settings.get("out"):
      with open(settings["out"], "w") as f:
        json.dump(
          {"machine": machine, "settings": settings, "rows": rows}, f, indent=1
        )

  for quant in settings["quants"]:
    with contextlib.ExitStack() as stack:
      engine = None
      if "vllm" in settings["engines"] and quant in ("bf16", "int8"):
        workdir = stack.enter_context(tempfile.TemporaryDirectory())
        engine = stack.enter_context(
          _sidecar(model, quant, workdir, vllm_config(settings, requests))
        )
      for repeat in range(settings.get("repeats", 1)):
        for workload, (prompts, sampling, limits) in requests.items():
          if "jax" in settings["engines"]:
            batchings = (
              ["continuous"] if workload == "fixed" else settings["batchings"]
            )
            for batching in batchings:
              for slots in settings["slots"]:
                for page in (
                  settings.get("kv_page_sizes") or [0]
                  if batching == "continuous"
                  else [0]
                ):
                  row = bench_jax(
                    model,
                    quant,
                    prompts,
                    sampling,
                    batching=batching,
                    slots=slots,
                    chunk_steps=settings["chunk_steps"],
                    limits=limits,
                    page_size=page,
                  )
                  keep(row, workload, repeat)
          if engine is not None:
            row = bench_vllm(engine, quant, prompts, sampling, limits)
            row["vllm_settings"] = settings_label(settings)
            keep(row, workload, repeat)
  return rows


def settings_label(settings: dict) -> str:
  return (
    f"kv {settings['vllm_kv_gib']} GiB, max-num-seqs "
    f"{settings.get('vllm_max_num_seqs') or 'all'}, batched tokens "
    f"{settings['vllm_batched_tokens']}, chunked prefill "
    f"{settings.get('vllm_chunked_prefill')}, bind "
    f"{settings.get('vllm_threads_bind') or 'default'}"
  )


@contextlib.contextmanager
def _sidecar(model, quant, workdir, config):
  """A started vLLM sidecar of `model` in `quant`, warmed by one request."""
  from rljax import models  # pylint: disable=g-import-not-at-top
  from rljax.rollout import vllm_sidecar  # pylint: disable=g-import-not-at-top

  ckpt = os.path.join(workdir, f"vllm-{quant}")
  if quant == "bf16":
    models.save_hf(
      model.config, model.params, ckpt, model.tokenizer, dtype="bfloat16"
    )
  else:
    models.export_compressed_tensors_int8(
      model.config, model.params, ckpt, model.tokenizer
    )
  with vllm_sidecar.VLLMSidecar(ckpt, config, model_config=model.config) as eng:
    eng.generate([[1, 2, 3]], base.SamplingConfig(n=1, max_new_tokens=4))
    yield eng
