"""The jitted programs of continuous batching: a decode batch of live rows.

The device holds one thing across calls, the page pool (`kv_pages`):
every prompt's and every row's keys and values. Everything else a program
needs per row (its last token, position, length, limit, done flag, PRNG
key data, prefix entry and block-table row) comes from the host with each
call, so the host chooses which rows a call decodes and in which order; a
batch shrinks or refills by passing other rows, and no KV moves.

  prefill        F prompts (F a power of two), left-padded to the prompt
                 bucket Lp: their keys and values into their entries'
                 pages, and the first token of each of their n samples
                 (one program per F; Lp is the plan's);
  decode_chunk   up to `chunk_steps` decode steps of a bucket of S_b rows
                 (S_b in `row_buckets`: S/8, S/4, S/2, S), leaving early
                 when the live rows fall to `exit_live` (the host then
                 refills or moves the rows to a smaller bucket); returns the
                 tokens and log-probs each row sampled and its new state;
  init_pool      the empty pool.

Compile keys are the plan (fixed for a request's shapes) and S_b or F:
the pool's size and the tables' widths are the plan's, not the rows'.

A decode step (`decode_step`) runs the decoder on S_b single tokens; each
layer writes each live row's new key and value into its own page
(`kv_pages.write_tokens`) and attends over its prompt's pages and its own
pages up to its own length (`paged_attention`: the C++ kernel on the CPU,
so a row's attention costs its own tokens, and the rows of one prompt read
its pages once). A done or padding row writes nowhere and reads nothing.

A row's token t is drawn with `fold_in(key_b, t)` from the key of (seed,
prompt, sample) (`token_sampling.sample_keys`), so neither the batch a row
runs in nor its place in it changes what it samples (up to float noise of
the matmuls at another batch size).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from rljax import models
from rljax.models import blocks as blocks_lib
from rljax.models import decoder as decoder_lib
from rljax.models import layers as layers_lib
from rljax.rollout import kv_pages
from rljax.rollout import paged_attention as attention_lib
from rljax.rollout.token_sampling import sample_keys
from rljax.rollout.token_sampling import sample_next_token


@dataclasses.dataclass(frozen=True)
class SlotPlan:
  """Static shapes and switches of one request's slot programs.

  Attributes:
    slots: S, the most rows decoding at once (the largest row bucket).
    n: samples per prompt.
    prompt_len: Lp, the prompt bucket (a multiple of page_size).
    new_tokens: most tokens a row samples (the new-token capacity).
    chunk_steps: most decode steps of one `decode_chunk` call.
    greedy, top_k, use_top_p: the sampling switches (`sample_next_token`).
    num_stop_ids: length of the traced stop-id array.
    pad_id: token written after a row's end.
    cache_dtype: the pool's dtype (a bf16 pool is stored as its uint16
      bits, `kv_pages.storage_dtype`).
    activation_dtype: as `decoder.final_hidden_states`.
    page_size: P, token slots a page.
    entries: E, prompts whose pages the pool holds at once.
    attention: "native" or "xla" (`paged_attention.choose`).
    held_rows: rows that may hold own pages at once when that is more
      than `slots` (a multi-turn row keeps its pages while its tool runs
      outside the decode batch, `slot_episodes`); 0: `slots`.
  """

  slots: int
  n: int
  prompt_len: int
  new_tokens: int
  chunk_steps: int
  greedy: bool
  top_k: int
  use_top_p: bool
  num_stop_ids: int
  pad_id: int
  cache_dtype: Any
  activation_dtype: Any
  page_size: int
  entries: int
  attention: str
  held_rows: int = 0

  @property
  def own_pages(self) -> int:
    """W: block-table width of a row (pages of `new_tokens` slots)."""
    return kv_pages.pages_for(self.new_tokens, self.page_size)

  @property
  def prompt_pages(self) -> int:
    """Wp: pages of a prompt bucket."""
    return self.prompt_len // self.page_size

  @property
  def pool_pages(self) -> int:
    return kv_pages.pool_pages(
      max(self.slots, self.held_rows),
      self.new_tokens,
      self.entries,
      self.prompt_len,
      self.page_size,
    )

  @property
  def rope_len(self) -> int:
    return self.prompt_len + self.new_tokens


# Smallest row bucket as a fraction of S: a step's cost per row (its
# matmuls and sampling) is ~2 % of the step's fixed part on SmolLM2 on a CPU
# (docs/performance.md, the profile's b against a), so rows below S/8 gain
# little from a smaller program, and every bucket is a compile.
SMALLEST_BUCKET = 8


def row_buckets(slots: int) -> tuple[int, ...]:
  """Row counts a decode program is compiled for: S/8, S/4, S/2 (powers of
  two, at least 1) and S."""
  size = 1
  while size * SMALLEST_BUCKET < slots:
    size *= 2
  sizes = []
  while size < slots:
    sizes.append(size)
    size *= 2
  return tuple(sizes) + (slots,)


def bucket_for(rows: int, slots: int) -> int:
  """The smallest row bucket holding `rows` rows."""
  return next(b for b in row_buckets(slots) if b >= rows)


def _sampler(plan: SlotPlan, temperature, top_p):
  return functools.partial(
    sample_next_token,
    temperature=temperature,
    top_k=plan.top_k,
    top_p=top_p if plan.use_top_p else 1.0,
    greedy=plan.greedy,
  )


def _fold(key_data, step):
  """Per-row keys `fold_in(key_b, step_b)` from raw key data [B, ...]."""
  keys = jax.random.wrap_key_data(key_data)
  return jax.vmap(jax.random.fold_in)(keys, step)


@functools.partial(jax.jit, static_argnums=(0, 1))
def init_pool(config, plan: SlotPlan) -> dict[str, Any]:
  """The empty pool: N pages of P slots per layer (`kv_pages`)."""
  return models.init_decode_cache(
    config,
    plan.pool_pages,
    plan.page_size,
    kv_pages.storage_dtype(plan.cache_dtype),
  )


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def prefill(
  config,
  plan: SlotPlan,
  params,
  pool,
  prompt_tokens,
  prompt_mask,
  pages,
  seeds,
  prompt_index,
  temperature,
  top_p,
):
  """Prefills F prompts into their entries' pages and samples the first
  token of each of their n samples.

  Args:
    config, plan: static.
    params: the rollout weights (stacked layers, as `forward_with_cache`).
    pool: the page pool (donated).
    prompt_tokens, prompt_mask: int32 [F, Lp], left-padded.
    pages: int32 [F, Wp] the entry pages of each prompt's P-slot blocks
      (N: not written; a padding prompt has only N).
    seeds: uint32 [F] each prompt's seed (its low 32 bits); prompt_index:
      int32 [F]: sample j of prompt i gets `sample_keys(seed_i, index_i, j)`.
    temperature, top_p: f32 scalars.

  Returns:
    (pool, first tokens int32 [F·n], their log-probs f32 [F·n], the
    samples' raw key data [F·n, ...]).
  """
  f = prompt_tokens.shape[0]
  key_data = jax.random.key_data(
    sample_keys(
      jnp.repeat(seeds, plan.n),
      jnp.repeat(prompt_index, plan.n),
      jnp.tile(jnp.arange(plan.n, dtype=jnp.int32), f),
    )
  )
  positions = decoder_lib.positions_from_mask(prompt_mask)
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
  out_k, out_v = [], []
  for i in range(config.num_layers):
    k, v = kv_pages.write_blocks(
      pool["k"][i], pool["v"][i], cache["k"][i], cache["v"][i], pages
    )
    out_k.append(k)
    out_v.append(v)
  tok, logp = _sampler(plan, temperature, top_p)(
    jnp.repeat(logits[:, -1], plan.n, axis=0),
    _fold(key_data, jnp.zeros((f * plan.n,), jnp.int32)),
  )
  return {"k": tuple(out_k), "v": tuple(out_v)}, tok, logp, key_data


def paged_decoder(
  config,
  params,
  pool,
  tokens,
  cos,
  sin,
  table,
  write,
  count,
  own_len,
  prefix: attention_lib.Prefix,
  entry,
  *,
  activation_dtype=None,
  attention: str = "xla",
):
  """The decoder on T tokens of each of B rows over the page pool: the one
  layer loop of a decode step (T = 1) and a verify step (T > 1).

  Row b's T keys and values go to own slots write[b], ..., write[b] +
  count[b] - 1 (count 0: nothing written); its query t attends to its
  prefix entry's prompt slots and its own slots u < own_len[b] - (T - 1)
  + t (`paged_attention`).

  Args:
    config: the architecture.
    params: params with `unstack_layers`'d layers.
    pool: the page pool (`init_pool`).
    tokens: int32 [B, T]; cos, sin: their RoPE rows [B, T, ...].
    table: int32 [B, W] the rows' own pages.
    write, count, own_len, entry: int32 [B].
    prefix: the entries' prompt pages.
    activation_dtype: as `decoder.final_hidden_states`.
    attention: "native" or "xla" (`paged_attention`).

  Returns:
    (logits f32 [B, T, V], the pool with the new keys and values).
  """
  b, t = tokens.shape
  x = decoder_lib.embed_tokens(params, tokens, activation_dtype)
  out_k, out_v = [], []
  for i in range(config.num_layers):
    layer = params["layers"][i]
    q, k, v = blocks_lib.qkv(config, layer, x, cos, sin)
    pool_k, pool_v = kv_pages.write_tokens(
      pool["k"][i], pool["v"][i], k, v, table, write, count
    )
    out_k.append(pool_k)
    out_v.append(pool_v)
    out = attention_lib.paged_attention(
      q, pool_k, pool_v, table, own_len, prefix, entry, impl=attention
    )
    x = x + layers_lib.linear(
      out.reshape(b, t, config.num_heads * config.head_dim).astype(x.dtype),
      layer["o_proj"],
    )
    x = blocks_lib.mlp_block(config, layer, x)
  hidden = layers_lib.rms_norm(
    x, params["final_norm"]["scale"], config.rms_norm_eps
  )
  logits = decoder_lib.logits_from_hidden(config, params, hidden)
  return logits, {"k": tuple(out_k), "v": tuple(out_v)}


def decode_step(
  config,
  params,
  pool,
  tokens,
  positions,
  own_len,
  table,
  prefix: attention_lib.Prefix,
  entry,
  *,
  activation_dtype=None,
  rope_table,
  attention: str = "xla",
):
  """One decode step of B rows over the page pool (`paged_decoder` at
  T = 1).

  Row b feeds tokens[b] at position positions[b]; its key and value go to
  own slot own_len[b] - 1 (own_len 0: an idle row, which writes nowhere
  and whose output is not read), and it attends to its prefix entry's
  prompt slots and its own slots u < own_len[b].

  Args:
    tokens, positions, own_len, entry: int32 [B].
    rope_table: `layers.rope_table` covering every position.
    the rest: as `paged_decoder`.

  Returns:
    (logits f32 [B, V], the pool with the new keys and values).
  """
  cos, sin = (jnp.take(t, positions[:, None], axis=0) for t in rope_table)
  count = (own_len > 0).astype(jnp.int32)
  logits, pool = paged_decoder(
    config, params, pool, tokens[:, None], cos, sin, table, own_len - 1,
    count, own_len, prefix, entry, activation_dtype=activation_dtype,
    attention=attention,
  )  # fmt: skip
  return logits[:, 0], pool


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def decode_chunk(
  config,
  plan: SlotPlan,
  params,
  pool,
  rows,
  table,
  prefix,
  temperature,
  top_p,
  stop_ids,
  step_limit,
  exit_live,
):
  """Decodes the live rows of a bucket for up to `step_limit` steps.

  Leaves early when every row is done or when no more than `exit_live`
  rows are live (the host refills, or moves the rows to a smaller bucket).

  Args:
    config, plan: static.
    params: the rollout weights with `unstack_layers`'d layers.
    pool: the page pool (donated); every live row holds the pages of its
      next `step_limit` tokens.
    rows: the bucket's row state, each [S_b]: "tok" (last sampled token,
      fed next), "pos" (its position), "length" (tokens sampled so far,
      >= 1), "limit" (the row's most tokens), "done" (bool; padding rows
      done), "keys" (raw PRNG key data [S_b, ...]), "entry" (prefix entry).
    table: int32 [S_b, W] the rows' own pages.
    prefix: `paged_attention.Prefix` of the plan's E entries.
    temperature, top_p, stop_ids: the traced sampling arguments.
    step_limit: int32 scalar <= chunk_steps; exit_live: int32 scalar.

  Returns:
    (pool, rows with new "tok", "pos", "length", "done", tokens int32
    [S_b, chunk_steps] and log-probs f32 [S_b, chunk_steps] sampled in this
    chunk (a row's valid ones first: its length grew by their count),
    steps run, live row-steps run).
  """
  s, k = rows["tok"].shape[0], plan.chunk_steps
  sample = _sampler(plan, temperature, top_p)
  rope_table = layers_lib.rope_table(config, plan.rope_len)

  def cond(carry):
    step, _, st, *_ = carry
    live = jnp.sum(~st["done"])
    return (step < step_limit) & (live > jnp.maximum(exit_live, 0))

  def body(carry):
    step, pool, st, out_tok, out_logp, live_steps = carry
    live = ~st["done"]
    logits, pool = decode_step(
      config,
      params,
      pool,
      st["tok"],
      st["pos"],
      jnp.where(live, st["length"], 0),
      table,
      prefix,
      jnp.where(live, rows["entry"], -1),
      activation_dtype=plan.activation_dtype,
      rope_table=rope_table,
      attention=plan.attention,
    )
    tok, logp = sample(logits, _fold(rows["keys"], st["length"]))
    tok = jnp.where(live, tok, plan.pad_id)
    logp = jnp.where(live, logp, 0.0)
    out_tok = jax.lax.dynamic_update_slice(out_tok, tok[:, None], (0, step))
    out_logp = jax.lax.dynamic_update_slice(out_logp, logp[:, None], (0, step))
    length = st["length"] + live.astype(jnp.int32)
    ended = jnp.isin(tok, stop_ids) | (length >= rows["limit"])
    st = {
      "tok": jnp.where(live, tok, st["tok"]),
      "pos": st["pos"] + live.astype(jnp.int32),
      "length": length,
      "done": st["done"] | (live & ended),
    }
    return step + 1, pool, st, out_tok, out_logp, live_steps + jnp.sum(live)

  state = {name: rows[name] for name in ("tok", "pos", "length", "done")}
  carry = (
    jnp.int32(0),
    pool,
    state,
    jnp.full((s, k), plan.pad_id, jnp.int32),
    jnp.zeros((s, k), jnp.float32),
    jnp.int32(0),
  )
  steps, pool, state, out_tok, out_logp, live_steps = jax.lax.while_loop(
    cond, body, carry
  )
  return pool, state, out_tok, out_logp, steps, live_steps


def kv_token_bytes(config, cache_dtype, tokens: int) -> int:
  """Bytes of `tokens` token slots of KV (every layer, keys and values)."""
  per_token = (
    2
    * config.num_layers
    * config.num_kv_heads
    * config.head_dim
    * jnp.dtype(cache_dtype).itemsize
  )
  return per_token * tokens


def kv_bytes(config, plan: SlotPlan, pages: int) -> int:
  """Bytes of `pages` pages of the plan's pool."""
  return kv_token_bytes(config, plan.cache_dtype, pages * plan.page_size)
