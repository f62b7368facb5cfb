"""The static-batch rollout program: one chunk of prompts, prefill + decode
to the longest row, in one jitted call.

  1. prefill: the chunk's prompts, LEFT-padded to a bucketed length Lp so that
     every row's last prompt token sits in column Lp - 1, go through
     `models.forward_with_cache` once per prompt (not once per sample);
  2. the last logits are repeated n times (one row per sample); the prompt's
     KV cache is not: its n samples attend to one shared prefix cache
     (`decoder.decode_with_prefix_cache`) plus their own generated slots;
  3. decode: a `jax.lax.while_loop` samples one token per row and step and
     feeds it back, until every row has hit a stop token or max_new_tokens.

A finished row keeps its slot until the chunk's last row ends; the
continuous-batching programs (`slot_program`) free it. This one stays the
engine's path on a mesh and the reference the continuous engine is tested
against (greedy tokens and log-probs equal).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from rljax import models
from rljax.models import decoder as decoder_lib
from rljax.models import fusion as fusion_lib
from rljax.models import layers as layers_lib
from rljax.models import sharding as sharding_lib
from rljax.rollout.token_sampling import sample_next_token


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Static shapes and switches of one compiled rollout program.

  Temperature, top-p mass, stop ids and max_new_tokens are traced arguments,
  so changing them does not recompile; `new_token_capacity` (a bucket
  >= max_new_tokens) sizes the cache and the output buffers.
  """

  num_prompts: int
  prompt_len: int
  n: int
  new_token_capacity: int
  greedy: bool
  top_k: int
  use_top_p: bool
  num_stop_ids: int
  pad_id: int
  cache_dtype: Any
  activation_dtype: Any = None  # None: the embedding's dtype
  mesh: Any = None  # a Mesh: the KV caches are constrained to its layout
  fuse_projections: bool = False  # run `fusion.fuse_projections(params)`


