"""The weights a rollout engine runs: Q(θ), or θ in the rollout dtype.

QuRL (§3) samples from a quantized actor π_{Q(θ)}: the trainer prepares
these weights once per sync, here, so the quantization diagnostics measure
exactly the tree every engine then loads as given (no engine converts).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from rljax.quant import cpu as cpu_lib
from rljax.quant import params as qparams_lib
from rljax.quant import qtensor

# Every rollout weight format (the one vocabulary of rljax): the float ones,
# then the quantized `QTensor` modes.
FLOAT_MODES = ("none", "f32", "bf16")
ROLLOUT_MODES = FLOAT_MODES + qtensor.MODES


def is_quantized(mode: str) -> bool:
  """True for the modes whose rollout weights are `QTensor`s."""
  return mode in qtensor.MODES


def quantized_float_dtype(
  mode: str, backend: str | None = None, cpu: cpu_lib.CpuInfo | None = None
):
  """The dtype of a quantized tree's float leaves (embedding, norms, biases,
  an unquantized head), or None to keep θ's.

  On an accelerator they are bfloat16, as in vLLM's W8A8/FP8 models (their
  unquantized layers run in the model dtype): the embedding's dtype sets the
  sampler's activation dtype, so float32 leaves there would run the residual
  stream, attention, the KV cache and the [D, V] head in float32 around the
  int8/fp8 dots, and the quantized rollout would move more bytes than the
  bf16 one (H100, 2026-11-26: INT8 0.77x bf16 at 64x8x256, its head a tf32
  GEMM; docs/performance.md).

  On a CPU with bf16 dot units (`CpuInfo.fast_bf16_dot`: AMX-BF16 or
  AVX512-BF16) they are bfloat16 too, and the JAX sampler runs float32
  activations around them (`JaxSampler.activation_dtype`), as in its "bf16"
  format: the unquantized [D, V] head, a fifth of SmolLM2-135M's decode
  FLOPs, then runs as a bf16 x bf16 -> f32 dot instead of an f32 one (AMX,
  2 cores, 64x8x64: INT8 1,016 -> 1,200 tok/s, the head's dot 92 -> 20 ms
  per step; docs/performance.md, "Per-layer decode caches"). On a CPU
  without them float32 leaves stay (bf16 dots are slower than f32 there).

  Args:
    mode: one of `ROLLOUT_MODES`.
    backend: "cpu", "gpu", "tpu"; default `jax.default_backend()`.
    cpu: the CPU whose dot units decide on the "cpu" backend; default
      `cpu.host_cpu()`.
  """
  if not is_quantized(mode):
    return None
  backend = backend or jax.default_backend()
  if backend != "cpu":
    return jnp.dtype(jnp.bfloat16)
  cpu = cpu or cpu_lib.host_cpu()
  return jnp.dtype(jnp.bfloat16) if cpu.fast_bf16_dot else None


_AUTO = "auto"


def prepare_rollout_weights(
  config: Any,
  params: Any,
  mode: str,
  fake: bool = False,
  float_dtype: Any = _AUTO,
) -> Any:
  """The rollout tree for `mode`, in fresh buffers.

  Args:
    config: the decoder config.
    params: full-precision θ (UAQ-folded when the run uses it).
    mode: one of `ROLLOUT_MODES`: "int8" / "int8_wo" / "fp8" quantize the
      projection kernels (`quantize_params`); "bf16" casts every leaf;
      "none" / "f32" copy θ as is.
    fake: quantize-dequantize emulation of the quantized matmuls.
    float_dtype: quantized modes only: the dtype of the leaves that stay
      float (None keeps θ's); default `quantized_float_dtype(mode)`,
      bfloat16 on an accelerator and on a CPU with bf16 dot units.

  Returns:
    A tree sharing no buffer with `params` (the update step donates θ's).
  """
  if mode not in ROLLOUT_MODES:
    raise ValueError(
      f"prepare_rollout_weights: mode={mode!r}; expected one of {ROLLOUT_MODES}"
    )
  if isinstance(float_dtype, str) and float_dtype == _AUTO:
    float_dtype = quantized_float_dtype(mode)
  if float_dtype is not None:
    if not is_quantized(mode):
      raise ValueError(
        f"prepare_rollout_weights: float_dtype={float_dtype!r} with "
        f"mode={mode!r}; expected it only with a quantized mode {qtensor.MODES}"
      )
    float_dtype = jnp.dtype(float_dtype)
    if not jnp.issubdtype(float_dtype, jnp.floating):
      raise ValueError(
        f"prepare_rollout_weights: float_dtype={float_dtype}; expected a "
        "floating dtype (bfloat16, float16, float32)"
      )
    float_dtype = float_dtype.name
  if is_quantized(mode) or mode == "bf16":
    return _converted(config, mode, fake, float_dtype, params)
  # Eager on purpose: jit forwards an unchanged input buffer to its output,
  # and this copy must not alias θ.
  return jax.tree.map(jnp.copy, params)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _converted(
  config: Any, mode: str, fake: bool, float_dtype: str | None, params: Any
) -> Any:
  # One program per (config, mode): eager quantization dispatches a dozen ops
  # per kernel (1.5 s per sync for SmolLM2-135M INT8 on 2 CPU cores, against
  # ~0.1 s jitted), and the trainer pays it at every step.
  if mode == "bf16":
    return jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  tree = qparams_lib.quantize_params(config, params, mode=mode, fake=fake)
  if float_dtype is None:
    return tree
  # QTensors keep their codes and float32 scales.
  return jax.tree.map(
    lambda x: x if isinstance(x, qtensor.QTensor) else x.astype(float_dtype),
    tree,
    is_leaf=lambda x: isinstance(x, qtensor.QTensor),
  )
