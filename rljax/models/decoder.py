"""The Llama/Qwen2/Qwen3 decoder as pure functions over a params dict.

The params tree is the one fixed in docs/CONTRACTS.md: blocks stacked on a
leading layer axis and run with `jax.lax.scan`, so compile time does not grow
with depth. The one exception is the sampler's one-token decode step
(`decode_with_prefix_cache`), which unrolls its layers over per-layer KV
buffers, so that no step copies a layer's cache out of a stacked one. Pure
functions (rather than a Module) are what the rest of rljax calls, because
quantized `QTensor` leaves and `NamedSharding`s plug into a plain dict
without module surgery. `Decoder` is a thin `flax.linen` wrapper for users
who want `init`/`apply`.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from rljax.models import fusion, layers
from rljax.models.config import ModelConfig
from rljax.quant.qtensor import QTensor, bf16_dot, contract_last, qdot

Params = Mapping[str, Any]
KVCache = dict[str, jax.Array]

_INIT_STD = 0.02  # HF initializer_range of Llama/Qwen2.

_PROJECTIONS = (
  "q_proj",
  "k_proj",
  "v_proj",
  "o_proj",
  "gate_proj",
  "up_proj",
  "down_proj",
)


def layer_kernel_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
  """[in, out] of every linear layer of one block."""
  d, f = config.hidden_size, config.intermediate_size
  hd = config.head_dim
  q, kv = config.num_heads * hd, config.num_kv_heads * hd
  return {
    "q_proj": (d, q),
    "k_proj": (d, kv),
    "v_proj": (d, kv),
    "o_proj": (q, d),
    "gate_proj": (d, f),
    "up_proj": (d, f),
    "down_proj": (f, d),
  }


def _normal(rng, shape, dtype):
  return (_INIT_STD * jax.random.normal(rng, shape, jnp.float32)).astype(dtype)


def init_embed(config: ModelConfig, rng: PRNGKeyArray, dtype=jnp.float32):
  return {
    "embedding": _normal(rng, (config.vocab_size, config.hidden_size), dtype)
  }


def init_layers(config: ModelConfig, rng: PRNGKeyArray, dtype=jnp.float32):
  n, d = config.num_layers, config.hidden_size
  shapes = layer_kernel_shapes(config)
  rngs = jax.random.split(rng, len(shapes))
  out: dict[str, Any] = {
    "attn_norm": {"scale": jnp.ones((n, d), dtype)},
    "mlp_norm": {"scale": jnp.ones((n, d), dtype)},
  }
  for key, name in zip(rngs, _PROJECTIONS):
    out[name] = {"kernel": _normal(key, (n, *shapes[name]), dtype)}
  if config.has_qkv_bias:
    for name in ("q_proj", "k_proj", "v_proj"):
      out[name]["bias"] = jnp.zeros((n, shapes[name][1]), dtype)
  if config.qk_norm:
    for name in ("q_norm", "k_norm"):
      out[name] = {"scale": jnp.ones((n, config.head_dim), dtype)}
  return out


def init_final_norm(config: ModelConfig, rng: PRNGKeyArray, dtype=jnp.float32):
  del rng
  return {"scale": jnp.ones((config.hidden_size,), dtype)}


def init_lm_head(config: ModelConfig, rng: PRNGKeyArray, dtype=jnp.float32):
  shape = (config.hidden_size, config.vocab_size)
  return {"kernel": _normal(rng, shape, dtype)}


def init_params(
  config: ModelConfig, rng: PRNGKeyArray, dtype=jnp.float32
) -> dict[str, Any]:
  """Random params, HF's init: N(0, 0.02²) weights, unit norms, zero biases."""
  k_embed, k_layers, k_head = jax.random.split(rng, 3)
  params = {
    "embed": init_embed(config, k_embed, dtype),
    "layers": init_layers(config, k_layers, dtype),
    "final_norm": init_final_norm(config, None, dtype),
  }
  if not config.tie_word_embeddings:
    params["lm_head"] = init_lm_head(config, k_head, dtype)
  return params


