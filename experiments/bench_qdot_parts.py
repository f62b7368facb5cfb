"""Where a W8A8 `qdot`'s time goes at the JAX sampler's decode shapes on a CPU.

At each M x K x N (decode rows x in x out of SmolLM2-135M's MLP projections,
then larger batches) it times, jitted, best of 5 x 30 calls, activations in
float32 as the CPU sampler runs them:

  int8_dot_in_out   int8 [M, K] @ int8 [K, N] -> int32 (the kernel layout
                    rljax stores)
  int8_dot_out_in   the same with the kernel stored [N, K]
  quantize_acts     `quantize_activations_int8` alone (per-token absmax,
                    round, clip, cast)
  qdot_int8         the whole W8A8 `qdot`: quantize, int8 dot, int32 -> f32
                    rescale by s_x s_w
  bf16_dot          the "bf16" sampler's dot (bf16 operands, f32 result)
  f32_dot           f32 @ f32

so qdot_int8 - int8_dot - quantize_acts is the rescale's share. The times are
microseconds per call. `experiments/bench_dots.py` times bare dots at 2048³
(8192³ on a GPU) and `qdot` with bf16 activations (the GPU sampler's).

  python experiments/bench_qdot_parts.py --out=qdot_parts.json
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags
import jax
import jax.numpy as jnp

from rljax import hostmem
from rljax import quant

_SHAPES = flags.DEFINE_list(
  "shapes",
  ["128x576x1536", "128x1536x576", "512x576x1536", "2048x576x1536"],
  "MxKxN shapes.",
)
_OUT = flags.DEFINE_string("out", "", "Write the rows as JSON here.")


def best_us(fn, *args, calls: int = 30, rounds: int = 5) -> float:
  """Best mean time per call in microseconds (after one warm-up call)."""
  fn(*args).block_until_ready()
  best = float("inf")
  for _ in range(rounds):
    t0 = time.perf_counter()
    for _ in range(calls):
      out = fn(*args)
    out.block_until_ready()
    best = min(best, (time.perf_counter() - t0) / calls)
  return best * 1e6


def parts(m: int, k: int, n: int) -> dict[str, float]:
  kx, kw = jax.random.split(jax.random.PRNGKey(0))
  x = jax.random.normal(kx, (m, k), jnp.float32)
  w = jax.random.normal(kw, (k, n), jnp.float32) * 0.05
  xq = jnp.clip(jnp.round(x * 20), -127, 127).astype(jnp.int8)
  wi = jnp.clip(jnp.round(w * 2000), -127, 127).astype(jnp.int8)
  int32 = jnp.int32
  return {
    "int8_dot_in_out": best_us(
      jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=int32)),
      xq,
      wi,
    ),
    "int8_dot_out_in": best_us(
      jax.jit(
        lambda a, b: jax.lax.dot_general(
          a, b, (((1,), (1,)), ((), ())), preferred_element_type=int32
        )
      ),
      xq,
      wi.T,
    ),
    "quantize_acts": best_us(
      jax.jit(lambda a: quant.quantize_activations_int8(a)[0]), x
    ),
    "qdot_int8": best_us(jax.jit(quant.qdot), x, quant.quantize(w, "int8")),
    "bf16_dot": best_us(jax.jit(quant.bf16_dot), x, w.astype(jnp.bfloat16)),
    "f32_dot": best_us(jax.jit(jnp.dot), x, w),
  }


def main(argv):
  del argv
  print(f"backend {jax.default_backend()}, jax {jax.__version__}")
  result = {}
  for shape in _SHAPES.value:
    try:
      m, k, n = (int(v) for v in shape.lower().split("x"))
    except ValueError:
      raise app.UsageError(
        f"--shapes: {shape!r} is not MxKxN (three integers)"
      ) from None
    row = parts(m, k, n)
    result[shape] = row
    print(shape, "  ".join(f"{name} {us:.1f}" for name, us in row.items()))
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump(result, f, indent=1)
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
