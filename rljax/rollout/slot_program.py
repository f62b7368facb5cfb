"""The jitted programs of continuous batching: a fixed set of decode slots.

The device state (`init_state`) holds S = G·n slots in G slot groups; group
g holds the n samples of one prompt, rows g·n .. g·n + n - 1:

  prefix pool   k, v per layer [G, Hkv, Lp, hd] (`decoder.to_prefix_cache`
                layout) and mask [G, Lp]: the group's prompt, written once by
                its prefill and read by its n rows (shared-prefix attention,
                `layers.shared_prefix_attention`, as the static program);
  own cache     k [S, Hkv, hd, C], v [S, Hkv, C, hd] per layer: each row's
                generated tokens, token t at slot t; C grows (and shrinks)
                in buckets with the longest live row (`resize_cache`);
                with pages (`plan.page_size` = P), instead a pool k [N, Hkv,
                hd, P], v [N, Hkv, P, hd] read through a block table [S,
                C/P] the host passes to each chunk (`kv_pages`), N growing
                with the live rows' tokens (`resize_pool`);
  row state     last token, its position, length, done, PRNG key data.

Five programs move it, each keyed by static shapes only:

  prefill_groups  F prompts (F a power of two) into F free groups: their
                  prefix entries, first tokens, keys (one program per
                  prompt bucket Lp and F);
  decode_chunk    up to `chunk_steps` decode steps of all S rows, leaving
                  early when enough groups have finished for a refill
                  (`refill_at`) or every row is done; returns the tokens
                  and log-probs each row sampled in the chunk;
  resize_cache    the own cache padded or cut to another capacity C;
  resize_pool     with pages, the pool grown to more pages;
  recompute_kv    every live row's KV (its group's prefix entry and its
                  own cache) recomputed with new weights, for an in-flight
                  weight update in "recompute" mode (`inflight`); in
                  `slot_recompute`, beside this module.

Why groups and not single rows: a row's prompt keys are read through the
group's one prefix entry, so the n samples of a prompt never read n copies
of it (the static sampler's advantage, kept). A per-row refill would need a
per-row gather of prefix entries at every step and layer, which on a CPU
costs about what the n copies cost. The price: a group is refilled when its
last sample ends, so a finished sample's row idles until its siblings end;
the benchmark reports that idle share (experiments/bench_rollout.py).

Rows write their own token t at own-cache slot t (a per-row scatter), so
rows that started at different times share one program; the attention mask
of row b is s ≤ t_b. A row's token t is drawn with `fold_in(key_b, t)`, the
static program's rule, so the same seed samples the same tokens in either
engine (up to float noise of a different batch composition).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from rljax import models
from rljax.models import decoder as decoder_lib
from rljax.models import layers as layers_lib
from rljax.rollout import kv_pages
from rljax.rollout.token_sampling import sample_next_token


@dataclasses.dataclass(frozen=True)
class SlotPlan:
  """Static shapes and switches of the slot programs.

  Attributes:
    groups: G slot groups (prompts decoded at once).
    n: rows per group (samples per prompt).
    prompt_len: Lp, the prefix pool's prompt bucket.
    rope_len: positions covered by the RoPE table (Lp + new-token capacity).
    chunk_steps: most decode steps of one `decode_chunk` call.
    greedy, top_k, use_top_p: the sampling switches (`sample_next_token`).
    num_stop_ids: length of the traced stop-id array.
    pad_id: token written after a row's end.
    cache_dtype: dtype of both caches.
    activation_dtype: as `decoder.final_hidden_states`.
    page_size: P > 0: the own cache is a pool of P-slot pages read through
      a block table (`kv_pages`); 0: S rows × C slots.
  """

  groups: int
  n: int
  prompt_len: int
  rope_len: int
  chunk_steps: int
  greedy: bool
  top_k: int
  use_top_p: bool
  num_stop_ids: int
  pad_id: int
  cache_dtype: Any
  activation_dtype: Any = None
  page_size: int = 0

  @property
  def slots(self) -> int:
    return self.groups * self.n


def _sampler(plan: SlotPlan, temperature, top_p):
  return functools.partial(
    sample_next_token,
    temperature=temperature,
    top_k=plan.top_k,
    top_p=top_p if plan.use_top_p else 1.0,
    greedy=plan.greedy,
  )


def _fold(key_data, step):
  """Per-row keys `fold_in(key_b, step_b)` from raw key data [S, ...]."""
  keys = jax.random.wrap_key_data(key_data)
  return jax.vmap(jax.random.fold_in)(keys, step)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def init_state(config, plan: SlotPlan, capacity: int) -> dict[str, Any]:
  """Empty slots: every row done, every prefix entry masked out. `capacity`
  is the own cache's C slots a row, or with pages the pool's N pages."""
  g, s, lp = plan.groups, plan.slots, plan.prompt_len
  prefix = decoder_lib.to_prefix_cache(
    models.init_cache(config, g, lp, plan.cache_dtype)
  )
  key_data = jax.random.key_data(jax.random.split(jax.random.key(0), s))
  return {
    "prefix": prefix,
    "prefix_mask": jnp.zeros((g, lp), jnp.int32),
    "cache": (
      models.init_decode_cache(
        config, capacity, plan.page_size, plan.cache_dtype
      )
      if plan.page_size
      else models.init_decode_cache(config, s, capacity, plan.cache_dtype)
    ),
    "tok": jnp.full((s,), plan.pad_id, jnp.int32),
    "pos": jnp.zeros((s,), jnp.int32),
    "length": jnp.zeros((s,), jnp.int32),
    "done": jnp.ones((s,), jnp.bool_),
    "limit": jnp.ones((s,), jnp.int32),
    "keys": key_data,
  }


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def prefill_groups(
  config,
  plan: SlotPlan,
  params,
  state,
  prompt_tokens,
  prompt_mask,
  groups,
  key_data,
  limits,
  temperature,
  top_p,
  stop_ids,
  max_new_tokens,
):
  """Prefills F prompts into slot groups `groups` and samples their first
  tokens.

  Args:
    config, plan: static.
    params: the rollout weights (stacked layers, as `forward_with_cache`).
    state: the slot state (donated).
    prompt_tokens, prompt_mask: int32 [F, Lp], left-padded.
    groups: int32 [F] target groups; G (out of range) for padding prompts,
      whose writes are dropped.
    key_data: [F·n, ...] raw PRNG key data of the new rows (`sample_keys`).
    limits: int32 [F·n] each new row's most tokens (<= max_new_tokens).
    temperature, top_p: f32 scalars; stop_ids: int32 [num_stop_ids];
    max_new_tokens: int32 scalar.

  Returns:
    (state, first tokens int32 [F·n], their log-probs f32 [F·n]).
  """
  f = prompt_tokens.shape[0]
  n = plan.n
  positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
  cache = models.init_cache(config, f, plan.prompt_len, plan.cache_dtype)
  logits, cache = models.forward_with_cache(
    config,
    params,
    prompt_tokens,
    positions,
    cache,
    0,
    prompt_mask,
    activation_dtype=plan.activation_dtype,
    last_only=True,
  )
  new_prefix = decoder_lib.to_prefix_cache(cache)
  prefix = jax.tree.map(
    lambda pool, new: pool.at[groups].set(new.astype(pool.dtype), mode="drop"),
    state["prefix"],
    new_prefix,
  )
  prefix_mask = state["prefix_mask"].at[groups].set(prompt_mask, mode="drop")
  rows = (groups[:, None] * n + jnp.arange(n, dtype=jnp.int32)).reshape(-1)
  # Padding prompts' rows land past the last slot and are dropped.
  rows = jnp.where(jnp.repeat(groups, n) < plan.groups, rows, plan.slots)
  tok, logp = _sampler(plan, temperature, top_p)(
    jnp.repeat(logits[:, -1], n, axis=0),
    _fold(key_data, jnp.zeros((f * n,), jnp.int32)),
  )
  limits = jnp.minimum(limits, max_new_tokens)
  done = jnp.isin(tok, stop_ids) | (limits <= 1)
  set_rows = lambda x, v: x.at[rows].set(v, mode="drop")
  state = {
    **state,
    "prefix": prefix,
    "prefix_mask": prefix_mask,
    "tok": set_rows(state["tok"], tok),
    "pos": set_rows(state["pos"], jnp.repeat(positions[:, -1] + 1, n)),
    "length": set_rows(state["length"], jnp.ones((f * n,), jnp.int32)),
    "done": set_rows(state["done"], done),
    "limit": set_rows(state["limit"], limits),
    "keys": set_rows(state["keys"], key_data),
  }
  return state, tok, logp


def decode_step(
  config,
  params,
  tokens,
  positions,
  prefix,
  prefix_mask,
  cache,
  write_index,
  *,
  activation_dtype=None,
  rope_table,
  table=None,
):
  """One decode step of S rows, each writing its own slot.

  `decoder.decode_with_prefix_cache` with a per-row write slot: row b's new
  key/value goes to own-cache slot write_index[b] (out of range: dropped, an
  idle row) and it attends to its group's prompt and to its own slots
  s ≤ write_index[b].

  Args:
    config: the architecture.
    params: params with `unstack_layers`'d layers.
    tokens, positions: int32 [S, 1].
    prefix: `to_prefix_cache` layout, G entries; prefix_mask [G, Lp].
    cache: own cache (`init_decode_cache` layout), S rows, C slots; with
      `table`, the page pool (`kv_pages`), N pages of P slots.
    write_index: int32 [S].
    activation_dtype: as `decoder.final_hidden_states`.
    rope_table: `layers.rope_table` covering every position.
    table: None, or the block table int32 [S, C/P] of a paged cache.

  Returns:
    (logits f32 [S, 1, V], updated cache).
  """
  b = tokens.shape[0]
  hd = config.head_dim
  page_size = cache["v"][0].shape[2] if table is not None else 0
  c = table.shape[1] * page_size if page_size else cache["v"][0].shape[2]
  rows = jnp.arange(b, dtype=jnp.int32)
  mask = (jnp.arange(c, dtype=jnp.int32)[None] <= write_index[:, None])[
    :, None, :
  ]
  prefix_mask = prefix_mask.astype(jnp.bool_)
  cos, sin = (jnp.take(t, positions, axis=0) for t in rope_table)
  x = decoder_lib.embed_tokens(params, tokens, activation_dtype)
  out_k, out_v = [], []
  for i in range(config.num_layers):
    layer = params["layers"][i]
    q, k, v = decoder_lib._qkv(config, layer, x, cos, sin)  # pylint: disable=protected-access
    if page_size:
      pool_k, pool_v = kv_pages.write(
        cache["k"][i],
        cache["v"][i],
        k[:, 0],
        v[:, 0],
        table,
        write_index,
        page_size,
      )
      out_k.append(pool_k)
      out_v.append(pool_v)
      cache_k, cache_v = kv_pages.gather(pool_k, pool_v, table)
    else:
      # k, v [S, 1, Hkv, hd]: row b's go to K[b, :, :, w_b] and V[b, :, w_b].
      cache_k = (
        cache["k"][i]
        .at[rows, :, :, write_index]
        .set(k[:, 0].astype(cache["k"][i].dtype), mode="drop")
      )
      cache_v = (
        cache["v"][i]
        .at[rows, :, write_index, :]
        .set(v[:, 0].astype(cache["v"][i].dtype), mode="drop")
      )
      out_k.append(cache_k)
      out_v.append(cache_v)
    out = layers_lib.shared_prefix_attention(
      q,
      prefix["k"][i].astype(q.dtype),
      prefix["v"][i].astype(q.dtype),
      prefix_mask,
      cache_k.astype(q.dtype),
      cache_v.astype(q.dtype),
      mask,
    )
    x = x + layers_lib.linear(
      out.reshape(b, 1, config.num_heads * hd), layer["o_proj"]
    )
    x = decoder_lib._mlp_block(config, layer, x)  # pylint: disable=protected-access
  hidden = layers_lib.rms_norm(
    x, params["final_norm"]["scale"], config.rms_norm_eps
  )
  logits = decoder_lib.logits_from_hidden(config, params, hidden)
  return logits, {"k": tuple(out_k), "v": tuple(out_v)}


# State entries a decode chunk reads and leaves as they are.
_FIXED = ("prefix", "prefix_mask", "keys", "limit")


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def decode_chunk(
  config,
  plan: SlotPlan,
  params,
  state,
  temperature,
  top_p,
  stop_ids,
  max_new_tokens,
  step_limit,
  refill_at,
  table=None,
):
  """Decodes every live row for up to `step_limit` (<= chunk_steps) steps.

  Leaves early when every row is done or when `refill_at` groups have all
  their rows done (the scheduler has prompts waiting for them).

  Args:
    config, plan: static.
    params: the rollout weights with `unstack_layers`'d layers.
    state: the slot state (donated); the own cache must hold every live
      row's next `step_limit` tokens (`resize_cache`).
    temperature, top_p, stop_ids: as `prefill_groups`; max_new_tokens:
      unused here (each row's limit is in the state), kept for one
      argument list.
    step_limit: int32 scalar; refill_at: int32 scalar (G + 1: never).
    table: with pages (`plan.page_size`), the block table int32 [S, C/P]:
      every live row holds the pages of its next `step_limit` tokens.

  Returns:
    (state, tokens int32 [S, chunk_steps] and log-probs f32 [S, chunk_steps]
    sampled per row in this chunk, a row's valid ones first (its length
    grew by their count), steps run, live row-steps run).
  """
  s, k = plan.slots, plan.chunk_steps
  sample = _sampler(plan, temperature, top_p)
  rope_table = layers_lib.rope_table(config, plan.rope_len)
  capacity = own_capacity(plan, state, table)

  def free_groups(done):
    return jnp.sum(jnp.all(done.reshape(plan.groups, plan.n), axis=1))

  # What the loop reads but never changes (the prompts, keys, limits) stays
  # out of its carry, as the static program's prefix cache does.
  fixed = {name: state[name] for name in _FIXED}
  moving = {name: value for name, value in state.items() if name not in _FIXED}

  def cond(carry):
    step, st, *_ = carry
    return (
      (step < step_limit)
      & ~jnp.all(st["done"])
      & (free_groups(st["done"]) < refill_at)
    )

  def body(carry):
    step, st, out_tok, out_logp, live_steps = carry
    live = ~st["done"]
    # The fed token's slot; an idle row writes nowhere.
    write = jnp.where(live, st["length"] - 1, capacity)
    logits, cache = decode_step(
      config,
      params,
      st["tok"][:, None],
      st["pos"][:, None],
      fixed["prefix"],
      fixed["prefix_mask"],
      st["cache"],
      write,
      activation_dtype=plan.activation_dtype,
      rope_table=rope_table,
      table=table,
    )
    tok, logp = sample(logits[:, 0], _fold(fixed["keys"], st["length"]))
    tok = jnp.where(live, tok, plan.pad_id)
    logp = jnp.where(live, logp, 0.0)
    out_tok = jax.lax.dynamic_update_slice(out_tok, tok[:, None], (0, step))
    out_logp = jax.lax.dynamic_update_slice(out_logp, logp[:, None], (0, step))
    length = st["length"] + live.astype(jnp.int32)
    ended = jnp.isin(tok, stop_ids) | (length >= fixed["limit"])
    st = {
      "cache": cache,
      "tok": jnp.where(live, tok, st["tok"]),
      "pos": st["pos"] + live.astype(jnp.int32),
      "length": length,
      "done": st["done"] | (live & ended),
    }
    return step + 1, st, out_tok, out_logp, live_steps + jnp.sum(live)

  carry = (
    jnp.int32(0),
    moving,
    jnp.full((s, k), plan.pad_id, jnp.int32),
    jnp.zeros((s, k), jnp.float32),
    jnp.int32(0),
  )
  steps, moving, out_tok, out_logp, live_steps = jax.lax.while_loop(
    cond, body, carry
  )
  state = {**fixed, **moving}
  return state, out_tok, out_logp, steps, live_steps


# Not donated: the resized cache has another shape, so no buffer is reused.
@functools.partial(jax.jit, static_argnums=(0,))
def resize_cache(capacity: int, state):
  """The state with its own cache padded or cut to `capacity` slots.

  Row b's token t sits at slot t, so a cut keeps every live row's tokens
  when capacity exceeds the longest live row.
  """

  def fit(x, axis):
    now = x.shape[axis]
    if capacity <= now:
      return jax.lax.slice_in_dim(x, 0, capacity, axis=axis)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, capacity - now)
    return jnp.pad(x, pad)

  cache = state["cache"]
  cache = {
    "k": tuple(fit(x, 3) for x in cache["k"]),
    "v": tuple(fit(x, 2) for x in cache["v"]),
  }
  return {**state, "cache": cache}


def own_capacity(plan: SlotPlan, state, table) -> int:
  """C, the own-cache slots a row reads: the contiguous cache's, or with
  pages the block table's width × P."""
  if plan.page_size:
    return table.shape[1] * plan.page_size
  return state["cache"]["v"][0].shape[2]


