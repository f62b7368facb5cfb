"""What a speculative verify step costs against a plain decode step.

  python experiments/profile_verify_step.py --model=smollm2-135m-instruct \
      --quant=bf16 --slots=32 --length=256

Times, interleaved (repeat r of every configuration before repeat r + 1 of
any), `slot_program.decode_chunk` on a bucket of B live rows (B in the
plan's row buckets) and `spec_verify.verify_chunk` on B rows of T
positions ((B, T) in `spec_verify.verify_shapes`), each row with --length
own tokens in the pool and a --prompt_len prompt its --n siblings share,
--steps steps a call, the best of --repeats calls after a compile call.
A verify step's cost does not depend on what it accepts, so its drafts
are padding and it never leaves early.

Prints ms per step, the cost of each shape relative to the plain step of
the smallest bucket, and the fit ms = a + b·M over M = B·T tokens a step
(plain steps: T = 1): b / a is the `SpecConfig.step_token_cost` β the
speculator's width choice weighs. Writes the rows as JSON to --out.
"""

from __future__ import annotations

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
from rljax.rollout import sampler_weights
from rljax.rollout import slot_program
from rljax.rollout import spec_verify
from rljax.rollout.jax_sampler import JaxSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_model  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from machine import machine_info  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "Model preset.")
_RANDOM_INIT = flags.DEFINE_bool(
  "random_init", False, "Random weights of --model's shape (no checkpoint)."
)
_QUANT = flags.DEFINE_string("quant", "bf16", "Rollout weights (JaxSampler).")
_SLOTS = flags.DEFINE_integer("slots", 32, "S, the largest row bucket.")
_LENGTH = flags.DEFINE_integer("length", 256, "Own tokens a row.")
_N = flags.DEFINE_integer("n", 8, "Rows sharing a prompt.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens.")
_STEPS = flags.DEFINE_integer("steps", 4, "Steps a timed call.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls; the best counts.")
_OUT = flags.DEFINE_string("out", None, "Write the rows as JSON here.")


class Shape:
  """One profiled shape: B rows, T positions each (T = 1: plain)."""

  def __init__(self, sampler, rows: int, width: int):
    self.rows_count, self.width = rows, width
    config = self.config = sampler.rollout_config
    slots, n = _SLOTS.value, _N.value
    sampling = base.SamplingConfig(
      n=n, max_new_tokens=_LENGTH.value + _STEPS.value * width + 1
    )
    groups = -(-slots // n)
    plan = self.plan = slot_plan.make_plan(
      config,
      sampling,
      slots=slots,
      prompt_len=_PROMPT_LEN.value,
      chunk_steps=_STEPS.value,
      pad_id=0,
      cache_dtype=sampler_weights.paged_cache_dtype(
        None, sampler.quant, sampler.params
      ),
      activation_dtype=sampler.activation_dtype,
      entries=groups,
    )
    self.params = slot_plan.prepare_params(sampler.params, False)[1]
    self.pool = slot_program.init_pool(config, plan)
    wp, w = plan.prompt_pages, plan.own_pages
    self.prefix = attention_lib.Prefix(
      np.arange(groups * wp, dtype=np.int32).reshape(groups, wp),
      np.zeros((groups,), np.int32),
      np.full((groups,), plan.prompt_len, np.int32),
    )
    self.table = groups * wp + np.arange(rows * w, dtype=np.int32).reshape(
      rows, w
    )
    state = slot_plan.empty_rows(plan, rows)
    state["done"][:] = False
    state["length"][:] = _LENGTH.value
    state["pos"][:] = plan.prompt_len + _LENGTH.value
    state["limit"][:] = 10**6
    state["entry"] = np.arange(rows, dtype=np.int32) // n
    self.state = state
    self.traced = slot_plan.traced_args(base.SamplingConfig(n=1))
    self.times = []

  def call(self) -> float:
    start = time.perf_counter()
    steps = jnp.int32(_STEPS.value)
    if self.width == 1:
      out = slot_program.decode_chunk(
        self.config, self.plan, self.params, self.pool, self.state,
        self.table, self.prefix, *self.traced, steps, jnp.int32(0),
      )  # fmt: skip
    else:
      b, d = self.rows_count, 32
      out = spec_verify.verify_chunk(
        self.config, self.plan, self.width, self.params, self.pool,
        self.state, self.table, self.prefix, np.zeros((b, d), np.int32),
        np.full((b,), d, np.int32), np.full((b,), self.width - 1, np.int32),
        *self.traced, steps, jnp.int32(0), jnp.int32(-1),
      )  # fmt: skip
    jax.block_until_ready(out)
    self.pool = out[0]
    return time.perf_counter() - start

  def row(self) -> dict:
    ms = 1e3 * min(self.times) / _STEPS.value
    return {
      "rows": self.rows_count,
      "width": self.width,
      "tokens": self.rows_count * self.width,
      "ms_per_step": ms,
      "ms_median": 1e3 * float(np.median(self.times)) / _STEPS.value,
    }


def main(argv):
  del argv
  model = bench_model.load(_MODEL.value, _RANDOM_INIT.value)
  config, params = model.config, model.params
  sampler = JaxSampler(config, params, quant=_QUANT.value)
  machine = machine_info()
  print(json.dumps({"machine": machine, "load": os.getloadavg()}), flush=True)
  slots = _SLOTS.value
  shapes = [Shape(sampler, b, 1) for b in slot_program.row_buckets(slots)]
  shapes += [Shape(sampler, b, t) for b, t in spec_verify.verify_shapes(slots)]
  for s in shapes:  # the compile calls
    s.call()
  for _ in range(_REPEATS.value):
    for s in shapes:
      s.times.append(s.call())
  rows = [s.row() for s in shapes]
  base_ms = min(r["ms_per_step"] for r in rows if r["width"] == 1)
  x = np.array([[1.0, r["tokens"]] for r in rows])
  (a, b), *_ = np.linalg.lstsq(
    x, np.array([r["ms_per_step"] for r in rows]), rcond=None
  )
  print("| rows B | width T | tokens B·T | ms/step | median | vs plain |")
  print("|---:|---:|---:|---:|---:|---:|")
  for r in rows:
    r["relative"] = r["ms_per_step"] / base_ms
    print(
      f"| {r['rows']} | {r['width']} | {r['tokens']} | "
      f"{r['ms_per_step']:.1f} | {r['ms_median']:.1f} | "
      f"{r['relative']:.2f} |"
    )
  print(f"fit: ms/step = {a:.1f} + {b:.3f}·(B·T); beta = b/a = {b / a:.4f}")
  load = os.getloadavg()
  print(json.dumps({"load_after": load}))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(
        {
          "machine": machine,
          "quant": _QUANT.value,
          "length": _LENGTH.value,
          "slots": slots,
          "rows": rows,
          "fit": {"a_ms": a, "b_ms": b, "beta": b / a},
          "load_after": load,
        },
        f,
        indent=1,
      )


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
