"""The decoder against a KV cache: the cache layouts, the prefill/decode step
that writes and attends to a stacked cache (`forward_with_cache`), and the
sampler's one-token decode step over shared prompt caches
(`decode_with_prefix_cache`).

The decode step unrolls its layers over per-layer KV buffers rather than
scanning stacked ones, so that no step copies a layer's cache out of a
stacked array: everything here is laid out for the matmuls that read it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from rljax.models import blocks, layers
from rljax.models.config import ModelConfig
from rljax.models.decoder_params import Params, check_params

KVCache = dict[str, jax.Array]


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
    activation_dtype: as `decoder.final_hidden_states`.
    last_only: the logits of the last column only, [B, 1, V]: what a
      sampler's prefill reads. The LM head (a fifth of SmolLM2-135M's FLOPs
      per token) then runs once per row instead of once per prompt token;
      XLA does not sink a slice of the logits into the head's matmul.

  Returns:
    (logits float32 [B, T, V], or [B, 1, V] with `last_only`; the updated
    cache).
  """
  blocks.check_tokens(tokens)
  check_params(config, params)
  blocks.check_same_shape(positions, tokens, "positions")
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

    x, (cache_k, cache_v) = blocks.attention_block(
      config, layer, x, cos, sin, write_and_read
    )
    x = blocks.mlp_block(config, layer, x)
    return (x, cache_k, cache_v), None

  x = blocks.embed_tokens(params, tokens, activation_dtype)
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
  return blocks.logits_from_hidden(config, params, hidden), {"k": k, "v": v}


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
    activation_dtype: as `decoder.final_hidden_states`.
    rope_table: optional `layers.rope_table` (cos, sin) [N, hd] covering
      every position; the step's cos and sin are its rows at `positions`
      (a position >= N reads NaN). Without it they are computed here.

  Returns:
    (logits float32 [B, 1, V], updated cache).
  """
  blocks.check_tokens(tokens)
  blocks.check_same_shape(positions, tokens, "positions")
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

  x = blocks.embed_tokens(params, tokens, activation_dtype)
  out_k, out_v = [], []
  for i in range(num_layers):
    layer = _layer(params["layers"], i)
    q, k, v = blocks.qkv(config, layer, x, cos, sin)
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
    x = blocks.mlp_block(config, layer, x)
  hidden = layers.rms_norm(
    x, params["final_norm"]["scale"], config.rms_norm_eps
  )
  return blocks.logits_from_hidden(config, params, hidden), {
    "k": tuple(out_k),
    "v": tuple(out_v),
  }
