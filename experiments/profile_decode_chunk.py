"""What a continuous-batching decode step costs, by slots and own-cache size.

  python experiments/profile_decode_chunk.py --model=smollm2-135m-instruct \
      --slots=16,32 --capacities=64,128,256,512 --page_sizes=0,16

Times `slot_program.decode_chunk` alone (every row live, `--steps` decode
steps a call, the best of `--repeats` calls after a compile call) for each
(slots S, own-cache capacity C, page size P) and prints ms per decode step
and tokens/s. The attention over the own cache is dense over its C slots
whatever the rows' lengths, so the step time at C splits into a part that
does not grow with C (the weights' matmuls, sampling, the prompt's keys)
and one that grows with it (the own cache's reads and writes; with pages,
their gather too): the fit `ms = a + b·C` per (S, P) is printed with them.
That split is what bounds the RL-shaped workloads' tokens/s
(`bench_rollout.py --workloads`): a long-tailed rollout spends most of its
steps at a large C with few live rows. Writes the rows as JSON to --out.
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
from rljax import models
from rljax.rollout import base
from rljax.rollout import slot_plan
from rljax.rollout import slot_program
from rljax.rollout.jax_sampler import JaxSampler
from rljax.rollout.token_sampling import sample_keys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "Model preset.")
_RANDOM_INIT = flags.DEFINE_bool(
  "random_init", False, "Random weights of --model's shape (no checkpoint)."
)
_QUANT = flags.DEFINE_string("quant", "bf16", "Rollout weights (JaxSampler).")
_SLOTS = flags.DEFINE_list("slots", ["16", "32"], "Slot counts S.")
_CAPACITIES = flags.DEFINE_list(
  "capacities", ["64", "128", "256", "512"], "Own-cache capacities C."
)
_PAGE_SIZES = flags.DEFINE_list(
  "page_sizes", ["0", "16"], "0: contiguous own cache; P: pages of P slots."
)
_CACHE_DTYPE = flags.DEFINE_enum(
  "cache_dtype",
  "auto",
  ["auto", "float32", "bfloat16"],
  "KV cache dtype (auto: the sampler's default for --quant on this backend).",
)
_N = flags.DEFINE_integer("n", 8, "Rows per slot group (samples a prompt).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Prompt bucket Lp.")
_STEPS = flags.DEFINE_integer("steps", 16, "Decode steps a timed call.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls; the best counts.")
_OUT = flags.DEFINE_string("out", None, "Write the rows as JSON here.")


def _live_state(config, params, plan, capacity: int, pages: int):
  """Every slot live, its prompt prefilled, its limit out of reach."""
  groups, n = plan.groups, plan.n
  state = slot_program.init_state(config, plan, pages or capacity)
  keys = sample_keys(
    0,
    jnp.repeat(jnp.arange(groups, dtype=jnp.int32), n),
    jnp.tile(jnp.arange(n, dtype=jnp.int32), groups),
  )
  state, _, _ = slot_program.prefill_groups(
    config,
    plan,
    params,
    state,
    jnp.full((groups, plan.prompt_len), 7, jnp.int32),
    jnp.ones((groups, plan.prompt_len), jnp.int32),
    jnp.arange(groups, dtype=jnp.int32),
    jax.random.key_data(keys),
    jnp.full((plan.slots,), 10**6, jnp.int32),
    *slot_plan.traced_args(base.SamplingConfig(n=n), 10**6),
  )
  return state


def cache_dtype(sampler):
  if _CACHE_DTYPE.value == "auto":
    return sampler._default_cache_dtype()  # pylint: disable=protected-access
  return jnp.dtype(_CACHE_DTYPE.value)


def profile(sampler, slots: int, capacity: int, page_size: int) -> dict:
  config = sampler.rollout_config
  prefill, decode = slot_plan.prepare_params(sampler.params, False)
  sampling = base.SamplingConfig(n=_N.value, temperature=1.0, seed=0)
  plan = slot_plan.make_plan(
    sampling,
    slots // _N.value,
    _PROMPT_LEN.value,
    _STEPS.value,
    0,
    cache_dtype(sampler),
    sampler.activation_dtype,
    _N.value,
    page_size,
  )
  width = -(-capacity // page_size) if page_size else 0
  pages = plan.slots * width
  table = (
    jnp.arange(pages, dtype=jnp.int32).reshape(plan.slots, width)
    if page_size
    else None
  )
  state = _live_state(config, prefill, plan, capacity, pages)
  traced = slot_plan.traced_args(sampling, 10**6)
  times = []
  for i in range(_REPEATS.value + 1):
    start = time.perf_counter()
    out = slot_program.decode_chunk(
      config,
      plan,
      decode,
      state,
      *traced,
      jnp.int32(_STEPS.value),
      jnp.int32(plan.groups + 1),
      table,
    )
    jax.block_until_ready(out)
    state = out[0]
    if i:  # the first call compiles
      times.append(time.perf_counter() - start)
    # Back to the chunk's first slots, so C is never outgrown.
    state = {**state, "length": jnp.ones_like(state["length"])}
  ms = 1e3 * min(times) / _STEPS.value
  return {
    "slots": slots,
    "capacity": capacity,
    "page_size": page_size,
    "cache_dtype": str(jnp.dtype(cache_dtype(sampler))),
    "ms_per_step": ms,
    "tokens_per_s": slots / ms * 1e3,
    "kv_bytes": slot_program.kv_bytes(config, plan, pages or capacity),
  }


def main(argv):
  del argv
  if _RANDOM_INIT.value:
    # "tiny": a dry run of this script (tests/experiments).
    config = (
      models.tiny_config()
      if _MODEL.value == "tiny"
      else models.preset(_MODEL.value)
    )
    params = models.init_params(config, jax.random.key(0))
  else:
    model = models.load_pretrained(_MODEL.value)
    config, params = model.config, model.params
  sampler = JaxSampler(config, params, quant=_QUANT.value)
  machine = machine_info()
  print(json.dumps({"machine": machine}))
  rows = []
  for slots in map(int, _SLOTS.value):
    for page_size in map(int, _PAGE_SIZES.value):
      for capacity in map(int, _CAPACITIES.value):
        row = profile(sampler, slots, capacity, page_size)
        rows.append(row)
        print(json.dumps(row), flush=True)
      mine = [
        r for r in rows if (r["slots"], r["page_size"]) == (slots, page_size)
      ]
      if len(mine) > 1:
        b, a = np.polyfit(
          [r["capacity"] for r in mine], [r["ms_per_step"] for r in mine], 1
        )
        at = mine[-1]["capacity"]
        print(
          f"S={slots} P={page_size}: ms/step = {a:.1f} + {b * 1e3:.2f}e-3·C "
          f"(at C={at}: {b * at / (a + b * at):.0%} of the step grows with C)"
        )
  print(
    "| S | P | C | ms/step | tok/s | KV MiB |\n|---:|---:|---:|---:|---:|---:|"
  )
  for r in rows:
    print(
      f"| {r['slots']} | {r['page_size']} | {r['capacity']} | "
      f"{r['ms_per_step']:.1f} | {r['tokens_per_s']:.0f} | "
      f"{r['kv_bytes'] / 2**20:.1f} |"
    )
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(
        {"machine": machine, "quant": _QUANT.value, "rows": rows}, f, indent=1
      )


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
