"""bench_rollout.py --decode_ab: one decode step of a random SmolLM2-135M
with the per-row repeated KV cache against the shared prompt-prefix cache,
alternating in one process (wall and CPU ms, and their largest logit
difference)."""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp

from rljax import models


def decode_ab(
  shape: str, prompt_len: int = 64, own: int = 128, reps: int = 3
) -> dict:
  """Before/after of the shared-prefix decode step, in one process."""
  from rljax.models import decoder  # pylint: disable=g-import-not-at-top

  p, n = (int(x) for x in shape.lower().split("x"))
  b = p * n
  config = models.preset("smollm2-135m-instruct")
  params = models.init_params(config, jax.random.key(0))

  def rand(c, seed):
    return 0.3 * jax.random.normal(jax.random.key(seed), c.shape, c.dtype)

  prefix = jax.tree_util.tree_map(
    lambda c: rand(c, 1), models.init_cache(config, p, prompt_len)
  )
  cache = jax.tree_util.tree_map(
    lambda c: rand(c, 2), models.init_cache(config, b, own)
  )
  full = jax.tree_util.tree_map(
    lambda a, c: jnp.concatenate([jnp.repeat(a, n, axis=1), c], axis=2),
    prefix,
    cache,
  )
  tok = jnp.ones((b, 1), jnp.int32)
  pos = jnp.full((b, 1), prompt_len + own - 1, jnp.int32)
  old = jax.jit(
    lambda w, c: models.forward_with_cache(
      config,
      w,
      tok,
      pos,
      c,
      jnp.int32(prompt_len + own - 1),
      jnp.ones((b, prompt_len + own), jnp.int32),
    )
  )
  new = jax.jit(
    lambda w, pc, c: decoder.decode_with_prefix_cache(
      config,
      w,
      tok,
      pos,
      pc,
      jnp.ones((p, prompt_len), jnp.int32),
      c,
      jnp.int32(own - 1),
      jnp.ones((b, own), jnp.int32),
    )
  )
  runs = {
    "repeated_cache": (old, (params, full)),
    "shared_prefix": (new, (params, prefix, decoder.to_decode_cache(cache))),
  }
  outs = {k: jax.block_until_ready(f(*a))[0] for k, (f, a) in runs.items()}
  times = {k: [] for k in runs}
  for _ in range(reps):
    for k, (f, a) in runs.items():
      w0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(f(*a))
      times[k].append((time.perf_counter() - w0, time.process_time() - c0))
  result = {
    "shape": f"B={b} ({p}x{n}) prompt={prompt_len} own={own}",
    "max_abs_dlogit": float(
      jnp.max(jnp.abs(outs["repeated_cache"] - outs["shared_prefix"]))
    ),
    "load": os.getloadavg(),
  }
  for k, t in times.items():
    result[k] = {
      "wall_ms_min": 1e3 * min(x[0] for x in t),
      "cpu_ms_min": 1e3 * min(x[1] for x in t),
      "cpu_ms_all": [round(1e3 * x[1]) for x in t],
    }
  print(json.dumps(result, indent=1))
  return result
