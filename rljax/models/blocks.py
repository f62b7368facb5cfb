"""The decoder's building blocks: input checks, the token embedding, one
layer's attention and MLP sub-blocks, and the float32 LM head.

Shared by the full-sequence forward (`rljax.models.decoder`) and the cached
prefill and decode steps (`rljax.models.kv_cache`), so that the two paths
compute a layer the same way.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from rljax.models import fusion, layers
from rljax.models.config import ModelConfig
from rljax.models.decoder_params import Params
from rljax.quant.qtensor import QTensor, bf16_dot, contract_last, qdot


def check_tokens(tokens, name="tokens"):
  """Raises unless `tokens` is an integer [B, T] array."""
  if not hasattr(tokens, "dtype") or not jnp.issubdtype(
    tokens.dtype, jnp.integer
  ):
    raise TypeError(
      f"{name} must be an integer array [B, T]; got "
      f"{getattr(tokens, 'dtype', type(tokens).__name__)}"
    )
  if tokens.ndim != 2:
    raise ValueError(f"{name} must have shape [B, T]; got {tokens.shape}")


def check_same_shape(x, tokens, name):
  """Raises unless `x` (named `name`) is None or has the shape of tokens."""
  if x is not None and tuple(x.shape) != tuple(tokens.shape):
    raise ValueError(
      f"{name} has shape {tuple(x.shape)}; expected the shape "
      f"of tokens {tuple(tokens.shape)}"
    )


def compute_dtype(params: Params) -> jnp.dtype:
  """Activations run in the embedding's dtype (the params' dtype)."""
  return params["embed"]["embedding"].dtype


def positions_from_mask(attention_mask: Int[Array, "b t"]) -> Int[Array, "b t"]:
  """Position of each token counting only real ones: cumsum(mask) − 1 (≥ 0).

  With left padding the first real token gets position 0, as HF's generate.
  """
  return jnp.maximum(
    jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0
  )


def qkv(config: ModelConfig, layer: Params, x, cos, sin):
  """Queries, keys and values of the attention sub-block (after RoPE), from
  the three projections or their fusion (`fusion.fuse_projections`)."""
  b, t, _ = x.shape
  hd, hq, hkv = config.head_dim, config.num_heads, config.num_kv_heads
  h = layers.rms_norm(x, layer["attn_norm"]["scale"], config.rms_norm_eps)
  if fusion.QKV in layer:
    qkv = layers.linear(h, layer[fusion.QKV])
    q, k, v = jnp.split(qkv, (hq * hd, (hq + hkv) * hd), axis=-1)
  else:
    q = layers.linear(h, layer["q_proj"])
    k = layers.linear(h, layer["k_proj"])
    v = layers.linear(h, layer["v_proj"])
  q = q.reshape(b, t, hq, hd)
  k = k.reshape(b, t, hkv, hd)
  v = v.reshape(b, t, hkv, hd)
  if config.qk_norm:
    # Qwen3: RMSNorm over each head's hd values, before RoPE (HF Qwen3Attention).
    q = layers.rms_norm(q, layer["q_norm"]["scale"], config.rms_norm_eps)
    k = layers.rms_norm(k, layer["k_norm"]["scale"], config.rms_norm_eps)
  return layers.apply_rope(q, cos, sin), layers.apply_rope(k, cos, sin), v


def attention_block(
  config: ModelConfig, layer: Params, x, cos, sin, k_fn, causal=False
):
  """Attention sub-block. `k_fn(k, v) -> (keys, values, mask, extra)` supplies
  what the queries attend to: the fresh keys, or the KV cache with the fresh
  ones written in (then `extra` carries the updated cache out). `causal`:
  the mask includes the causal one (`layers.attention`)."""
  b, t, _ = x.shape
  hd = config.head_dim
  q, k, v = qkv(config, layer, x, cos, sin)
  keys, values, mask, extra = k_fn(k, v)
  out = layers.attention(
    q, keys.astype(q.dtype), values.astype(q.dtype), mask, causal=causal
  )
  x = x + layers.linear(
    out.reshape(b, t, config.num_heads * hd), layer["o_proj"]
  )
  return x, extra


def mlp_block(config: ModelConfig, layer: Params, x):
  h = layers.rms_norm(x, layer["mlp_norm"]["scale"], config.rms_norm_eps)
  if fusion.GATE_UP in layer:
    return x + layers.fused_swiglu_mlp(
      h, layer[fusion.GATE_UP], layer["down_proj"]
    )
  return x + layers.swiglu_mlp(
    h, layer["gate_proj"], layer["up_proj"], layer["down_proj"]
  )


def embed_tokens(
  params: Params, tokens: Int[Array, "b t"], dtype=None
) -> Float[Array, "b t d"]:
  """Embedding rows of `tokens`, in `dtype` (default: the embedding's).

  The activation dtype of the whole forward pass is set here: the residual
  stream, norms and attention run in it; each matmul runs as `qdot` rules
  for its kernel's dtype (so bf16 weights with float32 activations run
  bf16 x bf16 -> f32 dots and keep everything else in float32).
  """
  rows = jnp.take(params["embed"]["embedding"], tokens, axis=0)
  return rows if dtype is None else rows.astype(dtype)


def lm_head_kernel(config: ModelConfig, params: Params) -> Any:
  """The [D, V] output kernel: the transposed embedding when tied."""
  if config.tie_word_embeddings:
    return params["embed"]["embedding"].T
  if "lm_head" not in params:
    raise KeyError(
      "params has no 'lm_head' but config.tie_word_embeddings is False"
    )
  return params["lm_head"]["kernel"]


def logits_from_hidden(
  config: ModelConfig, params: Params, hidden: Float[Array, "... d"]
) -> Float[Array, "... v"]:
  """LM head in float32.

  Log-probs feed importance ratios, where bf16 logits are a known source of
  train/inference mismatch, so the head runs in float32 regardless of the
  params' dtype.
  """
  kernel = lm_head_kernel(config, params)
  if isinstance(kernel, QTensor):
    return qdot(hidden.astype(jnp.float32), kernel)
  # A bf16 kernel: bf16 operands, float32 accumulation (`bf16_dot`, whose
  # backward dots are bf16 too). Products of bf16 values are exact in
  # float32, so this equals the float32 dot of their upcasts without a
  # float32 copy of the [D, V] weight; float32 hidden states (bf16 weights,
  # f32 activations) are rounded to bf16 as `qdot` rounds them: upcasting
  # the kernel would convert all D x V weights at every decode step.
  if kernel.dtype == jnp.bfloat16:
    if config.tie_word_embeddings:
      # The [V, D] embedding itself, not its transpose: a transposed operand
      # sends the dot off XLA:CPU's bf16 kernels (`bf16_dot`).
      return bf16_dot(hidden, params["embed"]["embedding"], w_transposed=True)
    return bf16_dot(hidden, kernel)
  dtype = jnp.promote_types(hidden.dtype, kernel.dtype)
  return contract_last(hidden.astype(dtype), kernel.astype(dtype), jnp.float32)
