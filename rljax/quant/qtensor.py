"""A quantized weight matrix as a pytree, and the matmul that consumes it.

This is the seam between the decoder and the quantization layer: every linear
layer of `rljax.models` multiplies through `qdot`, which accepts either a plain
float kernel or a `QTensor`. The decoder therefore runs unchanged on f32/bf16
params, on real int8 params and on fp8 params.

Layout follows Flax: a kernel is `[..., in, out]` (leading axes are stacked
layers), and per-output-channel scales are `[..., 1, out]`, so that
`dequantize(q) == q.value * q.scale` broadcasts without reshapes.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

# Modes of a quantized linear layer.
#   int8       W8A8: int8 per-channel weights, int8 dynamic per-token activations,
#              int8 x int8 -> int32 dot (QuRL §5 / vLLM compressed-tensors W8A8).
#   int8_wo    weight-only INT8 (activations stay in float).
#   fp8        W8A8 with float8_e4m3fn weights and per-token activations.
MODES = ("int8", "int8_wo", "fp8")

INT8_MAX = 127.0
FP8_E4M3_MAX = 448.0


@flax.struct.dataclass
class QTensor:
  """Quantized kernel: `value * scale` approximates the float kernel.

  Attributes:
    value: int8 or float8_e4m3fn array `[..., in, out]`.
    scale: float32 array `[..., 1, out]` (per output channel) or `[..., 1, 1]`
      (per tensor).
    mode: one of `MODES`; static (part of the tree structure, not a leaf).
    fake: if True the matmul dequantizes and runs in float (quantize-dequantize
      emulation for backends without a native low-precision dot); static.
  """

  value: jax.Array
  scale: jax.Array
  mode: str = flax.struct.field(pytree_node=False, default="int8")
  fake: bool = flax.struct.field(pytree_node=False, default=False)

  @property
  def shape(self):
    return self.value.shape

  @property
  def dtype(self):
    return self.value.dtype

  def dequantize(self, dtype=jnp.float32) -> jax.Array:
    return (self.value.astype(jnp.float32) * self.scale).astype(dtype)


def _per_token_scale(x: jax.Array, qmax: float) -> jax.Array:
  amax = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=-1, keepdims=True)
  return jnp.maximum(amax, 1e-8) / qmax


def quantize_activations_int8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Dynamic symmetric per-token INT8: s = max_j |x_j| / 127, q = round(x / s)."""
  s = _per_token_scale(x, INT8_MAX)
  q = jnp.clip(jnp.round(x.astype(jnp.float32) / s), -INT8_MAX, INT8_MAX)
  return q.astype(jnp.int8), s