# ------------------------------------------------------------------ checks
def param_shapes(config: ModelConfig) -> dict[str, Any]:
  """The shape of every leaf `init_params(config, ...)` creates."""
  n, d, v = config.num_layers, config.hidden_size, config.vocab_size
  shapes: dict[str, Any] = {
    "embed": {"embedding": (v, d)},
    "layers": {"attn_norm": {"scale": (n, d)}, "mlp_norm": {"scale": (n, d)}},
    "final_norm": {"scale": (d,)},
  }
  for name, (d_in, d_out) in layer_kernel_shapes(config).items():
    shapes["layers"][name] = {"kernel": (n, d_in, d_out)}
    if config.has_qkv_bias and name in ("q_proj", "k_proj", "v_proj"):
      shapes["layers"][name]["bias"] = (n, d_out)
  if config.qk_norm:
    for name in ("q_norm", "k_norm"):
      shapes["layers"][name] = {"scale": (n, config.head_dim)}
  if not config.tie_word_embeddings:
    shapes["lm_head"] = {"kernel": (d, v)}
  return shapes


def check_params(config: ModelConfig, params: Params) -> None:
  """Raises naming the first leaf of `params` whose presence or shape does
  not fit `config` (a QTensor kernel is checked by its `value`)."""

  def walk(expected, got, path):
    if not isinstance(expected, dict):
      shape = tuple(got.shape)
      if shape != expected:
        raise ValueError(
          f"params{path} has shape {shape}; expected {expected} "
          f"for this ModelConfig"
        )
      return
    if not isinstance(got, Mapping):
      raise TypeError(
        f"params{path} is a {type(got).__name__}; expected a dict"
      )
    missing = sorted(set(expected) - set(got))
    if missing:
      raise KeyError(f"params{path} lacks {missing}")
    for key in expected:
      walk(expected[key], got[key], f"{path}[{key!r}]")

  shapes = param_shapes(config)
  layers_got = params.get("layers") if isinstance(params, Mapping) else None
  if isinstance(layers_got, Mapping):
    # The rollout's inference layout (`fusion.fuse_projections`).
    shapes["layers"] = fusion.fused_layer_shapes(
      shapes["layers"], fusion.fused_names(layers_got)
    )
  walk(shapes, params, "")


def _check_tokens(tokens, name="tokens"):
  if not hasattr(tokens, "dtype") or not jnp.issubdtype(
    tokens.dtype, jnp.integer
  ):
    raise TypeError(
      f"{name} must be an integer array [B, T]; got "
      f"{getattr(tokens, 'dtype', type(tokens).__name__)}"
    )
  if tokens.ndim != 2:
    raise ValueError(f"{name} must have shape [B, T]; got {tokens.shape}")


def _check_same_shape(x, tokens, name):
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


# ---------------------------------------------------------------- the block
def _qkv(config: ModelConfig, layer: Params, x, cos, sin):
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


def _attention_block(
  config: ModelConfig, layer: Params, x, cos, sin, k_fn, causal=False
):
  """Attention sub-block. `k_fn(k, v) -> (keys, values, mask, extra)` supplies
  what the queries attend to: the fresh keys, or the KV cache with the fresh
  ones written in (then `extra` carries the updated cache out). `causal`:
  the mask includes the causal one (`layers.attention`)."""
  b, t, _ = x.shape
  hd = config.head_dim
  q, k, v = _qkv(config, layer, x, cos, sin)
  keys, values, mask, extra = k_fn(k, v)
  out = layers.attention(
    q, keys.astype(q.dtype), values.astype(q.dtype), mask, causal=causal
  )
  x = x + layers.linear(
    out.reshape(b, t, config.num_heads * hd), layer["o_proj"]
  )
  return x, extra


def _mlp_block(config: ModelConfig, layer: Params, x):
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


# Layer loops of at most this many layers are unrolled (final_hidden_states).
_UNROLL_MAX_LAYERS = 4

# What a scanned decoder layer saves for its backward pass (a
# `jax.checkpoint` policy; None saves everything autodiff keeps): the
# outputs of its projections (2-D dots, `contract_last`) and the attention
# output, which the o_proj weight gradient reads. The [B, H, T, T]
# attention probabilities, the largest residual of all, are recomputed.
SCAN_SAVES = jax.checkpoint_policies.save_from_both_policies(
  jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
  jax.checkpoint_policies.save_only_these_names(layers.ATTENTION_OUT),
)


