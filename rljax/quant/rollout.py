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

from rljax.quant import params as qparams_lib
from rljax.quant import qtensor

# Every rollout weight format (the one vocabulary of rljax): the float ones,
# then the quantized `QTensor` modes.
FLOAT_MODES = ("none", "f32", "bf16")
ROLLOUT_MODES = FLOAT_MODES + qtensor.MODES


def is_quantized(mode: str) -> bool:
  """True for the modes whose rollout weights are `QTensor`s."""
  return mode in qtensor.MODES


def prepare_rollout_weights(
  config: Any, params: Any, mode: str, fake: bool = False
) -> Any:
  """The rollout tree for `mode`, in fresh buffers.

  Args:
    config: the decoder config.
    params: full-precision θ (UAQ-folded when the run uses it).
    mode: one of `ROLLOUT_MODES`: "int8" / "int8_wo" / "fp8" quantize the
      projection kernels (`quantize_params`); "bf16" casts every leaf;
      "none" / "f32" copy θ as is.
    fake: quantize-dequantize emulation of the quantized matmuls.

  Returns:
    A tree sharing no buffer with `params` (the update step donates θ's).
  """
  if mode not in ROLLOUT_MODES:
    raise ValueError(
      f"prepare_rollout_weights: mode={mode!r}; expected one of {ROLLOUT_MODES}"
    )
  if is_quantized(mode) or mode == "bf16":
    return _converted(config, mode, fake, params)
  # Eager on purpose: jit forwards an unchanged input buffer to its output,
  # and this copy must not alias θ.
  return jax.tree.map(jnp.copy, params)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _converted(config: Any, mode: str, fake: bool, params: Any) -> Any:
  # One program per (config, mode): eager quantization dispatches a dozen ops
  # per kernel (1.5 s per sync for SmolLM2-135M INT8 on 2 CPU cores, against
  # ~0.1 s jitted), and the trainer pays it at every step.
  if mode == "bf16":
    return jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  return qparams_lib.quantize_params(config, params, mode=mode, fake=fake)
