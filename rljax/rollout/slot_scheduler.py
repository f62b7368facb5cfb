"""The host side of continuous batching: which rows decode together, when
prompts are prefilled, and what each row sampled.

  queue of rows (longest expected first) ──► free slots? ──► prefill the
        ▲                                      prompts of the next rows
        │                                      (`slot_program.prefill`:
        │                                      all n first tokens at once)
        │                                               │
  rows' tokens ◄── decode_chunk over the live rows ◄────┘
  appended         in the smallest row bucket holding them (1, 2, 4, ...,
        │          S); it leaves early when its live rows fall to the next
        │          bucket or enough slots are free for a refill
        ▼
  swap point (only with a `weight_updates` hook, while work is left):
  hook() ──► None: go on ──► (params, version): new weights for every later
  prefill and chunk; inflight_kv="recompute" first rewrites the live rows'
  KV with them (`slot_recompute.recompute_kv`), "keep" leaves it (`inflight`)
  A streamed run's feed may ask for a cut there first: the run ends and
  hands its unfinished prompts back with their rows (`slot_resume`).

The decode batch is the live rows only: a row that ends leaves it at the
chunk's end, and the next chunk runs in a smaller bucket when the rows fit
one; its pages stay where they are (the block table's rows are what is
compacted). A step then costs the weights once plus the live rows' matmuls
and each row's own attention, not the slots' (docs/performance.md).

It loops until the queue is empty and every row is done, then returns each
row's tokens and behaviour log-probs in the engine's order (sample j of
prompt i is row i·n + j) with the run's figures, and with a hook each
token's policy version and the swap figures.

The plan, the prefill sizes and `warm` are `slot_plan`'s; the programs
`slot_program`'s; the row and page book `slot_rows`'.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rljax.rollout import inflight
from rljax.rollout import prompt_feed
from rljax.rollout import slot_plan
from rljax.rollout import slot_program
from rljax.rollout import slot_recompute
from rljax.rollout import slot_resume
from rljax.rollout import slot_rows
from rljax.rollout.base import SamplingConfig


@dataclasses.dataclass
class SlotRun:
  """What `run` returns: per-row tokens and log-probs, in engine order, and
  the run's figures (`stats`: decode_steps, slot_steps (rows of the
  buckets run x steps), live_row_steps, occupancy, chunks, prefills,
  bucket_steps {rows: steps}, kv_bytes_peak (the pool), kv_bytes_held_peak
  (the pages in use at their most), kv_bytes_written_peak (prompts and
  fed tokens at their most: any layout's floor), capacity_peak (longest
  row), timeline (seconds, live share of the bucket) and kv_timeline
  (seconds, KV bytes held, reserved) per chunk, page_size, admitted (rows
  in the order they joined the decode batch); with `swaps`
  also `inflight.Swaps.stats`); `versions`: with `swaps`, each token's
  policy version, else None."""

  tokens: list[list[int]]
  logp: list[np.ndarray]
  stats: dict[str, Any]
  versions: list[np.ndarray] | None = None


def run(
  config: Any,
  params: tuple[Any, Any],
  plan: slot_program.SlotPlan,
  prompts: list[list[int]],
  prompt_index: list[int],
  sampling: SamplingConfig,
  *,
  note_program: Callable[[Any], None] = lambda sig: None,
  row_limits: np.ndarray | None = None,
  priorities: np.ndarray | None = None,
  swaps: inflight.Swaps | None = None,
  feed: prompt_feed.PromptFeed | None = None,
  max_steps: int | None = None,
  spec: Any = None,
) -> SlotRun:
  """Samples sampling.n responses of every prompt through `plan.slots` rows.

  Args:
    config: the rollout decoder config.
    params: `slot_plan.prepare_params` of the rollout weights.
    plan: the request's `SlotPlan` (`slot_plan.make_plan`).
    prompts: token ids, each at most plan.prompt_len long.
    prompt_index: each prompt's index for its PRNG keys (`sample_keys`).
    sampling: the request's `SamplingConfig`.
    note_program: called with each program signature run (compile count).
    row_limits: int [P·n] each sample's most tokens (<= max_new_tokens;
      vLLM's per-request max_tokens); None: max_new_tokens for all.
    priorities: float [P·n] each sample's expected length: rows are
      admitted longest first (ties in request order); None: request order.
      Samples do not depend on it (a row's keys are its own).
    swaps: in-flight weight updates (`inflight.Swaps`), polled after each
      decode chunk while work is left, and before a prefill in a streamed
      run; None: the weights never change.
    feed: a streamed run (`prompt_feed`): `prompts` are its first ones;
      more are polled between chunks (with their own seeds and indices),
      each prompt's rows go to `feed.done` as soon as they all end, and the
      run returns once the feed has nothing more and every row is done
      (its `tokens`/`logp` are then empty). `row_limits` and `priorities`
      apply to the first prompts; later ones get max_new_tokens and an
      `expected_len` attribute of the streamed prompt when it has one.
      A feed with `cut`/`handback` may end the run at a swap point, its
      unfinished prompts handed back with their rows so far; a prompt with
      `partial` rows continues them (`slot_resume`).
    max_steps: cap max_new_tokens (warm-up runs).
    spec: a `spec_control.Speculator`: each chunk verifies the live rows'
      drafts where that pays (samples unchanged, `spec_accept`); None:
      plain decoding.
  """
  prefill_params, decode_params = params
  n = plan.n
  max_new = sampling.max_new_tokens
  if max_steps is not None:
    max_new = min(max_new, max_steps)
  temperature, top_p, stop_ids = slot_plan.traced_args(sampling)
  stop_set = set(sampling.stop_token_ids or ())
  if row_limits is None:
    row_limits = np.full((len(prompts) * n,), max_new, np.int64)
  row_limits = np.minimum(np.asarray(row_limits, np.int64), max_new)
  if priorities is None:
    priorities = np.zeros((len(prompts) * n,), np.float64)
  book = slot_rows.Book(plan)
  for p, ids in enumerate(prompts):
    rows = slice(p * n, p * n + n)
    book.add_prompt(
      ids,
      prompt_index[p],
      sampling.seed,
      None,
      row_limits[rows],
      priorities[rows],
    )
  most_prefill = slot_plan.prefill_sizes(plan.slots)[-1]
  refill_at = max(1, plan.slots // 4)
  note_program(("init", plan))
  pool = slot_program.init_pool(config, plan)
  stats = collections.Counter()
  bucket_steps = collections.Counter()
  timeline, kv_timeline = [], []
  written_peak = capacity_peak = 0
  prefix_tokens = 0
  admitted: list[int] = []  # rows in the order they joined the batch
  # Rows continued from an earlier run, prefilled but without their own KV
  # (written when they join the batch).
  unwritten: set[int] = set()
  cut = False  # a streamed run's cut (`prompt_feed`)
  start = time.perf_counter()

  def version() -> int:
    return swaps.version if swaps is not None else 0

  def row_done(r: int) -> None:
    """Row r ended; a streamed prompt whose rows all ended goes to the feed
    (and its rows are let go: a long run must not keep every response)."""
    nonlocal prefix_tokens
    p = book.rows[r].prompt
    if not book.end_row(r):
      return
    prefix_tokens -= len(book.prompts[p].ids)
    if spec is not None:
      spec.prompt_done(
        p,
        book.prompts[p].ids,
        [_cat(book.rows[q].tokens, np.int32) for q in range(p * n, p * n + n)],
      )
    if feed is None:
      return
    rows = [book.rows[q] for q in range(p * n, p * n + n)]
    feed.done(
      prompt_feed.DoneGroup(
        tag=book.prompts[p].tag,
        prompt_ids=book.prompts[p].ids,
        tokens=[_cat(row.tokens, np.int32).tolist() for row in rows],
        logp=[_cat(row.logps, np.float32) for row in rows],
        versions=None
        if swaps is None
        else [_cat(row.versions, np.int32) for row in rows],
      )
    )
    for row in rows:
      row.tokens, row.logps, row.versions = [], [], []

  def prefill(chosen: list[int]) -> None:
    """Prefills prompts `chosen` into new entries: first tokens of all
    their rows (a row whose first token ends it ends here)."""
    nonlocal pool, prefix_tokens
    f = next(
      s for s in slot_plan.prefill_sizes(most_prefill) if s >= len(chosen)
    )
    toks, mask, pages, seeds, index = book.prefill_inputs(chosen, f)
    prefix_tokens += sum(len(book.prompts[p].ids) for p in chosen)
    note_program(("prefill", plan, f))
    pool, tok, logp, key_data = slot_program.prefill(
      config,
      plan,
      prefill_params,
      pool,
      toks,
      mask,
      pages,
      seeds,
      index,
      temperature,
      top_p,
    )
    tok, logp, key_data = jax.device_get((tok, logp, key_data))
    stats["prefills"] += 1
    for i, p in enumerate(chosen):
      if feed is not None:
        feed.started(book.prompts[p].tag, version())
      for j in range(n):
        at, r = i * n + j, p * n + j
        row = book.rows[r]
        if row.ended:  # ended in an earlier run (`slot_resume`)
          continue
        row.key = np.asarray(key_data[at])
        if slot_resume.take_up(book, r):
          stats["continued_rows"] += 1
          unwritten.add(r)
          continue
        row.tok, row.pos, row.length = int(tok[at]), len(book.prompts[p].ids), 1
        row.tokens, row.logps = [tok[at : at + 1]], [logp[at : at + 1]]
        row.versions = [np.full((1,), version(), np.int32)]
        if int(tok[at]) in stop_set or row.limit <= 1:
          row_done(r)
    book.drop_ended_from_queue()

  def join(joined: list[int]) -> None:
    """Rows join the decode batch; continued ones get their own KV,
    recomputed from their tokens with the current weights."""
    nonlocal pool
    book.active.extend(joined)
    admitted.extend(joined)
    redo = [r for r in joined if r in unwritten]
    if not redo:
      return
    unwritten.difference_update(redo)
    for r in redo:
      book.pages.hold(("row", r), slot_resume.fed(book, r))
    pool = slot_recompute.recompute_rows(
      config, plan, prefill_params, pool, book,
      [(r, False, slot_resume.fed(book, r)) for r in redo], note_program,
    )  # fmt: skip

  def admit() -> bool:
    """Fills free slots: rows whose prompts are prefilled join at once;
    new prompts are prefilled when enough slots are free (or none run).
    True when it prefilled."""
    prefilled = False
    while book.free_slots and book.waiting():
      join(book.take_queued(book.free_slots))
      if not book.free_slots or not book.waiting():
        break
      if book.free_slots < refill_at and book.active:
        break
      chosen = book.to_prefill(book.free_slots, most_prefill)
      if not chosen:
        break
      prefill(chosen)
      prefilled = True
    return prefilled

  def take_new_weights() -> None:
    """The swap: new weights for every later prefill and chunk, if the hook
    has any; "recompute" first rewrites the in-flight KV with them. A cut
    the feed asks for comes first: the run ends here, before any newer
    weights are taken."""
    nonlocal prefill_params, decode_params, pool, cut
    if prompt_feed.cut_requested(feed):
      cut = True
      return
    new_params = swaps.poll()
    if new_params is None:
      return
    prefill_params, decode_params = new_params
    swaps.rows_in_flight.append(len(book.active))
    if spec is not None:
      spec.on_swap()
    if swaps.mode == "recompute":
      began = time.perf_counter()
      pool = slot_recompute.recompute_rows(
        config, plan, prefill_params, pool, book,
        slot_recompute.swap_rows(book), note_program,
      )  # fmt: skip
      jax.block_until_ready(pool)
      swaps.recompute_seconds += time.perf_counter() - began

  while True:
    if feed is not None:
      if feed.stopped():
        break
      for item in feed.poll(plan.prompt_len):
        expected = getattr(item, "expected_len", None)
        slot_resume.add_prompt(book, item, [max_new] * n, [expected or 0.0] * n)
    if book.waiting() and book.free_slots:
      if feed is not None and swaps is not None:
        # Streamed: a prompt joins with the newest weights, not those of
        # the last chunk boundary (its tokens' lag starts as small as can be).
        take_new_weights()
        if cut:
          break
      prefilled = admit()
      if feed is not None and feed.stopped():
        break
      if feed is not None and prefilled:
        # Streamed: the feed is polled again (and the swap point passed)
        # before the chunk, one poll per prefill or chunk, so prompts that
        # arrived meanwhile join the same chunk.
        continue
    if not book.active:
      if book.waiting():
        # Nothing decodes and rows wait: `admit` prefilled none of them,
        # which the entry count (one per slot) rules out.
        raise RuntimeError(
          f"slot_scheduler.run: {len(book.queue)} rows wait with no row "
          "decoding and no prompt prefilled"
        )
      break
    size = slot_program.bucket_for(len(book.active), plan.slots)
    # Leave for a refill: as soon as a row ends when a prefilled row waits,
    # else when a quarter of the slots are free (refill_at).
    exit_live = book.exit_live(size, refill_at)
    if spec is not None:
      pool, state, out_tok, out_logp, steps, live = spec.decode_chunk(
        config, decode_params, pool, book, size,
        (temperature, top_p, stop_ids), exit_live, note_program,
      )  # fmt: skip
    else:
      book.reserve(plan.chunk_steps)
      rows, table = book.bucket_inputs(size)
      note_program(("decode", plan, size))
      pool, state, out_tok, out_logp, steps, live = slot_program.decode_chunk(
        config,
        plan,
        decode_params,
        pool,
        rows,
        table,
        book.prefix(),
        temperature,
        top_p,
        stop_ids,
        jnp.int32(plan.chunk_steps),
        jnp.int32(exit_live),
      )
      state, out_tok, out_logp, steps, live = jax.device_get(
        (state, out_tok, out_logp, steps, live)
      )
    written_peak = max(written_peak, prefix_tokens + book.held_tokens())
    still = []
    for i, r in enumerate(book.active):
      row = book.rows[r]
      grew = int(state["length"][i]) - row.length
      if grew > 0:
        row.tokens.append(out_tok[i, :grew])
        row.logps.append(out_logp[i, :grew])
        row.versions.append(np.full((grew,), version(), np.int32))
      row.tok, row.pos = int(state["tok"][i]), int(state["pos"][i])
      row.length = int(state["length"][i])
      capacity_peak = max(capacity_peak, row.length)
      if state["done"][i]:
        row_done(r)
      else:
        still.append(r)
    book.active = still
    stats["chunks"] += 1
    stats["decode_steps"] += int(steps)
    stats["slot_steps"] += int(steps) * size
    stats["live_row_steps"] += int(live)
    bucket_steps[size] += int(steps)
    now = round(time.perf_counter() - start, 4)
    timeline.append((now, int(live) / max(1, int(steps) * size)))
    kv_timeline.append(
      (
        now,
        slot_program.kv_bytes(config, plan, book.pages.used),
        slot_program.kv_bytes(config, plan, plan.pool_pages),
      )
    )
    # The swap point: between two chunks, while prompts wait or rows live.
    if swaps is not None and (book.waiting() or book.active):
      take_new_weights()
      if cut:
        break

  if cut:  # the feed takes back every prompt not finished
    stats["cuts"] += 1
    feed.handback(slot_resume.handback(book))

  summary = dict(stats)
  summary["occupancy"] = stats["live_row_steps"] / max(1, stats["slot_steps"])
  summary["slots"] = plan.slots
  summary["page_size"] = plan.page_size
  summary["attention"] = plan.attention
  summary["bucket_steps"] = dict(sorted(bucket_steps.items()))
  summary["kv_bytes_peak"] = slot_program.kv_bytes(
    config, plan, plan.pool_pages
  )
  summary["kv_bytes_held_peak"] = slot_program.kv_bytes(
    config, plan, book.pages.used_peak
  )
  summary["kv_bytes_written_peak"] = slot_program.kv_token_bytes(
    config, plan.cache_dtype, written_peak
  )
  summary["capacity_peak"] = int(capacity_peak)
  summary["admitted"] = admitted
  summary["timeline"] = timeline
  summary["kv_timeline"] = kv_timeline
  if spec is not None:
    summary.update(spec.stats())
  out_tokens, out_logp, out_versions = [], [], []
  if feed is None:  # a stream gave every group to feed.done already
    for row in book.rows:
      out_tokens.append(_cat(row.tokens, np.int32).tolist())
      out_logp.append(_cat(row.logps, np.float32))
      out_versions.append(_cat(row.versions, np.int32))
  if swaps is None:
    return SlotRun(tokens=out_tokens, logp=out_logp, stats=summary)
  summary.update(swaps.stats())
  return SlotRun(out_tokens, out_logp, summary, versions=out_versions)


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
  if not parts:
    return np.zeros((0,), dtype)
  return np.concatenate(parts).astype(dtype)