def final_hidden_states(
  config: ModelConfig,
  params: Params,
  tokens: Int[Array, "b t"],
  attention_mask: Int[Array, "b t"] | None = None,
  positions: Int[Array, "b t"] | None = None,
  *,
  remat: bool | str = False,
  activation_dtype=None,
) -> Float[Array, "b t d"]:
  """Hidden states after the final RMSNorm, in the activation dtype.

  Args:
    config: the architecture.
    params: the params tree (float or QTensor kernels).
    tokens: int [B, T].
    attention_mask: [B, T], 1 for real tokens, 0 for padding (left or right).
      Padded keys are never attended to; outputs at padded queries are finite
      but meaningless.
    positions: int [B, T] RoPE positions; default cumsum(mask) − 1, or
      0..T−1 without a mask.
    remat: recompute each block's activations in the backward pass
      (`jax.checkpoint` per layer) to save memory. `"dots"` keeps what
      `SCAN_SAVES` names (every projection's output and the attention
      output) and recomputes only the rest, at any depth. Without remat a
      decoder of more than 4 layers (a layer scan) still recomputes what
      `SCAN_SAVES` does not keep.
    activation_dtype: dtype of the activations (`embed_tokens`); default the
      embedding's dtype.
  """
  _check_tokens(tokens)
  check_params(config, params)
  _check_same_shape(attention_mask, tokens, "attention_mask")
  _check_same_shape(positions, tokens, "positions")
  b, t = tokens.shape
  if positions is None:
    positions = (
      positions_from_mask(attention_mask)
      if attention_mask is not None
      else jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    )
  causal = jnp.tril(jnp.ones((t, t), jnp.bool_))[None]
  if attention_mask is not None:
    mask = causal & attention_mask.astype(jnp.bool_)[:, None, :]
  else:
    mask = jnp.broadcast_to(causal, (b, t, t))
  cos, sin = layers.rope_cos_sin(config, positions)

  def block(x, layer):
    x, _ = _attention_block(
      config, layer, x, cos, sin, lambda k, v: (k, v, mask, None), causal=True
    )
    return _mlp_block(config, layer, x), None

  # Small decoders (the long-horizon instrument, test models) unroll the
  # layer loop: the scan's stacked residual buffers (zero-filled, then
  # sliced per layer) were ~15% of the instrument's update step, while
  # unrolling a 30-layer model would multiply its compile time.
  unroll = config.num_layers if config.num_layers <= _UNROLL_MAX_LAYERS else 1
  if remat == "dots":
    # Save what SCAN_SAVES names (projection outputs, attention output) and
    # recompute only the cheap rest: on a GPU the full per-layer remat below
    # re-runs every matmul of the forward (~1/3 more matmul FLOPs).
    block = jax.checkpoint(block, prevent_cse=False, policy=SCAN_SAVES)
  elif remat:
    block = jax.checkpoint(block, prevent_cse=False)
  elif unroll == 1 and SCAN_SAVES is not None:
    # A scanned decoder keeps only what `SCAN_SAVES` names for the
    # backward pass and recomputes the rest (norms, RoPE, SwiGLU's
    # elementwise product, the attention scores): every residual the scan
    # saves is a [L, ...] buffer it zero-fills, writes and reads back, which
    # cost more than recomputing them on a CPU (docs/performance.md).
    block = jax.checkpoint(block, prevent_cse=False, policy=SCAN_SAVES)
  x = embed_tokens(params, tokens, activation_dtype)
  x, _ = jax.lax.scan(block, x, params["layers"], unroll=unroll)
  return layers.rms_norm(x, params["final_norm"]["scale"], config.rms_norm_eps)


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


def forward(
  config: ModelConfig,
  params: Params,
  tokens: Int[Array, "b t"],
  attention_mask: Int[Array, "b t"] | None = None,
  positions: Int[Array, "b t"] | None = None,
  *,
  remat: bool = False,
  return_hidden: bool = False,
  activation_dtype=None,
):
  """Next-token logits of a Llama/Qwen2/Qwen3 decoder.

  Returns float32 logits [B, T, V]; with `return_hidden`, the pair
  (logits, final hidden states [B, T, D]). See `final_hidden_states` for the
  arguments.
  """
  hidden = final_hidden_states(
    config,
    params,
    tokens,
    attention_mask,
    positions,
    remat=remat,
    activation_dtype=activation_dtype,
  )
  logits = logits_from_hidden(config, params, hidden)
  return (logits, hidden) if return_hidden else logits


