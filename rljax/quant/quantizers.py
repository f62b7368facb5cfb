"""Weight quantizers: float kernel -> `QTensor`, and back.

Symmetric, no zero point, one scale per output channel (or per tensor), as
QuRL §5 and vLLM's compressed-tensors W8A8 schemes use:

  INT8:      s = max_i |w_i| / 127,   q = clip(round(w / s), -127, 127)
  FP8 e4m3:  s = max_i |w_i| / 448,   q = fp8_e4m3fn(clip(w / s, -448, 448))

with the max taken over the input dimension of the kernel (Flax layout
`[..., in, out]`, so `axis=-2`), and `w ≈ q * s`. Rounding is round-half-to-
even, the rule of `torch.round` and of XLA's float8 conversion.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from rljax.quant import qtensor
from rljax.quant.qtensor import QTensor


def _check_float_kernel(w, name: str) -> None:
  if not hasattr(w, "dtype") or not jnp.issubdtype(w.dtype, jnp.floating):
    raise TypeError(
      f"{name}: expected a float array, got {type(w).__name__} with dtype "
      f"{getattr(w, 'dtype', None)}"
    )
  if w.ndim < 2:
    raise ValueError(
      f"{name}: expected a kernel of rank >= 2 ([..., in, out]), got shape "
      f"{tuple(w.shape)}"
    )


def _amax_scale(w: jax.Array, axes: tuple[int, ...], qmax: float) -> jax.Array:
  amax = jnp.max(jnp.abs(w.astype(jnp.float32)), axis=axes, keepdims=True)
  return amax / qmax


def _safe_divide(w: jax.Array, scale: jax.Array) -> jax.Array:
  # An all-zero channel has scale 0; its codes are 0 and `q * s` is still 0.
  return w.astype(jnp.float32) / jnp.where(scale == 0, 1.0, scale)


def quantize_int8(
  w: Float[Array, "... d_in d_out"],
  axis: int = -2,
  mode: str = "int8",
  fake: bool = False,
) -> QTensor:
  """Symmetric INT8 with one scale per slice along `axis`.

  s = max_{axis} |w| / 127,  q = clip(round(w / s), -127, 127).
  Every element satisfies |q·s − w| ≤ s/2 (up to float rounding).

  Args:
    w: float kernel `[..., in, out]`.
    axis: the reduced (input) axis; -2 gives per-output-channel scales of shape
      `[..., 1, out]`.
    mode: `"int8"` (W8A8) or `"int8_wo"` (weight-only), stored on the QTensor.
    fake: stored on the QTensor; selects the float emulation in `qdot`.

  Returns:
    `QTensor(value int8, scale float32 with `axis` kept as size 1)`.
  """
  _check_float_kernel(w, "quantize_int8(w)")
  if mode not in ("int8", "int8_wo"):
    raise ValueError(
      f"quantize_int8: mode={mode!r}; expected 'int8' or 'int8_wo'"
    )
  if not -w.ndim <= axis < w.ndim:
    raise ValueError(
      f"quantize_int8: axis={axis} out of range for shape {tuple(w.shape)}"
    )
  scale = _amax_scale(w, (axis,), qtensor.INT8_MAX)
  q = jnp.clip(
    jnp.round(_safe_divide(w, scale)), -qtensor.INT8_MAX, qtensor.INT8_MAX
  )
  return QTensor(q.astype(jnp.int8), scale, mode=mode, fake=fake)


def quantize_fp8(
  w: Float[Array, "... d_in d_out"],
  per_tensor: bool = False,
  fake: bool = False,
) -> QTensor:
  """FP8 e4m3 (float8_e4m3fn) with a per-output-channel or per-matrix scale.

  s = max |w| / 448 (over the input axis, or over the last two axes when
  `per_tensor`), q = e4m3(w / s). e4m3 has 3 mantissa bits, so for normal
  values (|w/s| ≥ 2^-6) the rounding error is at most 2^-4·|w| and below
  that (subnormals) at most 2^-10·s.

  Args:
    w: float kernel `[..., in, out]`.
    per_tensor: one scale per matrix (`[..., 1, 1]`) instead of per output
      channel (`[..., 1, out]`). Leading axes (stacked layers) keep their own
      scales either way.
    fake: stored on the QTensor; selects the float emulation in `qdot`.
  """
  _check_float_kernel(w, "quantize_fp8(w)")
  axes = (-2, -1) if per_tensor else (-2,)
  scale = _amax_scale(w, axes, qtensor.FP8_E4M3_MAX)
  q = jnp.clip(
    _safe_divide(w, scale), -qtensor.FP8_E4M3_MAX, qtensor.FP8_E4M3_MAX
  )
  return QTensor(q.astype(jnp.float8_e4m3fn), scale, mode="fp8", fake=fake)


def dequantize(q: QTensor, dtype=jnp.float32) -> jax.Array:
  """`q.value * q.scale` in `dtype` (computed in float32)."""
  if not isinstance(q, QTensor):
    raise TypeError(
      f"dequantize(q): expected a QTensor, got {type(q).__name__}"
    )
  return q.dequantize(dtype)


def quantize(
  w: jax.Array, mode: str, fake: bool = False, per_tensor: bool = False
) -> QTensor:
  """Dispatch on `mode` (one of `qtensor.MODES`) for a kernel `[..., in, out]`."""
  if mode in ("int8", "int8_wo"):
    if per_tensor:
      raise ValueError(
        f"quantize: per_tensor=True is only supported for mode='fp8', "
        f"got mode={mode!r}"
      )
    return quantize_int8(w, axis=-2, mode=mode, fake=fake)
  if mode == "fp8":
    return quantize_fp8(w, per_tensor=per_tensor, fake=fake)
  raise ValueError(f"quantize: mode={mode!r}; expected one of {qtensor.MODES}")
