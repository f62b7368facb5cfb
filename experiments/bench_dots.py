"""Which matmul kernels XLA picks per dtype on this device, and how fast.

For each operand/accumulator pair the sampler and the update step use —
f32, bf16→bf16, bf16→f32 accumulate, int8→int32 (W8A8 INT8), e4m3→f32 (FP8)
— it jits an m×k @ k×n dot, times it (best of --repeats after a warm-up),
and reads the compiled program for what the dot became: a cuBLAS / cuBLASLt
custom call (tensor cores on a GPU), a Triton GEMM fusion, oneDNN on a CPU,
or a plain XLA loop. Then it does the same for `rljax.quant.qdot` (the
quantized kernel the JAX sampler calls) at one decode step's shape of a model
preset, so the answer covers the code that runs, not only a bare dot.

  python experiments/bench_dots.py                       # 8192³ on GPU, 2048³ on CPU
  python experiments/bench_dots.py --model=qwen2.5-0.5b --rows=128 --out=dots.json

FP8 dots exist natively only on GPUs of compute capability ≥ 8.9 (H100: 9.0);
off GPU the e4m3 row multiplies upcast codes in f32 (what `qdot` does there).
"""

from __future__ import annotations

import json
import os
import re
import time

from absl import app, flags
import jax
import jax.numpy as jnp

from rljax import hostmem
from rljax import models
from rljax import quant

_SIZE = flags.DEFINE_integer(
  "size", 0, "m = k = n of the bare dot (0: 8192 on GPU, 2048 elsewhere)."
)
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed runs per dot.")
_MODEL = flags.DEFINE_string(
  "model", "qwen2.5-0.5b", "Preset whose MLP up-projection shape qdot uses."
)
_ROWS = flags.DEFINE_integer(
  "rows", 128, "Activation rows of the qdot check (decode batch)."
)
_OUT = flags.DEFINE_string("out", "", "Write the rows as JSON here.")

# (name, operand dtype, accumulator dtype)
_KINDS = (
  ("f32", jnp.float32, jnp.float32),
  ("bf16", jnp.bfloat16, jnp.bfloat16),
  ("bf16_f32acc", jnp.bfloat16, jnp.float32),
  ("int8_int32acc", jnp.int8, jnp.int32),
  ("e4m3_f32acc", jnp.float8_e4m3fn, jnp.float32),
)

_KERNEL_PATTERNS = (
  r'custom_call_target="([^"]+)"',
  r"(__triton_gemm|__triton[a-z_]*)",
  r"(onednn|__onednn[^\s,\"]*)",
)


def kernels_of(compiled) -> list[str]:
  """The custom-call targets / GEMM backends named in the compiled HLO."""
  text = compiled.as_text()
  found = []
  for pat in _KERNEL_PATTERNS:
    found += re.findall(pat, text)
  if not found and re.search(r"\bdot\(", text):
    found.append("xla-dot")
  return sorted(set(found))


def _operand(key, shape, dtype):
  x = jax.random.normal(key, shape, jnp.float32)
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.clip(jnp.round(x * 40), -127, 127).astype(dtype)
  return x.astype(dtype)


def time_dot(m, k, n, dtype, acc, repeats) -> dict:
  ka, kb = jax.random.split(jax.random.PRNGKey(0))
  a, b = _operand(ka, (m, k), dtype), _operand(kb, (k, n), dtype)
  if dtype == jnp.float8_e4m3fn and jax.default_backend() != "gpu":
    # No native FP8 dot off GPU: the emulation qdot uses.
    def f(x, y):
      return jnp.matmul(x.astype(jnp.float32), y.astype(jnp.float32))
  else:

    def f(x, y):
      return jax.lax.dot_general(
        x, y, (((1,), (0,)), ((), ())), preferred_element_type=acc
      )

  return _time(jax.jit(f), (a, b), 2.0 * m * k * n, repeats)


def _time(fn, args, flops, repeats) -> dict:
  try:
    compiled = fn.lower(*args).compile()
  except Exception as e:  # pylint: disable=broad-except
    return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
  jax.block_until_ready(compiled(*args))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    best = min(best, time.perf_counter() - t0)
  return {
    "seconds": best,
    "tflops": flops / best / 1e12,
    "kernels": kernels_of(compiled),
  }


def time_qdot(config, rows, mode, repeats) -> dict:
  """qdot on [rows, hidden] @ [hidden, intermediate] (the MLP up-projection)."""
  k, n = config.hidden_size, config.intermediate_size
  kx, kw = jax.random.split(jax.random.PRNGKey(1))
  x = jax.random.normal(kx, (rows, k), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(kw, (k, n), jnp.float32) * 0.02
  if mode == "bf16":
    kernel = w.astype(jnp.bfloat16)
  else:
    kernel = quant.quantize(w, mode)
  return _time(
    jax.jit(quant.qdot), (x, kernel), 2.0 * rows * k * n, repeats
  ) | {"shape": [rows, k, n], "mode": mode}


def main(argv):
  del argv
  backend = jax.default_backend()
  size = _SIZE.value or (8192 if backend == "gpu" else 2048)
  out = {
    "device": jax.devices()[0].device_kind,
    "backend": backend,
    "jax": jax.__version__,
    "size": size,
    "dots": {},
    "qdot": {},
  }
  print(f"device: {out['device']} ({backend}), jax {jax.__version__}")
  print(f"{'dot':<16}{'TFLOP/s (TOP/s)':>16}  kernels")
  for name, dtype, acc in _KINDS:
    row = time_dot(size, size, size, dtype, acc, _REPEATS.value)
    out["dots"][name] = row
    if "error" in row:
      print(f"{name:<16}{'failed':>16}  {row['error']}")
    else:
      print(f"{name:<16}{row['tflops']:>16.1f}  {', '.join(row['kernels'])}")
  config = models.preset(_MODEL.value)
  print(f"\nqdot at {_MODEL.value}'s MLP up-projection, {_ROWS.value} rows:")
  for mode in ("bf16", "int8", "fp8"):
    row = time_qdot(config, _ROWS.value, mode, _REPEATS.value)
    out["qdot"][mode] = row
    if "error" in row:
      print(f"{mode:<16}{'failed':>16}  {row['error']}")
    else:
      print(
        f"{mode:<16}{row['tflops']:>16.2f}  {row['seconds'] * 1e6:.1f} us  "
        f"{', '.join(row['kernels'])}"
      )
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