# ---------------------------------------------------------------- KV cache
def init_cache(
  config: ModelConfig, batch: int, max_len: int, dtype=jnp.float32
) -> KVCache:
  """Zeroed KV cache: {"k", "v"}: [L, B, S=max_len, Hkv, hd]."""
  if batch <= 0 or max_len <= 0:
    raise ValueError(
      f"init_cache batch={batch}, max_len={max_len}; expected positive ints"
    )
  shape = (
    config.num_layers,
    batch,
    max_len,
    config.num_kv_heads,
    config.head_dim,
  )
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def init_decode_cache(
  config: ModelConfig, batch: int, slots: int, dtype=jnp.float32
) -> KVCache:
  """Zeroed own-slot cache of `decode_with_prefix_cache`: one buffer per
  layer, {"k": L x [B, Hkv, hd, S], "v": L x [B, Hkv, S, hd]} (tuples).

  Laid out as its two attention matmuls read it (q·Kᵀ contracts hd, p·V
  contracts S), so that no step transposes a cache: in the [L, B, S, Hkv, hd]
  layout of `init_cache`, XLA:CPU copied every layer's K and V to these
  layouts at every decode step, half of a step at B = 512, S = 256
  (docs/performance.md, "Decode attention layout"). One buffer per layer,
  not one [L, ...] array, so that a step reads each layer's slots where they
  lie: XLA copied the layer's slice out of a stacked cache before each
  attention matmul, a third of a decode step at 64x8x256 on an AMX CPU and
  the longest kernel on an H200 (docs/performance.md, "Per-layer decode
  caches").
  """
  return to_decode_cache(init_cache(config, batch, slots, dtype))


def to_decode_cache(cache: KVCache) -> KVCache:
  """An `init_cache`-layout cache [L, B, S, Hkv, hd] in the per-layer layout
  of `init_decode_cache`."""
  return {
    "k": unstack_layers(jnp.transpose(cache["k"], (0, 1, 3, 4, 2))),
    "v": unstack_layers(jnp.transpose(cache["v"], (0, 1, 3, 2, 4))),
  }


def to_prefix_cache(cache: KVCache) -> KVCache:
  """A prefill's cache [L, P, Sp, Hkv, hd] as the prompt cache of
  `decode_with_prefix_cache`: one buffer per layer, {"k": L x [P, Hkv, Sp,
  hd], "v": L x [P, Hkv, hd, Sp]} (tuples).

  The layouts the prefix attention's matmuls read
  (`layers.shared_prefix_attention`), made once before a decode loop: from
  the prefill layout, XLA transposed every layer's prompt keys and values
  at every decode step, 2L copies a step (docs/performance.md, "RoPE
  tables").
  """
  return {
    "k": unstack_layers(jnp.transpose(cache["k"], (0, 1, 3, 2, 4))),
    "v": unstack_layers(jnp.transpose(cache["v"], (0, 1, 3, 4, 2))),
  }


def unstack_layers(tree: Any) -> tuple[Any, ...]:
  """A tree of [L, ...] leaves as a tuple of L trees (layer i's slices).

  For a decode loop: sliced once outside it, each layer's weights and
  prefix keys are a buffer of their own inside it, which a matmul reads in
  place; slicing a stacked array inside the loop copies the slice at every
  step.
  """
  if not jax.tree.leaves(tree):
    raise ValueError("unstack_layers: the tree has no leaves")
  return tuple(_layer(tree, i) for i in range(_num_layers(tree)))


def _layer(tree: Any, i: int) -> Any:
  """Layer i of a stacked tree ([L, ...] leaves) or of `unstack_layers`'s
  tuple."""
  if isinstance(tree, (tuple, list)):
    return tree[i]
  return jax.tree.map(lambda x: x[i], tree)


def _num_layers(tree: Any) -> int:
  if isinstance(tree, (tuple, list)):
    return len(tree)
  return jax.tree.leaves(tree)[0].shape[0]


