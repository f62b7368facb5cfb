"""The observation append of a kept episode: a multi-token prefill of just
the ids a tool answered, written onto the row's own pages, then the row's
next token.

A multi-turn row of the continuous engine (`slot_episodes`) that stops at
a tool call keeps its pages: prompt slots in its prompt's entry (shared by
its siblings), its own tokens at own slots 0 .. length - 2, its last
sampled token not yet fed. When the observation o_1 .. o_m arrives, one
pass of the decoder over [last token, o_1, ..., o_m] at positions
pos .. pos + m writes their keys and values into own slots
length - 1 .. length + m - 1 and attends causally over the prompt's pages
and the row's own (`spec_verify.verify_step`: the speculative verify pass
with every position forced instead of drafted); the logits of o_m give the
row's next token, drawn with `fold_in(key, length + m)` as any decode step
would draw own token length + m. The history is never prefilled again:
the cost of a turn boundary is the observation's tokens, not the row's.

Shapes: B a row bucket of the plan (`slot_program.row_buckets`) and T a
power of two >= 8 holding the longest observation plus one; a shorter row
pads with `pad_id` tokens whose keys land in own slots past its new
length (the row's next decode steps overwrite them before anything reads
them) or are dropped (no page). One compile per (B, T).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rljax.models import layers as layers_lib
from rljax.rollout import slot_program
from rljax.rollout import spec_verify

# Fewest positions of an append program: every observation shorter than
# this shares one compile.
MIN_WIDTH = 8


def width_for(tokens: int) -> int:
  """T of an append of `tokens` positions (the last sampled token and the
  observation): a power of two, at least `MIN_WIDTH`."""
  width = MIN_WIDTH
  while width < tokens:
    width *= 2
  return width


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def append_chunk(
  config,
  plan: slot_program.SlotPlan,
  params,
  pool,
  rows,
  table,
  prefix,
  tokens,
  count,
  temperature,
  top_p,
):
  """Writes B rows' forced tokens and samples each row's next token.

  Args:
    config, plan: static.
    params: the rollout weights with `unstack_layers`'d layers.
    pool: the page pool (donated); each row holds the pages of own slots
      length - 1 .. length + count - 2.
    rows: "pos" (position of the row's last sampled token), "length" (its
      own tokens so far, >= 1), "keys" (raw PRNG key data), "entry"
      (prefix entry), "live" (bool; a padding row writes nowhere), each
      [B].
    table: int32 [B, W] the rows' own pages; prefix: the entries' pages.
    tokens: int32 [B, T]: the row's last sampled token, then its
      observation ids, then padding.
    count: int32 [B] valid tokens of each row (observation ids + 1, >= 1).
    temperature, top_p: the traced sampling scalars.

  Returns:
    (pool, next token int32 [B], its log-prob f32 [B]) drawn from the
    logits at each row's last valid position.
  """
  b, t = tokens.shape
  rope_table = layers_lib.rope_table(config, plan.rope_len)
  logits, pool = spec_verify.verify_step(
    config,
    params,
    pool,
    tokens,
    rows["pos"][:, None] + jnp.arange(t, dtype=jnp.int32)[None],
    rows["length"],
    rows["live"],
    table,
    prefix,
    rows["entry"],
    activation_dtype=plan.activation_dtype,
    rope_table=rope_table,
    attention=plan.attention,
  )
  last = jnp.take_along_axis(
    logits, jnp.clip(count - 1, 0, t - 1)[:, None, None], axis=1
  )[:, 0]
  sample = slot_program._sampler(plan, temperature, top_p)  # pylint: disable=protected-access
  # Own token length + count - 1: the index a decode step would fold in.
  tok, logp = sample(
    last,
    slot_program._fold(rows["keys"], rows["length"] + count - 1),  # pylint: disable=protected-access
  )
  del b
  return pool, tok, logp
