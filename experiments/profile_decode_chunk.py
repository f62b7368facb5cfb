"""What a continuous-batching decode step costs, by row bucket, row length,
cache dtype and attention implementation.

  python experiments/profile_decode_chunk.py --model=smollm2-135m-instruct \
      --slots=1,2,4,8,16,32 --lengths=64,512 --cache_dtypes=float32,bfloat16 \
      --attention=native,xla --quant=bf16

Times `slot_program.decode_chunk` alone: a bucket of S live rows, each
with L own tokens already in the pool (and a prompt of --prompt_len in the
entry pages its --n siblings share; --share=0 gives every row its own copy
of the prompt), `--steps` decode steps a call, the best of `--repeats`
calls after a compile call. The configurations are interleaved: repeat r
of every configuration runs before repeat r + 1 of any, so a machine whose
load changes during the run biases no configuration.

Prints ms per decode step (wall and CPU: all threads' CPU time, the work,
which other processes on a shared host disturb less than the wall time)
and tokens/s per configuration, and per (cache dtype, attention) the
least-squares fits of the cost model

  ms per step = a + b·S + c·S·(L + Lp/n)

a: what a step costs whatever its rows (the weights read once, the LM head
setup, the loop); b: each row's matmuls and sampling; c: each row-token of
attention (own tokens, plus its share of the prompt it reads with its
siblings). The fit is what the scheduler's row buckets and the kernel's
ragged reads are measured against (docs/performance.md). Writes the rows as
JSON to --out.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from rljax import hostmem
from rljax.rollout import base
from rljax.rollout import paged_attention as attention_lib
from rljax.rollout import slot_plan
from rljax.rollout import slot_program
from rljax.rollout.jax_sampler import JaxSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_model  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from machine import machine_info  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "Model preset.")
_RANDOM_INIT = flags.DEFINE_bool(
  "random_init", False, "Random weights of --model's shape (no checkpoint)."
)
_QUANT = flags.DEFINE_string("quant", "bf16", "Rollout weights (JaxSampler).")
_SLOTS = flags.DEFINE_list("slots", ["1", "2", "4", "8", "16", "32"], "S.")
_LENGTHS = flags.DEFINE_list("lengths", ["64", "512"], "Own tokens a row, L.")
_CACHE_DTYPES = flags.DEFINE_list(
  "cache_dtypes", ["float32", "bfloat16"], "The pool's dtypes."
)
_ATTENTION = flags.DEFINE_list(
  "attention", ["native", "xla"], "paged_attention implementations."
)
_PAGE_SIZE = flags.DEFINE_integer("page_size", 16, "Token slots a page.")
_N = flags.DEFINE_integer("n", 8, "Rows sharing a prompt (siblings).")
_SHARE = flags.DEFINE_bool(
  "share", True, "Siblings share their prompt's pages (else one copy each)."
)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens, Lp.")
_STEPS = flags.DEFINE_integer("steps", 8, "Decode steps a timed call.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls; the best counts.")
_OUT = flags.DEFINE_string("out", None, "Write the rows as JSON here.")


_PARAMS: dict[int, object] = {}


def _decode_params(sampler):
  """The sampler's weights as the decode program reads them, made once:
  every configuration reads the same buffers (a copy each would hold the
  weights once per configuration)."""
  if id(sampler) not in _PARAMS:
    _PARAMS[id(sampler)] = slot_plan.prepare_params(sampler.params, False)[1]
  return _PARAMS[id(sampler)]


class Config:
  """One profiled configuration: its plan, pool, rows and tables."""

  def __init__(self, sampler, slots, length, dtype, attention):
    self.key = dict(
      slots=slots, length=length, cache_dtype=dtype, attention=attention
    )
    config = sampler.rollout_config
    self.config = config
    page = _PAGE_SIZE.value
    sampling = base.SamplingConfig(
      n=min(_N.value, slots), max_new_tokens=length + _STEPS.value + 1
    )
    os.environ[attention_lib.IMPL_ENV] = attention
    groups = -(-slots // sampling.n) if _SHARE.value else slots
    self.plan = slot_plan.make_plan(
      config,
      sampling,
      slots=slots,
      prompt_len=_PROMPT_LEN.value,
      chunk_steps=_STEPS.value,
      pad_id=0,
      cache_dtype=dtype,
      activation_dtype=sampler.activation_dtype,
      page_size=page,
      entries=groups,
    )
    plan = self.plan
    self.params = _decode_params(sampler)
    self.pool = slot_program.init_pool(config, plan)
    # Entry e's prompt in pages e·Wp ..; row r's own pages after them.
    wp, w = plan.prompt_pages, plan.own_pages
    self.prefix = attention_lib.Prefix(
      np.arange(groups * wp, dtype=np.int32).reshape(groups, wp),
      np.zeros((groups,), np.int32),
      np.full((groups,), plan.prompt_len, np.int32),
    )
    self.table = groups * wp + np.arange(slots * w, dtype=np.int32).reshape(
      slots, w
    )
    rows = slot_plan.empty_rows(plan, slots)
    rows["done"][:] = False
    rows["length"][:] = length
    rows["pos"][:] = plan.prompt_len + length
    rows["limit"][:] = 10**6
    rows["entry"] = (
      np.arange(slots, dtype=np.int32) // sampling.n
      if _SHARE.value
      else np.arange(slots, dtype=np.int32)
    )
    self.rows = rows
    self.traced = slot_plan.traced_args(base.SamplingConfig(n=1))
    self.times, self.cpu = [], []

  def call(self):
    start, cpu = time.perf_counter(), time.process_time()
    out = slot_program.decode_chunk(
      self.config,
      self.plan,
      self.params,
      self.pool,
      self.rows,
      self.table,
      self.prefix,
      *self.traced,
      jnp.int32(_STEPS.value),
      jnp.int32(0),
    )
    jax.block_until_ready(out)
    self.pool = out[0]
    self.cpu.append(time.process_time() - cpu)
    return time.perf_counter() - start

  def row(self) -> dict:
    ms = 1e3 * min(self.times) / _STEPS.value
    return {
      **self.key,
      "ms_per_step": ms,
      "ms_median": 1e3 * float(np.median(self.times)) / _STEPS.value,
      # CPU milliseconds of all the process's threads per step: the work,
      # less disturbed than wall time when other processes load the host.
      "cpu_ms_per_step": 1e3 * min(self.cpu) / _STEPS.value,
      "tokens_per_s": self.key["slots"] / ms * 1e3,
      "share": _SHARE.value,
      "page_size": _PAGE_SIZE.value,
    }


def fit(rows: list[dict], n: int, prompt_len: int, field="ms_per_step"):
  """Least squares of ms = a + b·S + c·S·(L + Lp/n): (a, b, c)."""
  x = np.array(
    [
      [1.0, r["slots"], r["slots"] * (r["length"] + prompt_len / n)]
      for r in rows
    ]
  )
  y = np.array([r[field] for r in rows])
  coef, *_ = np.linalg.lstsq(x, y, rcond=None)
  return coef


def main(argv):
  del argv
  # "tiny": a dry run of this script (tests/experiments).
  model = bench_model.load(_MODEL.value, _RANDOM_INIT.value)
  config, params = model.config, model.params
  sampler = JaxSampler(config, params, quant=_QUANT.value)
  machine = machine_info()
  print(json.dumps({"machine": machine, "load": os.getloadavg()}))
  configs = [
    Config(sampler, int(s), int(length), dtype, attention)
    for attention, dtype, s, length in itertools.product(
      _ATTENTION.value, _CACHE_DTYPES.value, _SLOTS.value, _LENGTHS.value
    )
  ]
  for c in configs:  # the compile calls
    c.call()
    c.cpu = []
  for _ in range(_REPEATS.value):
    for c in configs:
      c.times.append(c.call())
  rows = [c.row() for c in configs]
  for r in rows:
    print(json.dumps(r), flush=True)
  n = min(_N.value, max(r["slots"] for r in rows)) if _SHARE.value else 1
  fits = {}
  for attention, dtype in itertools.product(
    _ATTENTION.value, _CACHE_DTYPES.value
  ):
    mine = [
      r
      for r in rows
      if (r["attention"], r["cache_dtype"]) == (attention, dtype)
    ]
    if len({(r["slots"], r["length"]) for r in mine}) < 3:
      continue
    for field, what in (("ms_per_step", "wall"), ("cpu_ms_per_step", "CPU")):
      a, b, c = fit(mine, n, _PROMPT_LEN.value, field)
      fits[f"{attention}/{dtype}/{what}"] = {
        "a_ms": a,
        "b_ms": b,
        "c_us": 1e3 * c,
      }
      print(
        f"{attention} {dtype}: {what} ms/step = {a:.1f} + {b:.3f}·S + "
        f"{1e3 * c:.2f}e-3·S·(L + Lp/n)"
      )
  print(
    "| attention | cache | S | L | ms/step | median | CPU ms/step | tok/s |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|"
  )
  for r in rows:
    print(
      f"| {r['attention']} | {r['cache_dtype']} | {r['slots']} | "
      f"{r['length']} | {r['ms_per_step']:.1f} | {r['ms_median']:.1f} | "
      f"{r['cpu_ms_per_step']:.1f} | {r['tokens_per_s']:.0f} |"
    )
  print(json.dumps({"load_after": os.getloadavg()}))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(
        {
          "machine": machine,
          "quant": _QUANT.value,
          "prompt_len": _PROMPT_LEN.value,
          "n": _N.value,
          "rows": rows,
          "fits": fits,
        },
        f,
        indent=1,
      )


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