def forward_with_cache(
  config: ModelConfig,
  params: Params,
  tokens: Int[Array, "b t"],
  positions: Int[Array, "b t"],
  cache: KVCache,
  write_index: Int[Array, ""] | int,
  kv_mask: Bool[Array, "b s"],
  *,
  activation_dtype=None,
  last_only: bool = False,
):
  """Runs T new tokens against a KV cache: prefill (T > 1) or decode (T = 1).

  The new keys/values are written at cache slots [write_index, write_index+T)
  (the same slots for every row: prompts are left-padded so rows align). New
  token t attends to slot s iff kv_mask[b, s] and s ≤ write_index + t, so the
  caller marks the new slots valid in `kv_mask` (and padding invalid).

  Args:
    config: the architecture.
    params: the params tree.
    tokens: int [B, T] new tokens.
    positions: int [B, T] their RoPE positions.
    cache: from `init_cache`; the values are cast to the cache's dtype.
    write_index: first slot to write; may be traced (jit-friendly).
    kv_mask: bool/int [B, S] valid key slots, including the ones being written.
    activation_dtype: as `final_hidden_states`.
    last_only: the logits of the last column only, [B, 1, V]: what a
      sampler's prefill reads. The LM head (a fifth of SmolLM2-135M's FLOPs
      per token) then runs once per row instead of once per prompt token;
      XLA does not sink a slice of the logits into the head's matmul.

  Returns:
    (logits float32 [B, T, V], or [B, 1, V] with `last_only`; the updated
    cache).
  """
  _check_tokens(tokens)
  check_params(config, params)
  _check_same_shape(positions, tokens, "positions")
  b, t = tokens.shape
  s = cache["k"].shape[2]
  if cache["k"].shape[:2] != (config.num_layers, b):
    raise ValueError(
      f"cache k has shape {cache['k'].shape}; expected "
      f"[L={config.num_layers}, B={b}, S, Hkv, hd]"
    )
  if tuple(kv_mask.shape) != (b, s):
    raise ValueError(
      f"kv_mask has shape {tuple(kv_mask.shape)}; expected [B={b}, S={s}]"
    )
  if isinstance(write_index, int) and not 0 <= write_index <= s - t:
    # (A traced index cannot be checked; XLA would clamp it silently.)
    raise ValueError(
      f"write_index={write_index} with {t} new tokens does not "
      f"fit a cache of {s} slots"
    )
  write_index = jnp.asarray(write_index, jnp.int32)
  query_slot = write_index + jnp.arange(t, dtype=jnp.int32)
  causal = jnp.arange(s, dtype=jnp.int32)[None, :] <= query_slot[:, None]
  mask = causal[None] & kv_mask.astype(jnp.bool_)[:, None, :]
  cos, sin = layers.rope_cos_sin(config, positions)
  zero = jnp.zeros((), jnp.int32)

  def block(carry, xs):
    x, cache_k, cache_v = carry
    layer, i = xs

    def write_and_read(k, v):
      # Update the whole [L, ...] buffer in place (a loop-carried
      # dynamic_update_slice aliases), then read this layer's slice.
      start = (i, zero, write_index, zero, zero)
      ck = jax.lax.dynamic_update_slice(
        cache_k, k[None].astype(cache_k.dtype), start
      )
      cv = jax.lax.dynamic_update_slice(
        cache_v, v[None].astype(cache_v.dtype), start
      )
      return ck[i], cv[i], mask, (ck, cv)

    x, (cache_k, cache_v) = _attention_block(
      config, layer, x, cos, sin, write_and_read
    )
    x = _mlp_block(config, layer, x)
    return (x, cache_k, cache_v), None

  x = embed_tokens(params, tokens, activation_dtype)
  (x, k, v), _ = jax.lax.scan(
    block,
    (x, cache["k"], cache["v"]),
    (params["layers"], jnp.arange(config.num_layers, dtype=jnp.int32)),
  )
  if last_only:
    x = x[:, -1:]
  hidden = layers.rms_norm(
    x, params["final_norm"]["scale"], config.rms_norm_eps
  )
  return logits_from_hidden(config, params, hidden), {"k": k, "v": v}


