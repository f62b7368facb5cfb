"""Rollouts shaped like RL for `bench_rollout.py --workloads=real,longtail`.

  real      GSM8K questions (../shared/data/gsm8k/test.jsonl) in the model's
            chat template, n samples each, temperature 1, stop at EOS,
            max_new_tokens 512 by default: responses end at very different
            lengths, some at the limit.
  longtail  the same prompts, no stop token, each sample's length drawn
            from a fixed, seeded heavy-tailed distribution (80 % uniform
            in 8..64, 15 % log-uniform in 65..L-1, 5 % exactly L); both
            engines get the same lengths (the JAX sampler's
            `max_new_tokens_per_sample`, vLLM's per-request `max_tokens`
            with `ignore_eos`), so they do identical work.
  fixed     every sample exactly T tokens, no stop (the figure rljax
            published before), at the same slot count.

Each row reports useful tokens/s (response tokens up to and including the
stop), slot occupancy (live row-steps / slot-steps) and its complement, the
padding/idle fraction, the peak KV-cache bytes and the compile count.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import time

import numpy as np

from rljax.data import prompts as prompts_lib
from rljax.rollout import base
from rljax.rollout.jax_sampler import JaxSampler

GSM8K = os.path.join(
  os.path.dirname(__file__), "..", "..", "shared", "data", "gsm8k", "test.jsonl"
)


def gsm8k_prompts(tokenizer, path: str, count: int) -> list[list[int]]:
  """The first `count` GSM8K questions, chat-templated and tokenized."""
  template = prompts_lib.ChatTemplate(tokenizer)
  out = []
  with open(path) as f:
    for line in f:
      if line.strip():
        text = template(json.loads(line)["question"])
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
  group_width: int | None = None,
  page_size: int = 0,
) -> dict:
  """One timed rollout of the JAX sampler after a compile-only one (with
  pages, after a whole untimed rollout: which pool sizes a rollout grows
  through shows only when it runs, so `warmup` cannot compile them all)."""
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
    group_width=group_width,
    kv_page_size=page_size,
  )
  start = time.perf_counter()
  sampler.warmup(prompts, sampling)
  if page_size:
    sampler.generate(prompts, sampling, max_new_tokens_per_sample=limits)
  compile_s = time.perf_counter() - start
  batch = sampler.generate(prompts, sampling, max_new_tokens_per_sample=limits)
  if batching == "static":
    # Rows x decode steps of each chunk (`generate` counts the steps).
    per_chunk = min(len(prompts), max(1, slots // sampling.n)) * sampling.n
    batch.timing["slot_steps"] = per_chunk * batch.timing["decode_steps"]
  if batching == "continuous" and group_width not in (None, sampling.n):
    batching = f"continuous-w{group_width}"
  if page_size:
    batching = f"{batching}-p{page_size}"
  row = {
    "engine": "jax",
    "batching": batching,
    "quant": quant,
    "compile_s": compile_s,
    "num_compiles": sampler.num_compiles,
    **_figures(batch, slots),
  }
  row["timeline"] = list(sampler.last_timeline) if batching != "static" else []
  row["kv_timeline"] = list(sampler.last_stats.get("kv_timeline", []))
  sampler.close()
  return row


def bench_vllm(engine, quant: str, prompts, sampling, limits=None) -> dict:
  """One timed rollout on a running vLLM sidecar: the engine's own
  `generate`, or with `limits` one request per sample with its own
  `max_tokens` (and `ignore_eos`, as every rljax request)."""
  if limits is None:
    batch = engine.generate(prompts, sampling)
    return {"engine": "vllm", "quant": quant, **_figures(batch, 0)}
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
  rows = [api.parse_completion(r, 1)[0] for r in results]
  tokens = int(sum(len(ids) for ids, _, _ in rows))
  return {
    "engine": "vllm",
    "quant": quant,
    "tokens": tokens,
    "seconds": seconds,
    "useful_tokens_per_s": tokens / seconds,
    "mean_length": tokens / len(rows),
  }


def workload_requests(model, workload: str, settings: dict):
  """(prompts, sampling, per-sample limits or None) of one workload."""
  tok = model.tokenizer
  n, count = settings["samples"], settings["prompts"]
  prompts = gsm8k_prompts(tok, settings["data"], count)
  eos = model.config.eos_token_id
  stop = tuple(eos) if isinstance(eos, (tuple, list)) else (int(eos),)
  seed = settings["seed"]
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
    f"--workloads has {workload!r}; expected real, longtail or fixed"
  )


def format_rows(rows: list[dict]) -> list[str]:
  """A Markdown table of the rows, then the ratios that compare engines.

  Continuous over static batching (throughput and peak KV), JAX over vLLM,
  and on the long-tail workload continuous over a fixed-length batch.
  """
  lines = [
    "| workload | engine | batching | quant | useful tok/s | occupancy | "
    "idle | KV peak MiB | KV held MiB | KV written MiB | compiles | "
    "mean len | at limit | s |",
    "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  fmt = lambda v, f: "–" if v is None else format(v, f)
  mib = lambda r, k: None if r.get(k) is None else r[k] / 2**20
  for r in rows:
    lines.append(
      f"| {r['workload']} | {r['engine']} | {r.get('batching', '–')} | "
      f"{r['quant']} | {r['useful_tokens_per_s']:.1f} | "
      f"{fmt(r.get('occupancy'), '.2f')} | "
      f"{fmt(r.get('idle_fraction'), '.2f')} | "
      f"{fmt(mib(r, 'kv_bytes_peak'), '.1f')} | "
      f"{fmt(mib(r, 'kv_bytes_held_peak'), '.1f')} | "
      f"{fmt(mib(r, 'kv_bytes_written_peak'), '.1f')} | "
      f"{fmt(r.get('num_compiles'), 'd')} | {r['mean_length']:.0f} | "
      f"{fmt(r.get('at_limit'), '.2f')} | {r['seconds']:.1f} |"
    )
  find = lambda w, e, b, q: next(
    (
      r
      for r in rows
      if (r["workload"], r["engine"], r.get("batching"), r["quant"])
      == (w, e, b, q)
    ),
    None,
  )
  ratios = []
  tps = lambda r: r["useful_tokens_per_s"]
  for q in sorted({r["quant"] for r in rows}):
    fixed = find("fixed", "jax", "continuous", q)
    for w in ("real", "longtail"):
      static, vllm = find(w, "jax", "static", q), find(w, "vllm", None, q)
      for r in rows:
        label = r.get("batching") or ""
        if (r["workload"], r["engine"], r["quant"]) != (w, "jax", q):
          continue
        if label.startswith("continuous") and static:
          ratios.append(
            f"{w} {q}: {label} / static = {tps(r) / tps(static):.2f}x"
          )
          if r.get("kv_bytes_peak") and static.get("kv_bytes_peak"):
            ratios.append(
              f"{w} {q}: peak KV {label} / static = "
              f"{r['kv_bytes_peak'] / static['kv_bytes_peak']:.2f}"
            )
        if vllm:
          ratios.append(
            f"{w} {q}: JAX {label} / vLLM = {tps(r) / tps(vllm):.2f}x"
          )
        if w == "longtail" and fixed:
          ratios.append(
            f"longtail {q}: {label} / fixed-length continuous = "
            f"{tps(r) / tps(fixed):.2f}"
          )
  return lines + [""] + [f"- {line}" for line in ratios]


def plot_occupancy(rows: list[dict], path: str, title: str) -> None:
  """Per continuous JAX row, over the rollout: the live share of the slots
  (left) and the KV bytes the slots hold for tokens (right: with pages the
  pages in use, else slots x the own cache's capacity; thin, what the pool
  reserves). One colour per workload and format, one line style per
  layout (solid: own cache per slot; dashed: pages)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, (ax, kv_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
  drawn = [r for r in rows if r.get("timeline")]  # continuous JAX rows
  kinds = sorted({(r["workload"], r["quant"]) for r in drawn})
  colour = {k: plt.cm.tab10(i % 10) for i, k in enumerate(kinds)}
  for r in drawn:
    style = dict(
      color=colour[(r["workload"], r["quant"])],
      linestyle="--" if "-p" in r["batching"] else "-",
    )
    t, occ = zip(*r["timeline"])
    ax.plot(
      t, occ, label=f"{r['workload']} {r['batching']} {r['quant']}", **style
    )
    if r.get("kv_timeline"):
      t, held, reserved = zip(*r["kv_timeline"])
      kv_ax.plot(t, [b / 2**20 for b in held], **style)
      if held != reserved:
        kv_ax.plot(t, [b / 2**20 for b in reserved], linewidth=0.6, **style)
  ax.set_xlabel("seconds into the rollout")
  ax.set_ylabel("live slots / slots (per chunk)")
  ax.set_ylim(0, 1.05)
  ax.set_title(title, fontsize=8)
  ax.legend(fontsize=6, ncol=2)
  kv_ax.set_xlabel("seconds into the rollout")
  kv_ax.set_ylabel("KV MiB held (thin: pool reserved)")
  kv_ax.set_ylim(bottom=0)
  kv_ax.set_title(
    "KV cache: own cache per slot (solid) vs pages (dashed)", fontsize=8
  )
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def run_workloads(model, settings: dict, machine: dict) -> list[dict]:
  """Every (workload, engine, batching, quant) row, JAX first; vLLM rows
  share one sidecar per quant across the workloads."""
  rows = []
  requests = {
    w: workload_requests(model, w, settings) for w in settings["workloads"]
  }

  def keep(row, workload):
    row["workload"] = workload
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
    for workload, (prompts, sampling, limits) in requests.items():
      batchings = (
        ["continuous"] if workload == "fixed" else settings["batchings"]
      )
      continuous = lambda b, values: values if b == "continuous" else [0]
      runs = [
        (b, w, ps)
        for b in batchings
        for w in continuous(b, settings.get("group_widths") or [0])
        for ps in continuous(b, settings.get("kv_page_sizes") or [0])
      ]
      for batching, width, page_size in runs:
        keep(
          bench_jax(
            model,
            quant,
            prompts,
            sampling,
            batching=batching,
            slots=settings["slots"],
            chunk_steps=settings["chunk_steps"],
            limits=limits,
            group_width=width or None,
            page_size=page_size,
          ),
          workload,
        )
  if "vllm" in settings["engines"]:
    _vllm_rows(model, settings, requests, keep)
  return rows


def _vllm_rows(model, settings, requests, keep) -> None:
  import tempfile  # pylint: disable=g-import-not-at-top

  from rljax import models  # pylint: disable=g-import-not-at-top
  from rljax.rollout import vllm_sidecar  # pylint: disable=g-import-not-at-top

  longest = max(
    len(p) + s.max_new_tokens for ps, s, _ in requests.values() for p in ps
  )
  for quant in settings["quants"]:
    with tempfile.TemporaryDirectory() as workdir:
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
        continue
      config = vllm_sidecar.VLLMSidecarConfig(
        max_model_len=longest + 16,
        cpu_kvcache_gib=settings["vllm_kv_gib"],
        max_concurrent_requests=max(
          len(ps) * s.n for ps, s, _ in requests.values()
        ),
        extra_args=(
          "--max-num-batched-tokens",
          str(settings["vllm_batched_tokens"]),
        ),
      )
      with vllm_sidecar.VLLMSidecar(
        ckpt, config, model_config=model.config
      ) as eng:
        eng.generate(
          [next(iter(requests.values()))[0][0]],
          base.SamplingConfig(n=1, max_new_tokens=4),
        )
        for workload, (prompts, sampling, limits) in requests.items():
          keep(bench_vllm(eng, quant, prompts, sampling, limits), workload)