@functools.partial(jax.jit, static_argnums=(0, 1))
def _generate_chunk(
  config,
  plan: _Plan,
  params,
  prompt_tokens,
  prompt_mask,
  keys,
  temperature,
  top_p,
  stop_ids,
  max_new_tokens,
  row_limits,
):
  """Prefill + decode for one chunk of prompts.

  Args:
    config: decoder config (static).
    plan: `_Plan` (static).
    params: the rollout weights.
    prompt_tokens, prompt_mask: int32 [P, Lp], left-padded.
    keys: [P * n] per-row PRNG keys.
    temperature, top_p: f32 scalars.
    stop_ids: int32 [num_stop_ids] (a -1 placeholder when there are none).
    max_new_tokens: int32 scalar <= plan.new_token_capacity.
    row_limits: int32 [P * n] each row's most tokens (<= max_new_tokens).

  Returns:
    tokens int32 [P*n, capacity] (pad after the end), logp f32 [P*n, capacity]
    (0 after the end), lengths int32 [P*n], and the number of decode steps.
  """
  num_prompts, prompt_len, n = plan.num_prompts, plan.prompt_len, plan.n
  capacity = plan.new_token_capacity
  if plan.fuse_projections:
    # Once per chunk, outside the decode loop: a copy of the projection
    # kernels (~0.3 ms of an H100's bandwidth for Qwen2.5-0.5B in bf16;
    # those kernels, about half its weights, are held twice while the chunk
    # runs) buys two matmuls per layer and step instead of five.
    params = fusion_lib.fuse_projections(params)
  rows = num_prompts * n
  sample = functools.partial(
    sample_next_token,
    temperature=temperature,
    top_k=plan.top_k,
    top_p=top_p if plan.use_top_p else 1.0,
    greedy=plan.greedy,
  )

  segments = decode_segments(capacity)

  # The prompt's keys/values stay in one [P, Lp] prefix cache shared by its n
  # samples (`decoder.decode_with_prefix_cache`); only the generated tokens
  # get per-row slots, so decode attention never reads n copies of a prompt.
  def laid_out(cache, shardings=sharding_lib.cache_shardings):
    if plan.mesh is None:
      return cache
    return jax.lax.with_sharding_constraint(cache, shardings(plan.mesh, cache))

  own_laid_out = functools.partial(
    laid_out, shardings=sharding_lib.decode_cache_shardings
  )
  prefix = laid_out(
    models.init_cache(config, num_prompts, prompt_len, plan.cache_dtype)
  )
  # Position 0 at each row's first real token, as `models.forward` numbers it.
  positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
  logits, prefix = models.forward_with_cache(
    config,
    params,
    prompt_tokens,
    positions,
    prefix,
    0,
    prompt_mask,
    activation_dtype=plan.activation_dtype,
    # Left padding puts every prompt's last token in the last column, the
    # only one sampled from: the LM head runs on it alone.
    last_only=True,
  )
  last_logits = logits[:, -1]
  # What the decode loop reads but never changes is made once here, in the
  # form it reads: per-layer weights and prompt keys (a slice of a stacked
  # [L, ...] array inside the loop is copied at every step), the prompt keys
  # in their matmuls' layouts, and the RoPE table (`decode_with_prefix_cache`).
  prefix = decoder_lib.to_prefix_cache(prefix)
  rope_table = layers_lib.rope_table(config, prompt_len + capacity)
  decode_params = {
    **params,
    "layers": decoder_lib.unstack_layers(params["layers"]),
  }

  # Sample j of prompt i is row i*n + j.
  cache = own_laid_out(
    models.init_decode_cache(config, rows, segments[0], plan.cache_dtype)
  )
  kv_mask = jnp.zeros((rows, segments[0]), prompt_mask.dtype)
  last_logits = jnp.repeat(last_logits, n, axis=0)
  next_pos = jnp.repeat(positions[:, -1] + 1, n, axis=0)
  live_prompt = jnp.repeat(prompt_mask[:, -1] > 0, n, axis=0)

  def step_keys(step):
    return jax.vmap(lambda k: jax.random.fold_in(k, step))(keys)

  tok, logp = sample(last_logits, step_keys(0))
  out_tokens = jnp.full((rows, capacity), plan.pad_id, jnp.int32)
  out_logp = jnp.zeros((rows, capacity), jnp.float32)
  out_tokens = out_tokens.at[:, 0].set(tok)
  out_logp = out_logp.at[:, 0].set(logp)
  lengths = jnp.ones((rows,), jnp.int32)
  # Padding rows of a partial chunk (no real prompt) start finished.
  done = jnp.isin(tok, stop_ids) | ~live_prompt | (row_limits <= 1)

  def body(state):
    step, cache, prev_tok, pos, done, kv_mask, out_tokens, out_logp, lengths = (
      state
    )
    write_index = step - 1  # the slot of prev_tok, sampled at step - 1
    kv_mask = jax.lax.dynamic_update_slice(
      kv_mask, jnp.ones((rows, 1), kv_mask.dtype), (0, write_index)
    )
    logits, cache = decoder_lib.decode_with_prefix_cache(
      config,
      decode_params,
      prev_tok[:, None],
      pos[:, None],
      prefix,
      prompt_mask,
      cache,
      write_index,
      kv_mask,
      activation_dtype=plan.activation_dtype,
      rope_table=rope_table,
    )
    tok, logp = sample(logits[:, 0], step_keys(step))
    tok = jnp.where(done, plan.pad_id, tok)
    logp = jnp.where(done, 0.0, logp)
    out_tokens = jax.lax.dynamic_update_slice(
      out_tokens, tok[:, None], (0, step)
    )
    out_logp = jax.lax.dynamic_update_slice(out_logp, logp[:, None], (0, step))
    lengths = lengths + (~done).astype(jnp.int32)
    done = done | jnp.isin(tok, stop_ids) | (lengths >= row_limits)
    return (
      step + 1,
      cache,
      tok,
      pos + 1,
      done,
      kv_mask,
      out_tokens,
      out_logp,
      lengths,
    )

  state = (
    jnp.int32(1),
    cache,
    tok,
    next_pos,
    done,
    kv_mask,
    out_tokens,
    out_logp,
    lengths,
  )
  # Decode in segments over a growing cache: attention reads every cache slot
  # at every step, so early steps run on a short cache (see decode_segments).
  for i, segment_end in enumerate(segments):
    if i > 0:
      grow = segment_end - segments[i - 1]
      step, cache, prev_tok, pos, done, kv_mask, *outputs = state
      # The slot axis: last of K [B, Hkv, hd, S], 2 of V [B, Hkv, S, hd].
      pad = [(0, 0)] * 4
      cache = own_laid_out(
        {
          "k": tuple(jnp.pad(c, pad[:3] + [(0, grow)]) for c in cache["k"]),
          "v": tuple(
            jnp.pad(c, pad[:2] + [(0, grow), (0, 0)]) for c in cache["v"]
          ),
        }
      )
      kv_mask = jnp.pad(kv_mask, ((0, 0), (0, grow)))
      state = (step, cache, prev_tok, pos, done, kv_mask, *outputs)
    limit = jnp.minimum(max_new_tokens, segment_end)

    def cond(state, limit=limit):
      step, _, _, _, done, *_ = state
      return (step < limit) & ~jnp.all(done)

    state = jax.lax.while_loop(cond, body, state)
  steps, out_tokens, out_logp, lengths = state[0], state[6], state[7], state[8]
  return out_tokens, out_logp, lengths, steps


def decode_segments(capacity: int) -> tuple[int, ...]:
  """New-token counts at which the decode cache grows: 64, 128, 256, ...

  A decode step's attention reads all S cache slots, which on CPU costs about
  as much as the matmuls at batch 128 and S ~ 200. Growing the cache in
  doubling segments makes the average S over a 256-token rollout ~176 + Lp
  instead of 256 + Lp, for one extra while-loop compile per segment.
  """
  ends = []
  end = 64
  while end < capacity:
    ends.append(end)
    end *= 2
  ends.append(capacity)
  return tuple(ends)


def new_token_capacity(max_new_tokens: int) -> int:
  """Decode buffer size for max_new_tokens: 16, 32, 64, then multiples of 64.

  max_new_tokens itself is a traced loop bound; only this bucket is static.
  """
  for size in (16, 32, 64):
    if max_new_tokens <= size:
      return size
  return -(-max_new_tokens // 64) * 64
