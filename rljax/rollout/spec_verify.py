"""The verify program of speculative decoding: T positions per live row in
one forward over the page pool, the coupled acceptance rule in the loop.

  verify_step    the decoder on B rows x T tokens: row b feeds its last
                 token and T - 1 draft (or padding) tokens at positions
                 pos_b .. pos_b + T - 1; each layer writes their keys and
                 values into the row's own slots length_b - 1 ..
                 length_b + T - 2 and attends causally over the prompt's
                 pages and its own (`paged_attention` with T queries), so
                 position j sees exactly the prefix plain decoding would
                 feed it if the drafts before it are right;
  verify_chunk   up to `step_limit` verify steps of a bucket of B rows:
                 each draws s_0 .. s_{T-1} with the row's keys
                 (`spec_accept.sample_positions`), emits what the coupled
                 rule accepts (`spec_accept`), and advances each row by that
                 many tokens only: a rejected position's KV lies at or past
                 the new length and the next step overwrites it.

Drafts come from the host as a continuation buffer per row (`drafts`
[B, D], `draft_len` valid): its token i guesses the row's response token
L0 + i (L0: its length when the chunk starts). A step feeds a row the next
min(k_b, D - used) buffer tokens while every token the row emitted in this
chunk equalled the buffer ("on track"); once one differs, the row decodes
one token a step for the rest of the chunk. The chunk leaves when on-track
rows fall to `exit_on_track` (the host drafts again), or live rows to
`exit_live`, or after `step_limit` steps.

Shapes (`verify_shapes`): B a row bucket and T a power of two with
B·T <= S by default, so that a verify step runs its matmuls at the row
counts plain decoding runs and costs at most a full decode step. A larger
budget lets a full batch verify too, at row counts plain decoding never
runs. The program as a whole is still not the decode step; its rows keep
their bits because the model's kernels are row-count invariant at those
counts (docs/speculative.md, "Floats").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rljax.models import layers as layers_lib
from rljax.rollout import paged_attention as attention_lib
from rljax.rollout import slot_program
from rljax.rollout import spec_accept


# Most positions a row: the drafts' value falls off geometrically with
# their depth, a position's cost does not.
MAX_WIDTH = 8


def verify_shapes(slots: int, budget: int = 1) -> tuple[tuple[int, int], ...]:
  """(B, T) of the verify programs of a plan with `slots` rows: every row
  bucket B with T = 2, 4, ..., MAX_WIDTH while B·T <= budget·S (budget 1:
  a verify step holds at most a full plain step's tokens, and none runs
  when every slot is live)."""
  out = []
  for b in slot_program.row_buckets(slots):
    t = 2
    while b * t <= budget * slots and t <= MAX_WIDTH:
      out.append((b, t))
      t *= 2
  return tuple(out)


def verify_step(
  config,
  params,
  pool,
  tokens,
  positions,
  length,
  live,
  table,
  prefix: attention_lib.Prefix,
  entry,
  *,
  activation_dtype=None,
  rope_table,
  attention: str = "xla",
):
  """The decoder on T tokens of each of B rows over the page pool
  (`slot_program.paged_decoder`).

  Args:
    config: the architecture.
    params: params with `unstack_layers`'d layers.
    pool: the page pool.
    tokens, positions: int32 [B, T] (positions clipped to the RoPE table).
    length: int32 [B] tokens each row sampled; its token t is written to
      own slot length - 1 + t and sees own slots < length + t.
    live: bool [B]; a done row writes nowhere and reads nothing.
    table: int32 [B, W] own pages; prefix, entry: as `decode_step`.
    activation_dtype, rope_table, attention: as `slot_program.decode_step`.

  Returns:
    (logits f32 [B, T, V], the pool with the new keys and values).
  """
  t = tokens.shape[1]
  positions = jnp.minimum(positions, rope_table[0].shape[0] - 1)
  cos, sin = (jnp.take(c, positions, axis=0) for c in rope_table)
  return slot_program.paged_decoder(
    config, params, pool, tokens, cos, sin, table, length - 1,
    jnp.where(live, t, 0).astype(jnp.int32),
    jnp.where(live, length + t - 1, 0), prefix, jnp.where(live, entry, -1),
    activation_dtype=activation_dtype, attention=attention,
  )  # fmt: skip


@functools.partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=(4,))
def verify_chunk(
  config,
  plan: slot_program.SlotPlan,
  width: int,
  params,
  pool,
  rows,
  table,
  prefix,
  drafts,
  draft_len,
  max_drafts,
  temperature,
  top_p,
  stop_ids,
  step_limit,
  exit_live,
  exit_on_track,
):
  """Verify steps of a bucket of B rows, T = `width` positions each.

  Args:
    config, plan: static; width: T >= 2, static.
    params: the rollout weights with `unstack_layers`'d layers.
    pool: the page pool (donated); every live row holds the pages of its
      next `step_limit`·T tokens (or up to its limit).
    rows: the bucket's row state as `slot_program.decode_chunk`'s.
    table: int32 [B, W]; prefix: `paged_attention.Prefix`.
    drafts: int32 [B, D] each row's continuation guess; draft_len: int32
      [B] its valid tokens (0: no draft); max_drafts: int32 [B] drafts fed
      a step (<= T - 1).
    temperature, top_p, stop_ids: the traced sampling arguments.
    step_limit: int32 <= plan.chunk_steps; exit_live, exit_on_track:
      int32, leave when live rows or live on-track rows fall to them.

  Returns:
    (pool, rows with new "tok", "pos", "length", "done", tokens int32
    [B, chunk_steps·T] and log-probs f32 [B, chunk_steps·T] emitted (a
    row's first length-growth of them valid), steps run, live row-steps,
    {"drafted", "accepted", "rejected"} int32 [B]: drafts fed, drafts
    emitted, and drafts tested and refused (one at most a step)).
  """
  s, t = rows["tok"].shape[0], width
  cap = plan.chunk_steps * t
  d = drafts.shape[1]
  sample = slot_program._sampler(plan, temperature, top_p)  # pylint: disable=protected-access
  rope_table = layers_lib.rope_table(config, plan.rope_len)
  length0 = rows["length"]
  row_ids = jnp.arange(s)[:, None]
  steps_t = jnp.arange(t, dtype=jnp.int32)[None]

  def cond(carry):
    step, _, st, *_ = carry
    live = ~st["done"]
    on_track = jnp.sum(live & st["on_track"])
    return (
      (step < step_limit)
      & (jnp.sum(live) > jnp.maximum(exit_live, 0))
      & (on_track > exit_on_track)
    )

  def body(carry):
    step, pool, st, out_tok, out_logp, live_steps, counts = carry
    drafted, accepted, rejected = counts
    live = ~st["done"]
    used = st["length"] - length0
    room_draft = jnp.clip(draft_len - used, 0, t - 1)
    k = jnp.where(live & st["on_track"], jnp.minimum(max_drafts, room_draft), 0)
    index = jnp.clip(used[:, None] + steps_t[:, :-1], 0, d - 1)
    fed = jnp.take_along_axis(drafts, index, axis=1)
    fed = jnp.where(steps_t[:, :-1] < k[:, None], fed, plan.pad_id)
    tokens = jnp.concatenate([st["tok"][:, None], fed], axis=1)
    logits, pool = verify_step(
      config,
      params,
      pool,
      tokens,
      st["pos"][:, None] + steps_t,
      st["length"],
      live,
      table,
      prefix,
      rows["entry"],
      activation_dtype=plan.activation_dtype,
      rope_table=rope_table,
      attention=plan.attention,
    )
    tok, logp = spec_accept.sample_positions(
      sample, logits, rows["keys"], st["length"]
    )
    m = spec_accept.accepted_drafts(tok, fed, k)
    room = jnp.maximum(rows["limit"] - st["length"], 0)
    e = jnp.where(live, spec_accept.emitted_count(tok, m, stop_ids, room), 0)
    # Emitted tokens into the chunk's output at the row's cursor.
    emit = steps_t < e[:, None]
    at = jnp.where(emit, used[:, None] + steps_t, cap)
    out_tok = out_tok.at[row_ids, at].set(tok, mode="drop")
    out_logp = out_logp.at[row_ids, at].set(logp, mode="drop")
    last = jnp.take_along_axis(tok, jnp.maximum(e - 1, 0)[:, None], axis=1)
    stopped = jnp.any(emit & jnp.isin(tok, stop_ids), axis=1)
    length = st["length"] + e
    # On track: every emitted token equalled the buffer (the drafts did by
    # acceptance; the bonus token must equal the next buffer token).
    nxt = jnp.take_along_axis(
      drafts, jnp.clip(used + m, 0, d - 1)[:, None], axis=1
    )[:, 0]
    bonus = jnp.take_along_axis(tok, m[:, None], axis=1)[:, 0]
    keep = (e == m + 1) & (used + m < draft_len) & (bonus == nxt)
    st = {
      "tok": jnp.where(e > 0, last[:, 0], st["tok"]),
      "pos": st["pos"] + e,
      "length": length,
      "done": st["done"] | (live & (stopped | (length >= rows["limit"]))),
      "on_track": st["on_track"] & keep,
    }
    emitted_drafts = jnp.minimum(m, jnp.maximum(e - 1, 0))
    # A draft token tested and refused (the rest of the draft is untested).
    refused = (m < k) & (e == m + 1)
    counts = (
      drafted + k,
      accepted + emitted_drafts,
      rejected + refused.astype(jnp.int32),
    )
    return (
      step + 1,
      pool,
      st,
      out_tok,
      out_logp,
      live_steps + jnp.sum(live),
      counts,
    )

  state = {name: rows[name] for name in ("tok", "pos", "length", "done")}
  state["on_track"] = draft_len > 0
  zeros = jnp.zeros((s,), jnp.int32)
  carry = (
    jnp.int32(0),
    pool,
    state,
    jnp.full((s, cap), plan.pad_id, jnp.int32),
    jnp.zeros((s, cap), jnp.float32),
    jnp.int32(0),
    (zeros, zeros, zeros),
  )
  steps, pool, state, out_tok, out_logp, live_steps, counts = (
    jax.lax.while_loop(cond, body, carry)
  )
  state = {name: state[name] for name in ("tok", "pos", "length", "done")}
  spec = dict(zip(("drafted", "accepted", "rejected"), counts))
  return pool, state, out_tok, out_logp, steps, live_steps, spec
