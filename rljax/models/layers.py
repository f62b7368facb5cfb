"""The building blocks of a Llama/Qwen2 block, as pure functions.

Each follows HF transformers' numerics (which is what the checkpoints were
trained and evaluated with): RMSNorm normalizes in float32, RoPE uses the
rotate-half convention with float32 angles, attention takes its softmax in
float32.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping

import chex
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jaxtyping import Array, Bool, Float, Int

from rljax.models.config import ModelConfig
from rljax.quant.qtensor import contract_last, qdot

# Added to the scores of masked keys. Finite, so that a query with no valid key
# (a left-pad position) yields a uniform average instead of NaN; such outputs
# are never read, but NaN would poison gradients through `jnp.where`.
_MASK_VALUE = float(jnp.finfo(jnp.float32).min) / 2

# `attention`'s output carries this name, so a `jax.checkpoint` policy can
# keep it while recomputing the scores (decoder.SCAN_SAVES).
ATTENTION_OUT = "attention_out"

# Which kernel runs full-sequence attention (read when a function is traced):
#   auto  - cuDNN's fused (flash) attention where it applies (a CUDA GPU,
#           bf16/fp16 activations, queries and keys of one length, head dim a
#           multiple of 8 up to 128), else the einsum path;
#   xla   - always the einsum path below;
#   cudnn - always cuDNN (an error where it cannot run).
# On an H200 the einsum path's [B, H, T, T] scores, their transposes and the
# softmax took ~half of Qwen2.5-0.5B's 16 x 1024 update step
# (docs/performance.md, "NVIDIA H200 and an AMX host").
ATTENTION_IMPL_ENV = "RLJAX_ATTENTION"
ATTENTION_IMPLS = ("auto", "xla", "cudnn")


# Columns of the ones matrix `rms_norm` sums with: a matrix-vector product
# (one column) reduces like the row reduction it replaces; eight run as a
# matrix product, whose rows are row-count invariant.
_SUM_COLUMNS = 8


def rms_norm(
  x: Float[Array, "... d"], scale: Float[Array, "d"], eps: float
) -> Float[Array, "... d"]:
  """RMSNorm (Zhang & Sennrich, 2019), HF Llama semantics.

    y = x / sqrt(mean(x²) + eps) * scale

  The normalization runs in float32 and is cast back to `x.dtype` before the
  scale multiplies (no `1 +` offset), as `LlamaRMSNorm`.

  Row-count invariant: a row's output has the same bits whatever number of
  rows runs beside it (the engine's row buckets, a verify step's positions,
  the trainer's batch), which XLA:CPU's own ops do not give here: its row
  reduction sums a row of 576 in another order at 8 rows than at 4, and its
  rsqrt differs between its vector and scalar code. So the sum of squares
  is a dot with a ones matrix (the dots are row-count invariant), and the
  inverse root is a correctly rounded square root and division, which a
  barrier keeps XLA from rewriting into rsqrt
  (tests/models/test_row_count_invariance.py).
  """
  chex.assert_equal(x.shape[-1:], scale.shape)
  x32 = x.astype(jnp.float32)
  d = x.shape[-1]
  sums = jnp.matmul(
    jnp.square(x32),
    jnp.ones((d, _SUM_COLUMNS), jnp.float32),
    precision=jax.lax.Precision.HIGHEST,
  )[..., :1]
  root = jax.lax.optimization_barrier(jnp.sqrt(sums / d + eps))
  normed = (x32 * (1.0 / root)).astype(x.dtype)
  return scale.astype(x.dtype) * normed


def rope_inverse_frequencies(config: ModelConfig) -> Float[Array, "half"]:
  """Per-pair rotation rates θ_i = base^(-2i/hd) (Su et al., 2021, RoFormer).

  With `rope_scaling`:
    linear  (Chen et al., 2023, position interpolation): θ_i / factor.
    llama3  (Llama 3 report, 2024): wavelengths longer than
      orig_ctx / low_freq_factor are divided by factor, shorter than
      orig_ctx / high_freq_factor are kept, and those between interpolate
      smoothly with s = (orig_ctx / λ − low) / (high − low):
      θ' = (1 − s) θ / factor + s θ.
  """
  hd = config.head_dim
  exponents = jnp.arange(0, hd, 2, dtype=jnp.float32) / hd
  inv_freq = 1.0 / (config.rope_theta**exponents)
  scaling = config.rope_scaling_dict
  if scaling is None:
    return inv_freq
  factor = float(scaling["factor"])
  if scaling["rope_type"] == "linear":
    return inv_freq / factor
  # llama3
  low = float(scaling["low_freq_factor"])
  high = float(scaling["high_freq_factor"])
  orig_ctx = float(scaling["original_max_position_embeddings"])
  wavelen = 2 * math.pi / inv_freq
  scaled = jnp.where(wavelen > orig_ctx / low, inv_freq / factor, inv_freq)
  smooth = (orig_ctx / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  is_medium = (wavelen >= orig_ctx / high) & (wavelen <= orig_ctx / low)
  return jnp.where(is_medium, smoothed, scaled)


def rope_cos_sin(
  config: ModelConfig, positions: Int[Array, "b t"]
) -> tuple[Float[Array, "b t hd"], Float[Array, "b t hd"]]:
  """cos and sin of the angles p·θ_i, duplicated to the full head width."""
  chex.assert_rank(positions, 2)
  inv_freq = rope_inverse_frequencies(config)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def rope_table(
  config: ModelConfig, length: int
) -> tuple[Float[Array, "n hd"], Float[Array, "n hd"]]:
  """`rope_cos_sin` of positions 0 .. length-1: (cos, sin), each [length, hd].

  For a decode loop, made once outside it and indexed by position at each
  step: XLA fuses a step's cos and sin into each of its 2L rotary consumers
  and evaluates them there per element, which cost ~8 % of a decode step's
  op time at batch 512 on an AMX CPU (docs/performance.md, "RoPE tables").
  """
  if length <= 0:
    raise ValueError(f"rope_table: length={length}; expected a positive int")
  cos, sin = rope_cos_sin(config, jnp.arange(length, dtype=jnp.int32)[None])
  return cos[0], sin[0]


def apply_rope(
  x: Float[Array, "b t h hd"],
  cos: Float[Array, "b t hd"],
  sin: Float[Array, "b t hd"],
) -> Float[Array, "b t h hd"]:
  """Rotary embedding, HF rotate-half layout: pairs are (x_i, x_{i+hd/2}).

  y = x · cos + rotate_half(x) · sin,   rotate_half(x) = [−x₂, x₁]
  """
  chex.assert_rank(x, 4)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos = cos[:, :, None, :].astype(x.dtype)
  sin = sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


def linear(
  x: Float[Array, "... d_in"], p: Mapping[str, Any]
) -> Float[Array, "... d_out"]:
  """x @ kernel (+ bias), the matmul through `qdot` so QTensor kernels work.

  Unmerged LoRA (`rljax.models.lora.attach`): with "lora_a" [in, r] and an
  already (α/r)-scaled "lora_b" [r, out] the layer adds (x A) B, so a frozen
  (even quantized) kernel runs next to its adapter without W + A B.
  """
  y = qdot(x, p["kernel"])
  if "lora_a" in p:
    low = contract_last(x, p["lora_a"].astype(x.dtype))
    y = y + contract_last(low, p["lora_b"].astype(x.dtype)).astype(y.dtype)
  if "bias" in p:
    y = y + p["bias"].astype(y.dtype)
  return y


def swiglu_mlp(
  x: Float[Array, "... d"],
  gate: Mapping[str, Any],
  up: Mapping[str, Any],
  down: Mapping[str, Any],
) -> Float[Array, "... d"]:
  """SwiGLU feed-forward (Shazeer, 2020): down(silu(gate x) ⊙ up x)."""
  return linear(jax.nn.silu(linear(x, gate)) * linear(x, up), down)


def fused_swiglu_mlp(
  x: Float[Array, "... d"],
  gate_up: Mapping[str, Any],
  down: Mapping[str, Any],
) -> Float[Array, "... d"]:
  """`swiglu_mlp` with gate and up in one kernel [d, 2f] (Shazeer, 2020):

    [g | u] = x [W_g | W_u],   y = down(silu(g) ⊙ u)

  one matmul (and, under W8A8, one activation quantization) for both.
  """
  gu = linear(x, gate_up)
  g, u = jnp.split(gu, 2, axis=-1)
  return linear(jax.nn.silu(g) * u, down)


def attention_impl() -> str:
  """The `RLJAX_ATTENTION` setting (default "auto"), checked."""
  impl = os.environ.get(ATTENTION_IMPL_ENV, "auto").strip().lower() or "auto"
  if impl not in ATTENTION_IMPLS:
    raise ValueError(
      f"{ATTENTION_IMPL_ENV}={impl!r}: expected one of {ATTENTION_IMPLS}"
    )
  return impl


def _fused_attention_applies(q, k) -> bool:
  """Whether cuDNN's fused attention can run these operands."""
  return (
    jax.default_backend() == "gpu"
    and q.dtype in (jnp.bfloat16, jnp.float16)
    and q.shape[1] == k.shape[1]
    and q.shape[-1] % 8 == 0
    and q.shape[-1] <= 128
  )


def attention(
  q: Float[Array, "b t hq hd"],
  k: Float[Array, "b s hkv hd"],
  v: Float[Array, "b s hkv hd"],
  mask: Bool[Array, "b t s"],
  *,
  causal: bool = False,
) -> Float[Array, "b t hq hd"]:
  """Grouped-query scaled dot-product attention (Ainslie et al., 2023).

    out = softmax(q kᵀ / sqrt(hd) + bias(mask)) v

  Query head h reads key/value head h // (hq / hkv). Scores accumulate and the
  softmax runs in float32; probabilities are cast to `v.dtype` for the value
  matmul (as HF's eager attention).

  `causal=True` promises that `mask` already holds the causal mask (s == t,
  key j > query i masked): the fused kernel then skips the blocks above the
  diagonal. The result does not depend on it. Which kernel runs is
  `attention_impl()`'s choice; the fused one (Dao et al., 2022, FlashAttention,
  as cuDNN implements it) never materialises the [B, H, T, S] scores; JAX
  passes it the mask as a bias of a finite large negative, so a query with
  no valid key (a left-pad position) stays finite there too (checked on an
  H200 by `FusedAttentionTest`).
  """
  chex.assert_rank([q, k, v, mask], [4, 4, 4, 3])
  chex.assert_equal_shape([k, v])
  b, t, hq, hd = q.shape
  hkv = k.shape[2]
  if hq % hkv:
    raise ValueError(f"query heads {hq} not a multiple of kv heads {hkv}")
  impl = attention_impl()
  if impl == "cudnn" or (impl == "auto" and _fused_attention_applies(q, k)):
    out = jax.nn.dot_product_attention(
      q,
      k,
      v,
      mask=mask[:, None, :, :],
      is_causal=causal,
      implementation="cudnn",
    )
    return checkpoint_name(out, ATTENTION_OUT)
  q = q.reshape(b, t, hkv, hq // hkv, hd)
  scores = jnp.einsum(
    "btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32
  )
  scores = scores * (1.0 / math.sqrt(hd))
  scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
  return checkpoint_name(out.reshape(b, t, hq, hd), ATTENTION_OUT)


def shared_prefix_attention(
  q: Float[Array, "b 1 hq hd"],
  k_prefix: Float[Array, "p hkv sp hd"],
  v_prefix: Float[Array, "p hkv hd sp"],
  prefix_mask: Bool[Array, "p sp"],
  k: Float[Array, "b hkv hd s"],
  v: Float[Array, "b hkv s hd"],
  mask: Bool[Array, "b 1 s"],
) -> Float[Array, "b 1 hq hd"]:
  """One-token `attention` over a prefix shared by groups of rows, then each
  row's own keys (cascade / shared-prefix attention).

  Rows b = i·n + j (j < n = B / P) share prompt i's keys k_prefix[i]:

    out_b = softmax([q_b k_prefix[i]ᵀ, q_b k_bᵀ] / sqrt(hd) + bias) [v_prefix[i]; v_b]

  equal to `attention` over the row's concatenated cache [prefix; own], but
  each prompt's prefix is read once for its n rows, as one [n·g, hd] x
  [hd, sp] matmul per (prompt, kv head) rather than n matrix-vector products
  over n copies. Keys and values come in the layouts XLA:CPU's matmuls read
  without a transpose: the prompt's as k_prefix [p, hkv, sp, hd], v_prefix
  [p, hkv, hd, sp] (`decoder.to_prefix_cache`), the rows' own as k [b, hkv,
  hd, s], v [b, hkv, s, hd] (`decoder.init_decode_cache`).
  """
  chex.assert_rank(
    [q, k_prefix, v_prefix, prefix_mask, k, v, mask], [4, 4, 4, 2, 4, 4, 3]
  )
  chex.assert_shape(v_prefix, (*k_prefix.shape[:2], *k_prefix.shape[:1:-1]))
  chex.assert_shape(k, (*v.shape[:2], v.shape[3], v.shape[2]))
  b, t, hq, hd = q.shape
  p, hkv, sp, _ = k_prefix.shape
  if t != 1:
    raise ValueError(f"shared_prefix_attention: q has {t} tokens; expected 1")
  if b % p or hq % hkv:
    raise ValueError(
      f"shared_prefix_attention: {b} rows over {p} prefixes, "
      f"{hq} query heads over {hkv} kv heads; expected "
      "multiples"
    )
  n, g = b // p, hq // hkv
  scale = 1.0 / math.sqrt(hd)
  qg = q.reshape(p, n, hkv, g, hd)
  pre = (
    jnp.einsum(
      "pnkgd,pksd->pnkgs", qg, k_prefix, preferred_element_type=jnp.float32
    )
    * scale
  )
  pre = jnp.where(prefix_mask[:, None, None, None, :], pre, _MASK_VALUE)
  own = (
    jnp.einsum(
      "bkgd,bkds->bkgs",
      q.reshape(b, hkv, g, hd),
      k,
      preferred_element_type=jnp.float32,
    )
    * scale
  )
  own = jnp.where(mask[:, :, None, :], own, _MASK_VALUE)
  scores = jnp.concatenate([pre.reshape(b, hkv, g, sp), own], axis=-1)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum(
    "pnkgs,pkds->pnkgd", probs[..., :sp].reshape(p, n, hkv, g, sp), v_prefix
  )
  out = out.reshape(b, hkv, g, hd) + jnp.einsum(
    "bkgs,bksd->bkgd", probs[..., sp:], v
  )
  return out.reshape(b, t, hq, hd)