def decode_with_prefix_cache(
  config: ModelConfig,
  params: Params,
  tokens: Int[Array, "b 1"],
  positions: Int[Array, "b 1"],
  prefix_cache: KVCache,
  prefix_mask: Bool[Array, "p sp"],
  cache: KVCache,
  write_index: Int[Array, ""] | int,
  kv_mask: Bool[Array, "b s"],
  *,
  activation_dtype=None,
  rope_table=None,
):
  """One decode step of B = P·n rows whose caches start with P shared prompts.

  Row b = i·n + j continues prompt i: its keys are prefix_cache[:, i] (the
  prompt, never written here) followed by its own `cache` slots. The new
  token's key/value is written at `cache` slot `write_index`; it attends to
  the prompt's valid slots and to its own slots s with kv_mask[b, s] and
  s ≤ write_index. The same function as `forward_with_cache` on the
  concatenated per-row cache [prefix_cache repeated n times; cache], without
  the n copies of the prompt (`layers.shared_prefix_attention`).

  The layers run unrolled, not scanned: each layer's own-slot cache is a
  buffer of its own, written in place and read by the attention matmuls
  where it lies. In a decode loop, make these outside the loop, so that no
  step copies or recomputes them: `params["layers"]` as `unstack_layers`
  tuples, the prompt cache as `to_prefix_cache`, and `rope_table`.

  Args:
    config: the architecture.
    params: the params tree; params["layers"] stacked or `unstack_layers`'d.
    tokens: int [B, 1] new tokens; positions: their RoPE positions.
    prefix_cache: {"k", "v"} [L, P, Sp, Hkv, hd] from a prefill, or its
      `to_prefix_cache` (k L x [P, Hkv, Sp, hd], v L x [P, Hkv, hd, Sp]).
    prefix_mask: bool/int [P, Sp] valid prompt slots.
    cache: the generated tokens' S slots, per layer, in the layout of
      `init_decode_cache` (k L x [B, Hkv, hd, S], v L x [B, Hkv, S, hd]).
    write_index: slot of the new token in `cache`; may be traced.
    kv_mask: bool/int [B, S] valid own slots, including the one written.
    activation_dtype: as `final_hidden_states`.
    rope_table: optional `layers.rope_table` (cos, sin) [N, hd] covering
      every position; the step's cos and sin are its rows at `positions`
      (a position >= N reads NaN). Without it they are computed here.

  Returns:
    (logits float32 [B, 1, V], updated cache).
  """
  _check_tokens(tokens)
  _check_same_shape(positions, tokens, "positions")
  b, t = tokens.shape
  num_layers = config.num_layers
  if t != 1:
    raise ValueError(
      f"decode_with_prefix_cache: tokens has {t} columns; expected 1"
    )
  hd = config.head_dim
  want = (b, config.num_kv_heads)
  if (
    not isinstance(cache["k"], (tuple, list))
    or not isinstance(cache["v"], (tuple, list))
    or len(cache["k"]) != num_layers
    or len(cache["v"]) != num_layers
  ):
    raise ValueError(
      f"cache has k {jax.tree.map(jnp.shape, cache['k'])}; expected "
      f"{num_layers} per-layer buffers k [B={b}, Hkv={config.num_kv_heads}, "
      f"hd={hd}, S] and v [B, Hkv, S, hd] (`init_decode_cache`)"
    )
  s = cache["v"][0].shape[2]
  for i, (ck, cv) in enumerate(zip(cache["k"], cache["v"])):
    if tuple(ck.shape) != (*want, hd, s) or tuple(cv.shape) != (*want, s, hd):
      raise ValueError(
        f"cache layer {i} has k {ck.shape}, v {cv.shape}; expected "
        f"k [B={b}, Hkv={config.num_kv_heads}, hd={hd}, S={s}] and "
        f"v [B, Hkv, S, hd] (`init_decode_cache`)"
      )
  if not isinstance(prefix_cache["k"], (tuple, list)):
    if jnp.ndim(prefix_cache["k"]) != 5 or jnp.ndim(prefix_cache["v"]) != 5:
      raise ValueError(
        f"prefix_cache has k {jnp.shape(prefix_cache['k'])}, v "
        f"{jnp.shape(prefix_cache['v'])}; expected a prefill cache "
        "[L, P, Sp, Hkv, hd] or its `to_prefix_cache`"
      )
    prefix_cache = to_prefix_cache(prefix_cache)
  p, _, sp, _ = _layer(prefix_cache["k"], 0).shape
  if (
    _num_layers(prefix_cache["k"]) != num_layers
    or _num_layers(prefix_cache["v"]) != num_layers
    or _num_layers(params["layers"]) != num_layers
    or b % p
  ):
    raise ValueError(
      f"prefix_cache k has {_num_layers(prefix_cache['k'])} layers of "
      f"[P={p}, Hkv, Sp={sp}, hd]; expected L={num_layers} with P dividing "
      f"B={b}, and params with {num_layers} layers"
    )
  want_pk = (p, config.num_kv_heads, sp, hd)
  for i, (pk, pv) in enumerate(zip(prefix_cache["k"], prefix_cache["v"])):
    if tuple(pk.shape) != want_pk or tuple(pv.shape) != (*want_pk[:2], hd, sp):
      raise ValueError(
        f"prefix_cache layer {i} has k {pk.shape}, v {pv.shape}; expected "
        f"k [P={p}, Hkv={config.num_kv_heads}, Sp={sp}, hd={hd}] and v "
        "[P, Hkv, hd, Sp] (`to_prefix_cache`)"
      )
  if tuple(prefix_mask.shape) != (p, sp):
    raise ValueError(
      f"prefix_mask has shape {tuple(prefix_mask.shape)}; "
      f"expected [P={p}, Sp={sp}]"
    )
  if tuple(kv_mask.shape) != (b, s):
    raise ValueError(
      f"kv_mask has shape {tuple(kv_mask.shape)}; expected [B={b}, S={s}]"
    )
  write_index = jnp.asarray(write_index, jnp.int32)
  causal = jnp.arange(s, dtype=jnp.int32) <= write_index
  mask = (causal[None] & kv_mask.astype(jnp.bool_))[:, None, :]
  prefix_mask = prefix_mask.astype(jnp.bool_)
  if rope_table is None:
    cos, sin = layers.rope_cos_sin(config, positions)
  else:
    if any(jnp.ndim(c) != 2 or jnp.shape(c)[1] != hd for c in rope_table):
      raise ValueError(
        f"rope_table has shapes {[jnp.shape(c) for c in rope_table]}; "
        f"expected (cos, sin) [N, hd={hd}] (`layers.rope_table`)"
      )
    cos, sin = (jnp.take(c, positions, axis=0) for c in rope_table)
  zero = jnp.zeros((), jnp.int32)

  x = embed_tokens(params, tokens, activation_dtype)
  out_k, out_v = [], []
  for i in range(num_layers):
    layer = _layer(params["layers"], i)
    q, k, v = _qkv(config, layer, x, cos, sin)
    # k [b, 1, Hkv, hd] -> column write_index of K [b, Hkv, hd, S];
    # v -> row write_index of V [b, Hkv, S, hd].
    cache_k = jax.lax.dynamic_update_slice(
      cache["k"][i],
      jnp.moveaxis(k, 1, -1).astype(cache["k"][i].dtype),
      (zero, zero, zero, write_index),
    )
    cache_v = jax.lax.dynamic_update_slice(
      cache["v"][i],
      jnp.swapaxes(v, 1, 2).astype(cache["v"][i].dtype),
      (zero, zero, write_index, zero),
    )
    out_k.append(cache_k)
    out_v.append(cache_v)
    out = layers.shared_prefix_attention(
      q,
      _layer(prefix_cache["k"], i).astype(q.dtype),
      _layer(prefix_cache["v"], i).astype(q.dtype),
      prefix_mask,
      cache_k.astype(q.dtype),
      cache_v.astype(q.dtype),
      mask,
    )
    x = x + layers.linear(
      out.reshape(b, t, config.num_heads * hd), layer["o_proj"]
    )
    x = _mlp_block(config, layer, x)
  hidden = layers.rms_norm(
    x, params["final_norm"]["scale"], config.rms_norm_eps
  )
  return logits_from_hidden(config, params, hidden), {
    "k": tuple(out_k),
    "v": tuple(out_v),
  }


# ------------------------------------------------------------ Flax wrapper
class Decoder(nn.Module):
  """`flax.linen` face of the decoder: `init` creates the contract params
  layout under "params", `apply` calls `forward`."""

  config: ModelConfig
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(
    self,
    tokens,
    attention_mask=None,
    positions=None,
    *,
    remat: bool = False,
    return_hidden: bool = False,
  ):
    cfg, dtype = self.config, self.param_dtype
    parts = {
      "embed": init_embed,
      "layers": init_layers,
      "final_norm": init_final_norm,
    }
    if not cfg.tie_word_embeddings:
      parts["lm_head"] = init_lm_head
    params = {
      name: self.param(name, lambda rng, f=init: f(cfg, rng, dtype))
      for name, init in parts.items()
    }
    return forward(
      cfg,
      params,
      tokens,
      attention_mask,
      positions,
      remat=remat,
      return_hidden=return_hidden,
    )
