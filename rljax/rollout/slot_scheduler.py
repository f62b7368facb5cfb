"""The host side of continuous batching: which prompt goes into which slot
group, when the own cache grows or shrinks, and what each row sampled.

  queue of prompts ──► free groups? ──► prefill_groups (F of them at once)
        ▲                                      │
        │                                      ▼
  rows' tokens ◄── decode_chunk (≤ chunk_steps steps, leaves when
  appended          `refill_at` groups are free) ◄── resize_cache (C follows
        │                                            the longest live row)
        ▼
  swap point (only with a `weight_updates` hook, while work is left):
  hook() ──► None: go on ──► (params, version): new weights for every later
  prefill and chunk; inflight_kv="recompute" first rewrites the live rows'
  KV with them (`slot_recompute.recompute_kv`), "keep" leaves it (`inflight`)
  A streamed run's feed may ask for a cut there first: the run ends and
  hands its unfinished prompts back with their rows (`slot_resume`).

It loops until the queue is empty and every row is done, then returns each
row's tokens and behaviour log-probs in the engine's order (sample j of
prompt i is row i·n + j) with the run's occupancy figures, and with a hook
each token's policy version and the swap figures.

What the run compiles (its plan, prefill sizes, cache capacities, the
weights as the programs read them) and `warm`, which compiles it ahead, are
`slot_plan`'s; the jitted programs are `slot_program`'s.
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
from rljax.rollout import kv_pages
from rljax.rollout import prompt_feed
from rljax.rollout import slot_plan
from rljax.rollout import slot_program
from rljax.rollout import slot_resume
from rljax.rollout.base import SamplingConfig
from rljax.rollout.static_program import new_token_capacity
from rljax.rollout.token_sampling import sample_keys


@dataclasses.dataclass
class SlotRun:
  """What `run` returns: per-row tokens and log-probs, in engine order, and
  the run's figures (`stats`: decode_steps, slot_steps, live_row_steps,
  occupancy, chunks, prefills, kv_bytes_peak, capacity_peak, timeline,
  kv_timeline (seconds, KV bytes held, reserved) per chunk,
  kv_bytes_written_peak (the prefix pool and the tokens the live rows had
  written, at their most: any layout's floor); with pages also
  kv_bytes_held_peak (the pages in use at their most), page_size;
  with `swaps` also `inflight.Swaps.stats`); `versions`: with `swaps`, each
  token's policy version, else None."""

  tokens: list[list[int]]
  logp: list[np.ndarray]
  stats: dict[str, Any]
  versions: list[np.ndarray] | None = None