def quantize_activations_fp8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Dynamic per-token FP8 e4m3: s = max_j |x_j| / 448, q = fp8(x / s)."""
  s = _per_token_scale(x, FP8_E4M3_MAX)
  q = jnp.clip(x.astype(jnp.float32) / s, -FP8_E4M3_MAX, FP8_E4M3_MAX)
  return q.astype(jnp.float8_e4m3fn), s


def contract_last(x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
  """x [..., in] · w [in, out] as one 2-D [rows, in] x [in, out] dot.

  Why 2-D: the weight gradient of a dot with leading (batch, time) axes
  contracts both at once, and XLA:CPU feeds it a strided 3-D transpose of
  the [b, t, out] cotangent that cost as much as the dots themselves in the
  update step (~35% of a small decoder's step; docs/performance.md). On 2-D
  operands it is a tiled 2-D transpose. Forward values are unchanged.
  """
  lead = x.shape[:-1]
  y = jax.lax.dot_general(
    x.reshape(-1, x.shape[-1]),
    w,
    (((1,), (0,)), ((), ())),
    preferred_element_type=out_dtype,
  )
  return y.reshape(*lead, w.shape[-1])


def bf16_dot(x: jax.Array, w: jax.Array, w_transposed: bool = False):
  """x [..., in] · w [in, out] with bfloat16 operands and float32
  accumulation, in the forward pass and both backward dots:

    y  = f32(bf16(x) @ bf16(w))
    dx = f32(bf16(g) @ bf16(w)ᵀ),   dw = f32(bf16(x)ᵀ @ bf16(g))

  with g = ∂L/∂y rounded to bf16 as a bf16 engine rounds its gradients
  (the mixed-precision recipe of Micikevicius et al., 2018, "Mixed Precision
  Training", with bf16 in place of fp16 so no loss scaling is needed).
  Returns float32; dx comes back in x's dtype and dw in w's. With
  `w_transposed`, w is stored [out, in] (a tied embedding used as the LM
  head) and y = x · wᵀ.

  Why a custom gradient: autodiff of a bf16 x bf16 -> f32 dot transposes
  into float32 dots (the bf16 operand upcast), so the backward pass, two
  thirds of a step's matmul FLOPs, would miss the bf16 dot units
  (AVX512-BF16, AMX, tensor cores; docs/performance.md). Why the explicit
  layouts: XLA:CPU runs a bf16 dot on its bf16 kernels (YNNPACK) only when
  the lhs contracts its last axis and neither operand is a transpose;
  any other bf16 dot is upcast to float32 (the rounding kept) and runs at
  the f32 rate. Products of bf16 values are exact in float32, so the
  forward equals the float32 dot of the rounded operands up to
  accumulation order.
  """
  return _bf16_dot(w_transposed, x, w)


_F32 = jnp.float32


def _rows(a: jax.Array) -> jax.Array:
  return a.reshape(-1, a.shape[-1])


def _dot(a, b, a_axis: int, b_axis: int):
  return jax.lax.dot_general(
    a, b, (((a_axis,), (b_axis,)), ((), ())), preferred_element_type=_F32
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bf16_dot(w_transposed, x, w):
  # One forward for both uses; without a gradient XLA drops the residuals.
  return _bf16_dot_fwd(w_transposed, x, w)[0]


def _bf16_dot_fwd(w_transposed, x, w):
  xb, wb = _rows(x.astype(jnp.bfloat16)), w.astype(jnp.bfloat16)
  y = _dot(xb, wb, 1, 1 if w_transposed else 0)
  # The residual is x rounded to bf16 and already transposed, [in, rows],
  # so the weight gradient is a canonical [in, rows] x [rows, out] dot
  # (contracting the lhs's leading axis would be upcast, see above).
  # Zero-size arrays remember the primal dtypes.
  probes = (jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype))
  res = (xb.T, wb, x.shape, probes)
  return y.reshape(*x.shape[:-1], y.shape[-1]), res


def _bf16_dot_bwd(w_transposed, res, g):
  xbt, wb, x_shape, (x_probe, w_probe) = res
  gb = _rows(g.astype(jnp.bfloat16))
  # dx = g · wᵀ: w [out, in] is contracted on its leading axis (canonical);
  # w [in, out] on its last, the NT form that the bf16 kernels also take.
  dx = _dot(gb, wb, 1, 0 if w_transposed else 1).reshape(x_shape)
  dw = _dot(xbt, gb, 1, 0)  # [in, out]
  if w_transposed:
    dw = dw.T
  return dx.astype(x_probe.dtype), dw.astype(w_probe.dtype)


_bf16_dot.defvjp(_bf16_dot_fwd, _bf16_dot_bwd)


def _has_native_fp8_dot() -> bool:
  # XLA lowers an f8 x f8 dot to cuBLASLt FP8 GEMMs on Hopper-class GPUs; the
  # CPU backend would upcast anyway, so the emulation is the honest path there.
  return jax.default_backend() == "gpu"


def qdot(x: jax.Array, w: Any) -> jax.Array:
  """`x @ w` for a float kernel or a `QTensor`; returns `x.dtype`.

  W8A8 (modes "int8", "fp8"): the activations are quantized per token on the
  fly (`quantize_activations_*`) and

    y = (s_x ⊙ s_w) · (q_x @ q_w),

  with the INT8 product accumulated in int32 (`preferred_element_type`), which
  XLA lowers to VNNI on x86 CPUs and to IMMA tensor cores on GPUs, and the FP8
  product accumulated in float32 (native on GPUs). With `w.fake` (or FP8
  off-GPU) the same integer/e4m3 codes are multiplied in float32, which agrees
  with the native path up to float32 accumulation order. Weight-only
  ("int8_wo") dequantizes the kernel and runs the dot in `x.dtype`.

  A bfloat16 float kernel under float32 activations (mixed precision: the
  JAX sampler's "bf16" format and the update step's bf16 compute on CPUs)
  multiplies bf16 operands with float32 accumulation (`bf16_dot`, its
  backward dots too),

    y = float32(bf16(x) @ w),

  the dot that AVX512-BF16/AMX CPUs and tensor cores run fast (~2x the f32
  dot at SmolLM2 decode shapes on an AMD EPYC, docs/performance.md); x is
  rounded to bf16 as a bf16 engine rounds its activations. Every other float
  pair upcasts the kernel to `x.dtype`.

  Args:
    x: activations `[..., in]`.
    w: float kernel `[in, out]` or a QTensor with `value [in, out]`,
      `scale [1, out]` or `[1, 1]` (one layer's slice of the stacked tree).
  """
  if not isinstance(w, QTensor):
    if w.dtype == jnp.bfloat16 and x.dtype == jnp.float32:
      return bf16_dot(x, w)
    return contract_last(x, w.astype(x.dtype))
  if w.value.ndim != 2 or x.shape[-1] != w.value.shape[0]:
    raise ValueError(
      f"qdot: x has shape {tuple(x.shape)} and the QTensor value "
      f"{tuple(w.value.shape)}; expected x [..., in] and value [in, out] "
      "(slice stacked layers before the matmul)"
    )
  out_dtype = x.dtype
  if w.mode == "int8_wo":
    return contract_last(x, w.dequantize(x.dtype))
  if w.mode == "int8":
    xq, sx = quantize_activations_int8(x)
    if w.fake:
      y = contract_last(
        xq.astype(jnp.float32), w.value.astype(jnp.float32), jnp.float32
      )
    else:
      y = contract_last(xq, w.value, jnp.int32).astype(jnp.float32)
  elif w.mode == "fp8":
    xq, sx = quantize_activations_fp8(x)
    if w.fake or not _has_native_fp8_dot():
      y = contract_last(
        xq.astype(jnp.float32), w.value.astype(jnp.float32), jnp.float32
      )
    else:
      y = contract_last(xq, w.value, jnp.float32)
  else:
    raise ValueError(f"QTensor.mode={w.mode!r}; expected one of {MODES}")
  return (y * sx * w.scale[0, :]).astype(out_dtype)