# Not donated: the grown pool has another shape, so no buffer is reused.
@functools.partial(jax.jit, static_argnums=(0,))
def resize_pool(pages: int, state):
  """The state with its page pool grown to `pages` pages (the new ones
  zero; every held page keeps its index)."""

  def grow(x):
    return jnp.pad(x, [(0, pages - x.shape[0])] + [(0, 0)] * (x.ndim - 1))

  return {**state, "cache": jax.tree.map(grow, state["cache"])}


def cache_capacity(needed: int, most: int) -> int:
  """Own-cache slots for `needed` tokens: 64, 128, 256, ..., at most `most`
  (the new-token capacity), so that C takes a few values (compiles)."""
  size = 64
  while size < needed:
    size *= 2
  return max(1, min(size, most))


def kv_bytes(config, plan: SlotPlan, capacity: int) -> int:
  """Bytes of the prefix pool and own cache at own-cache capacity C (with
  pages: of the pool at `capacity` pages)."""
  own = capacity * plan.page_size if plan.page_size else plan.slots * capacity
  return kv_token_bytes(config, plan, own)


def kv_token_bytes(config, plan: SlotPlan, tokens: int) -> int:
  """Bytes of the prefix pool and of `tokens` own-cache token slots."""
  per_token = (
    2
    * config.num_layers
    * config.num_kv_heads
    * config.head_dim
    * jnp.dtype(plan.cache_dtype).itemsize
  )
  return per_token * (plan.groups * plan.prompt_len + tokens)