def run(
  config: Any,
  params: tuple[Any, Any],
  prompts: list[list[int]],
  prompt_index: list[int],
  sampling: SamplingConfig,
  *,
  groups: int,
  prompt_len: int,
  chunk_steps: int,
  pad_id: int,
  cache_dtype: Any,
  activation_dtype: Any,
  note_program: Callable[[Any], None] = lambda sig: None,
  max_steps: int | None = None,
  row_limits: np.ndarray | None = None,
  group_width: int | None = None,
  swaps: inflight.Swaps | None = None,
  feed: prompt_feed.PromptFeed | None = None,
  page_size: int = 0,
) -> SlotRun:
  """Samples sampling.n responses of every prompt through G slot groups.

  Args:
    config: the rollout decoder config.
    params: `slot_plan.prepare_params` of the rollout weights.
    prompts: token ids, each at most prompt_len long.
    prompt_index: each prompt's index for its PRNG keys (`sample_keys`).
    sampling: the request's `SamplingConfig`.
    groups: G slot groups of `group_width` rows (S = G·width slots).
    prompt_len: Lp, the prompt bucket of the prefix pool.
    chunk_steps: most decode steps between two refills.
    pad_id: padding token.
    cache_dtype, activation_dtype: as the static program.
    note_program: called with each program signature run (compile count).
    max_steps: cap max_new_tokens (warm-up runs).
    row_limits: int [P·n] each sample's most tokens (<= max_new_tokens;
      vLLM's per-request max_tokens); None: max_new_tokens for all.
    group_width: rows a group (a divisor of n; default n): a prompt's n
      samples go in n / width blocks, each admitted on its own with its
      own copy of the prompt's keys. Narrower groups refill sooner after a
      sample ends; each block reads its own prefix copy at every step.
    swaps: in-flight weight updates (`inflight.Swaps`), polled after each
      decode chunk while work is left, and before a prefill in a streamed
      run; None: the weights never change.
    feed: a streamed run (`prompt_feed`): `prompts` are its first ones;
      more are polled between chunks (with their own seeds and indices),
      each prompt's rows go to `feed.done` as soon as they all end, and the
      run returns once the feed has nothing more and every row is done
      (its `tokens`/`logp` are then empty). `row_limits` applies to the
      first prompts; later ones get max_new_tokens. A prompt with
      `partial` rows continues them (`slot_resume`).
    page_size: P > 0: the rows' own KV in P-slot pages of one pool
      (`kv_pages`), which holds about the live rows' tokens; 0: an own
      cache of S rows × C slots, C following the longest live row.
  """
  prefill_params, decode_params = params
  n = sampling.n
  width = group_width or n
  blocks = n // width
  stop_ids = sampling.stop_token_ids or (-1,)
  most = new_token_capacity(sampling.max_new_tokens)
  max_new = sampling.max_new_tokens
  if max_steps is not None:
    max_new = min(max_new, max_steps)
  plan = slot_plan.make_plan(
    sampling, groups, prompt_len, chunk_steps, pad_id, cache_dtype,
    activation_dtype, width, page_size,
  )  # fmt: skip
  slots = plan.slots
  traced = slot_plan.traced_args(sampling, max_new)
  stop_set = set(stop_ids) if sampling.stop_token_ids else set()
  if row_limits is None:
    row_limits = np.full((len(prompts) * n,), max_new, np.int64)
  row_limits = list(np.minimum(np.asarray(row_limits, np.int64), max_new))
  # Per prompt (a streamed run adds prompts as it goes): its PRNG seed, the
  # caller's tag, and how many of its rows have not ended yet.
  prompts, prompt_index = list(prompts), list(prompt_index)
  seeds = [int(sampling.seed)] * len(prompts)
  tags: list[Any] = [None] * len(prompts)
  rows_left = [n] * len(prompts)
  capacity = slot_program.cache_capacity(min(chunk_steps, max_new), most)
  if page_size:
    unit = kv_pages.pool_unit(slots, most, page_size)
    book = kv_pages.PageBook(slots, page_size, unit)
    note_program(("init", plan, unit))
    state = slot_program.init_state(config, plan, unit)
  else:
    note_program(("init", plan, capacity))
    state = slot_program.init_state(config, plan, capacity)

  def own_slots() -> int:
    """C, the own-cache slots a row reads now (a whole number of pages)."""
    if page_size:
      return kv_pages.pages_for(capacity, page_size) * page_size
    return capacity

  def block_table():
    if not page_size:
      return None
    return jnp.asarray(book.table(own_slots() // page_size))

  # A unit is sample block k of prompt p: samples k·width .. k·width+width-1.
  queue = collections.deque(
    (p, k) for p in range(len(prompts)) for k in range(blocks)
  )
  owner = np.full((slots,), -1, np.int64)  # output row of each slot row
  row_len = np.zeros((slots,), np.int64)
  row_done = np.ones((slots,), bool)
  tokens: list[list[np.ndarray]] = [[] for _ in range(len(prompts) * n)]
  logps: list[list[np.ndarray]] = [[] for _ in range(len(prompts) * n)]
  versions: list[list[np.ndarray]] = [[] for _ in range(len(prompts) * n)]
  ended = [False] * (len(prompts) * n)  # each output row's end was seen
  rows = (tokens, logps, versions, ended)
  continuing: set[int] = set()  # prompts admitted with rows to continue
  cut = [False]  # a streamed run's cut (`prompt_feed`)

  def admit(new: list[prompt_feed.StreamPrompt]) -> None:
    for item in new:
      p = len(prompts)
      prompts.append(list(item.ids))
      prompt_index.append(int(item.index))
      seeds.append(int(item.seed))
      tags.append(item.tag)
      row_limits.extend([max_new] * n)
      left, units = slot_resume.admit_rows(item, n, width, rows)
      rows_left.append(left)
      if item.partial is not None:
        continuing.add(p)
      queue.extend((p, k) for k in units)

  def take_new_weights(state, prefill_params, decode_params):
    """The swap: new weights for every later prefill and chunk, if the hook
    has any; "recompute" first rewrites the live rows' KV with them. A cut
    the feed asks for comes first: the run ends here, before any newer
    weights are taken."""
    if prompt_feed.cut_requested(feed):
      cut[0] = True
      return state, prefill_params, decode_params
    new_params = swaps.poll()
    if new_params is None:
      return state, prefill_params, decode_params
    prefill_params, decode_params = new_params
    in_flight = ~row_done
    swaps.rows_in_flight.append(int(in_flight.sum()))
    if swaps.mode == "recompute" and in_flight.any():
      state = swaps.recompute(
        config,
        plan,
        prefill_params,
        state,
        group_prompts,
        inflight.response_matrix(tokens, owner, in_flight, own_slots(), pad_id),
        note_program,
        table=block_table(),
      )
    return state, prefill_params, decode_params

  def row_ended(out: int) -> None:
    """Streamed: a prompt whose rows all ended goes to the feed (and its
    rows are let go: a long run must not keep every response)."""
    p = out // n
    ended[out] = True
    rows_left[p] -= 1
    if feed is None or rows_left[p]:
      return
    rs = range(p * n, p * n + n)
    feed.done(
      prompt_feed.DoneGroup(
        tag=tags[p],
        prompt_ids=prompts[p],
        tokens=[
          np.concatenate(tokens[r]).astype(np.int32).tolist() for r in rs
        ],
        logp=[np.concatenate(logps[r]).astype(np.float32) for r in rs],
        versions=(
          None
          if swaps is None
          else [np.concatenate(versions[r]).astype(np.int32) for r in rs]
        ),
      )
    )
    for r in rs:
      tokens[r], logps[r], versions[r] = [], [], []

  def fit_cache(state):
    """The own cache sized for the live rows' next chunk: C follows the
    longest; with pages, each live row holds the pages of the slots its
    next chunk may write (t < length - 1 + chunk_steps, and below its
    limit), the pool growing by whole steps when the free list is short."""
    nonlocal capacity, kv_peak, capacity_peak
    need = int(row_len[~row_done].max()) + chunk_steps - 1
    new_capacity = slot_program.cache_capacity(min(need, max_new), most)
    if page_size:
      capacity = new_capacity
      wanted = {
        int(row): min(
          int(row_len[row]) - 1 + chunk_steps,
          int(row_limits[owner[row]]),
          own_slots(),
        )
        for row in np.flatnonzero(~row_done)
      }
      short = book.shortfall(wanted)
      if short:
        pages = kv_pages.pool_pages(book.pages + short, unit)
        note_program(("grow", plan, book.pages, pages))
        state = slot_program.resize_pool(pages, state)
        book.grow(pages)
        kv_peak = max(kv_peak, slot_program.kv_bytes(config, plan, pages))
      book.reserve(wanted)
      capacity_peak = max(capacity_peak, capacity)
    elif new_capacity != capacity:
      note_program(("resize", plan, capacity, new_capacity))
      state = slot_program.resize_cache(new_capacity, state)
      capacity = new_capacity
      kv_peak = max(kv_peak, slot_program.kv_bytes(config, plan, capacity))
      capacity_peak = max(capacity_peak, capacity)
    return state

  def continue_rows(state, params, continued):
    """Rows just prefilled take up the tokens a cut left them
    (`slot_resume`): their saved state, and every live row's KV
    recomputed from its tokens with `params`."""
    state = fit_cache(state)
    stats["continued_rows"] += len(continued)
    note_program(("continue", plan, own_slots()))
    live = ~row_done
    return slot_resume.continue_rows(
      config, plan, params, state,
      *slot_resume.continuation_arrays(continued, slots, tokens, ended),
      *map(jnp.asarray, group_prompts),
      jnp.asarray(
        inflight.response_matrix(tokens, owner, live, own_slots(), pad_id)
      ),
      block_table(),
    )  # fmt: skip

  # Each group's prompt as its prefill wrote it (a recompute re-reads it).
  group_prompts = (
    np.full((groups, prompt_len), pad_id, np.int32),
    np.zeros((groups, prompt_len), np.int32),
  )
  sizes = slot_plan.prefill_sizes(groups)
  stats = collections.Counter()
  kv_peak = slot_program.kv_bytes(
    config, plan, book.pages if page_size else capacity
  )
  capacity_peak = capacity
  timeline, kv_timeline = [], []
  cached_peak = 0
  start = time.perf_counter()

  while True:
    if feed is not None:
      if feed.stopped():
        break
      admit(feed.poll(prompt_len))
    free = np.flatnonzero(row_done.reshape(groups, width).all(axis=1))
    if queue and free.size:
      if feed is not None and swaps is not None:
        # Streamed: a prompt joins with the newest weights, not those of
        # the last chunk boundary (its tokens' lag starts as small as can be).
        state, prefill_params, decode_params = take_new_weights(
          state, prefill_params, decode_params
        )
        if cut[0]:
          break
      take = min(free.size, len(queue))
      f = next(s for s in sizes if s >= take)
      chosen = [queue.popleft() for _ in range(take)]
      toks = np.full((f, prompt_len), pad_id, np.int32)
      mask = np.zeros((f, prompt_len), np.int32)
      for i, (p, _) in enumerate(chosen):
        ids = prompts[p]
        toks[i, prompt_len - len(ids) :] = ids
        mask[i, prompt_len - len(ids) :] = 1
      target = np.full((f,), groups, np.int32)
      target[:take] = free[:take]
      index = np.zeros((f,), np.int32)
      index[:take] = [prompt_index[p] for p, _ in chosen]
      first = np.zeros((f,), np.int32)
      first[:take] = [k * width for _, k in chosen]
      # Row j of a unit is sample first + j of its prompt.
      sample = (first[:, None] + np.arange(width, dtype=np.int32)).reshape(-1)
      row_seed = np.zeros((f,), np.int32)
      row_seed[:take] = [seeds[p] for p, _ in chosen]
      keys = sample_keys(
        jnp.asarray(np.repeat(row_seed, width))
        if feed is not None
        else sampling.seed,
        jnp.asarray(np.repeat(index, width)),
        jnp.asarray(sample),
      )
      note_program(("prefill", plan, f))
      limits = np.ones((f, width), np.int32)
      for i, (p, k) in enumerate(chosen):
        limits[i] = row_limits[p * n + k * width : p * n + (k + 1) * width]
      state, tok, logp = slot_program.prefill_groups(
        config, plan, prefill_params, state, jnp.asarray(toks),
        jnp.asarray(mask), jnp.asarray(target), jax.random.key_data(keys),
        jnp.asarray(limits.reshape(-1)), *traced,
      )  # fmt: skip
      tok, logp = jax.device_get((tok, logp))
      stats["prefills"] += 1
      if feed is not None:
        for p, _ in chosen:
          feed.started(tags[p], swaps.version if swaps is not None else 0)
      group_prompts[0][free[:take]] = toks[:take]
      group_prompts[1][free[:take]] = mask[:take]
      continued = []  # (slot row, output row) taking up a handed-back row
      for i, (p, k) in enumerate(chosen):
        for j in range(width):
          row, out, at = (
            int(target[i]) * width + j,
            p * n + k * width + j,
            i * width + j,
          )
          owner[row] = out
          if p in continuing and tokens[out]:
            continued.append((row, out))
            row_len[row] = sum(t.size for t in tokens[out])
            row_done[row] = ended[out]
            continue
          tokens[out] = [tok[at : at + 1]]
          logps[out] = [logp[at : at + 1]]
          if swaps is not None:
            versions[out] = [np.full((1,), swaps.version, np.int32)]
          row_len[row] = 1
          row_done[row] = int(tok[at]) in stop_set or row_limits[out] <= 1
          if row_done[row]:
            row_ended(out)
      if continued:
        state = continue_rows(state, prefill_params, continued)
      continue
    if row_done.all():
      break
    state = fit_cache(state)
    # With prompts waiting, leave the chunk once a quarter of the groups
    # (or all that the queue can fill) are free: one prefill refills them.
    refill_at = min(len(queue), max(1, groups // 4)) if queue else groups + 1
    note_program(("decode", plan, own_slots(), book.pages if page_size else 0))
    state, out_tok, out_logp, steps, live = slot_program.decode_chunk(
      config,
      plan,
      decode_params,
      state,
      *traced,
      jnp.int32(chunk_steps),
      jnp.int32(refill_at),
      block_table(),
    )
    out_tok, out_logp, steps, live, length, done = jax.device_get(
      (out_tok, out_logp, steps, live, state["length"], state["done"])
    )
    grew = length - row_len
    for row in np.flatnonzero(grew > 0):
      count = int(grew[row])
      tokens[owner[row]].append(out_tok[row, :count])
      logps[owner[row]].append(out_logp[row, :count])
      if swaps is not None:
        versions[owner[row]].append(np.full((count,), swaps.version, np.int32))
    for row in np.flatnonzero(np.asarray(done, bool) & ~row_done):
      row_ended(int(owner[row]))
      if page_size:
        book.release(int(row))
    # Tokens whose KV the chunk's rows had written by its end: what any
    # layout must hold at that moment (the floor under every KV figure).
    cached_peak = max(
      cached_peak, int(np.maximum(length - 1, 0)[~row_done].sum())
    )
    row_len, row_done = length.astype(np.int64), np.array(done, bool)
    stats["chunks"] += 1
    stats["decode_steps"] += int(steps)
    stats["slot_steps"] += int(steps) * slots
    stats["live_row_steps"] += int(live)
    now = round(time.perf_counter() - start, 4)
    timeline.append((now, int(live) / max(1, int(steps) * slots)))
    # KV bytes the slots reserve (the pool, or S x C) and hold for tokens
    # (with pages: the pages in use; without: the same S x C).
    reserved = slot_program.kv_bytes(
      config, plan, book.pages if page_size else capacity
    )
    held = (
      slot_program.kv_bytes(config, plan, book.used) if page_size else reserved
    )
    kv_timeline.append((now, held, reserved))
    # The swap point: between two chunks, while prompts wait or rows live.
    if swaps is not None and (queue or not row_done.all()):
      state, prefill_params, decode_params = take_new_weights(
        state, prefill_params, decode_params
      )
      if cut[0]:
        break

  if cut[0]:  # the feed takes back every prompt not finished
    stats["cuts"] += 1
    feed.handback(
      slot_resume.handback_prompts(
        rows_left, (prompts, prompt_index, seeds, tags), n, rows
      )
    )
  if feed is not None:  # every group went to feed.done already
    tokens, logps, versions = [], [], []
  out_tokens = [np.concatenate(t).astype(np.int32).tolist() for t in tokens]
  out_logp = [np.concatenate(lp).astype(np.float32) for lp in logps]
  summary = dict(stats)
  summary["occupancy"] = stats["live_row_steps"] / max(1, stats["slot_steps"])
  summary["slots"] = slots
  summary["kv_bytes_peak"] = int(kv_peak)
  summary["kv_bytes_written_peak"] = int(
    slot_program.kv_token_bytes(config, plan, cached_peak)
  )
  if page_size:
    # What the held pages alone took at their most (the pool rounds up).
    summary["kv_bytes_held_peak"] = int(
      slot_program.kv_bytes(config, plan, book.used_peak)
    )
    summary["page_size"] = page_size
  summary["capacity_peak"] = int(capacity_peak)
  summary["timeline"] = timeline
  summary["kv_timeline"] = kv_timeline
  if swaps is None:
    return SlotRun(tokens=out_tokens, logp=out_logp, stats=summary)
  summary.update(swaps.stats())
  out_versions = [np.concatenate(v).astype(np.int32) for v in versions]
  return SlotRun(out_tokens, out_logp, summary, versions=out_versions)
