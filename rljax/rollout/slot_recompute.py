"""The in-flight KV recompute of continuous batching (AReaL's re-prefill):
`recompute_kv` rewrites the KV of the rows in flight and of their prompts
with new weights, for an in-flight weight update in "recompute" mode
(`inflight`), and the own KV of rows a cut handed back when they rejoin a
run (`slot_resume`); `swap_rows` and `recompute_rows` are its host side on
a run's `slot_rows.Book`. The pool and the other slot programs are
`slot_program`'s.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rljax import models
from rljax.models import decoder as decoder_lib
from rljax.rollout import kv_pages
from rljax.rollout.slot_program import SlotPlan


def capacities(new_tokens: int, page_size: int) -> tuple[int, ...]:
  """Own-slot widths a recompute is compiled for: 64, 128, ... (whole
  pages), up to the plan's new-token capacity in whole pages."""
  most = kv_pages.pages_for(new_tokens, page_size) * page_size
  sizes, size = [], max(64, page_size)
  while size < most:
    sizes.append(size)
    size *= 2
  return tuple(sizes) + (most,)


def row_counts(slots: int, entries: int) -> tuple[int, ...]:
  """Row counts a recompute is compiled for: a quarter, half and all of
  the most it may rewrite (every slot row and a stand-in row per entry),
  rounded up; a recompute of fewer rows pads to the next."""
  most = slots + entries
  return tuple(sorted({-(-most // 4), -(-most // 2), most}))


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def recompute_kv(
  config,
  plan: SlotPlan,
  params,
  pool,
  prompt_tokens,
  prompt_mask,
  prompt_pages,
  response,
  fed,
  own_pages,
):
  """R rows' KV recomputed with `params` (AReaL's re-prefill).

  One teacher-forced pass of `forward_with_cache` over each row's whole
  sequence, [its prompt (Lp, left-padded) | its first `fed` sampled
  tokens]: the prompt's keys and values go to the prompt's entry pages
  (`prompt_pages`; N where another row of the entry writes them, or
  where the row is only there for its prompt), the tokens' to the row's
  own pages. Only the tokens a row has fed (t < length - 1) are attended
  to and rewritten; its last sampled token is fed by the next decode step,
  as before the update. The sampled tokens, their log-probs and the row
  state are untouched: the old weights sampled them.

  Cost: one prefill of R·(Lp + C) tokens (a prompt once per row of its
  entry that is in flight), attention over (Lp + C)² per row. Chosen over
  replaying C decode steps (C sequential steps, each as slow as a sampling
  step) because one batched pass keeps the matmuls large and writes what a
  fresh prefill of prompt + tokens would. One compile per (R, C).

  Args:
    config, plan: static.
    params: the new rollout weights (stacked layers, as `prefill`).
    pool: the page pool (donated).
    prompt_tokens, prompt_mask: int32 [R, Lp] each row's prompt.
    prompt_pages: int32 [R, Wp] where its prompt's blocks go (N: nowhere).
    response: int32 [R, C] each row's sampled tokens, slot t = token t.
    fed: int32 [R] tokens of `response` the row has fed (its length - 1).
    own_pages: int32 [R, C / P] the row's own pages (N: a hole).

  Returns:
    the pool with the rewritten pages.
  """
  r, c = response.shape
  lp = plan.prompt_len
  fed_mask = jnp.arange(c, dtype=jnp.int32)[None] < fed[:, None]
  mask = jnp.concatenate([prompt_mask, fed_mask.astype(jnp.int32)], axis=1)
  tokens = jnp.concatenate([prompt_tokens, response], axis=1)
  cache = models.init_cache(config, r, lp + c, plan.cache_dtype)
  _, cache = models.forward_with_cache(
    config,
    params,
    tokens,
    decoder_lib.positions_from_mask(mask),
    cache,
    0,
    mask,
    activation_dtype=plan.activation_dtype,
    last_only=True,
  )
  # Own slots past `fed` hold the pass's keys of padding: they are written
  # by the rows' next decode steps before anything reads them.
  out_k, out_v = [], []
  for i in range(config.num_layers):
    k, v = cache["k"][i], cache["v"][i]
    pk, pv = kv_pages.write_blocks(
      pool["k"][i], pool["v"][i], k[:, :lp], v[:, :lp], prompt_pages
    )
    pk, pv = kv_pages.write_blocks(pk, pv, k[:, lp:], v[:, lp:], own_pages)
    out_k.append(pk)
    out_v.append(pv)
  return {"k": tuple(out_k), "v": tuple(out_v)}


def swap_rows(book) -> list[tuple[int, bool, int]]:
  """What a swap under "recompute" rewrites: each active row (the first
  of its entry also writes the prompt's pages) and a stand-in row for each
  prompt that holds an entry but has no active row (its prompt only), as
  (row, writes its prompt, tokens fed) for `recompute_rows`."""
  writers, rows = set(), []
  for r in book.active:
    e = book.prompts[book.rows[r].prompt].entry
    rows.append((r, e not in writers, max(0, book.rows[r].length - 1)))
    writers.add(e)
  for p, prompt in enumerate(book.prompts):
    if prompt.entry is not None and prompt.entry not in writers:
      writers.add(prompt.entry)
      rows.append((p * book.plan.n, True, 0))
  return rows


def recompute_rows(config, plan, params, pool, book, rows, note_program):
  """`recompute_kv` of `rows` ((row, writes its prompt, tokens fed) each,
  the row's own pages held for them) with `params`, padded to the
  compiled row count and width; the pool unchanged when there are none."""
  if not rows:
    return pool
  lp, page = plan.prompt_len, plan.page_size
  most_fed = max(fed for *_, fed in rows)
  width = next(w for w in capacities(plan.new_tokens, page) if w >= most_fed)
  count = next(
    c for c in row_counts(plan.slots, plan.entries) if c >= len(rows)
  )
  toks = np.full((count, lp), plan.pad_id, np.int32)
  mask = np.zeros((count, lp), np.int32)
  ppages = np.full((count, plan.prompt_pages), plan.pool_pages, np.int32)
  response = np.full((count, width), plan.pad_id, np.int32)
  own = np.full((count, width // page), plan.pool_pages, np.int32)
  fed = np.zeros((count,), np.int32)
  for i, (r, writes, k) in enumerate(rows):
    prompt = book.prompts[book.rows[r].prompt]
    toks[i, lp - len(prompt.ids) :] = prompt.ids
    mask[i, lp - len(prompt.ids) :] = 1
    if writes:
      ppages[i] = book.ptable[prompt.entry]
    if k:
      ids = np.concatenate(book.rows[r].tokens).astype(np.int32)[:k]
      response[i, : ids.size] = ids
      own[i] = book.pages.table([("row", r)], width // page)[0]
      fed[i] = k
  note_program(("recompute", plan, count, width))
  return recompute_kv(
    config, plan, params, pool, toks, mask, ppages, response, fed, own
  )
