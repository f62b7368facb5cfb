"""Multi-turn episodes in the continuous engine: a row keeps its KV from
turn to turn, and leaves the decode batch while its tool runs.

A row here is a whole episode (sample j of prompt p, as in
`slot_scheduler`); its own tokens are everything after the prompt: the
ids it sampled and the observation ids the host gave it, in order (own
token u at own slot u, `kv_pages`). The host (`EpisodeHost`, the
multi-turn driver) reads each segment the row decodes and says what comes
next:

  prefill (first tokens of      decode chunks of the live rows
  the prompt's n rows) ───────► (`slot_program.decode_chunk`)
         ▲                             │ a row stops: stop id or its limit
         │                             ▼
  queue of prompts          host.stopped(row, segment) ──► EpisodeStep
                                       │
        ┌──────────────────────────────┼──────────────────────┐
        ▼                              ▼                      ▼
  limit None: the episode     limit, no append: a      pending: the row
  ends, its pages go back     continuation, the row    leaves its slot with
                              waits for a slot         its pages (a tool runs);
                                                       host.poll later gives
                                                       its step ─┐
                                                                 ▼
                                append: the observation's prefill onto the
                                row's own pages and its next token
                                (`slot_append`), then a slot

So a turn boundary costs a prefill of the observation only (siblings keep
reading the prompt's shared entry pages), and rows whose tools are quick
(or who need none) keep decoding while a slow tool runs: there is no turn
barrier. A segment's ids past what the host keeps (`keep`: ids sampled
past a stop sequence) are taken back: the row's length returns there and
its next steps overwrite their KV.

The pool holds every row of the request at the plan's new-token capacity
(`SlotPlan.held_rows`): a parked row keeps its pages, so more rows than
slots may hold pages at once. Token t of a row is drawn with
`fold_in(key, t)` (the row's key from its prompt's prefill), t counting
observation ids too. No in-flight weight update or speculation here.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rljax.rollout import slot_append
from rljax.rollout import slot_plan
from rljax.rollout import slot_program
from rljax.rollout import slot_rows
from rljax.rollout.base import SamplingConfig


@dataclasses.dataclass(frozen=True)
class EpisodeStep:
  """The host's answer for a row whose segment ended.

  Attributes:
    keep: ids of the segment just ended that stay (the rest are taken
      back); None: all of them (and no segment, for a `poll` answer).
    append: ids to write after the row's tokens before it decodes on (an
      observation; mask 0 in training).
    limit: the row's own-token count at which its next segment stops (its
      tokens so far, appended ids included, plus the room the host gives
      it); None: the episode ends.
    pending: the answer comes later, from `EpisodeHost.poll`; the row
      leaves its slot and keeps its pages meanwhile.
  """

  keep: int | None = None
  append: Sequence[int] = ()
  limit: int | None = None
  pending: bool = False


class EpisodeHost(Protocol):
  """What drives the episodes of a run (the multi-turn driver)."""

  def stopped(self, row: int, ids: np.ndarray, logp: np.ndarray) -> EpisodeStep:
    """Row `row` ended a segment: `ids` (int32) and their behaviour
    log-probs, sampled since it last (re)entered decoding."""

  def poll(self, wait: bool) -> list[tuple[int, EpisodeStep]]:
    """Answers for pending rows that are ready; with `wait`, blocks until
    there is at least one (the engine has nothing else to do)."""


def run(
  config: Any,
  params: tuple[Any, Any],
  plan: slot_program.SlotPlan,
  prompts: list[list[int]],
  sampling: SamplingConfig,
  host: EpisodeHost,
  limits: Sequence[int],
  *,
  note_program: Callable[[Any], None] = lambda sig: None,
) -> dict[str, Any]:
  """Runs sampling.n episodes of every prompt through `plan.slots` rows.

  Args:
    config: the rollout decoder config.
    params: `slot_plan.prepare_params` of the rollout weights.
    plan: the run's plan, its new-token capacity the episodes' budget and
      `held_rows` every row.
    prompts: token ids, each at most plan.prompt_len long.
    sampling: seed, stop ids (every id a segment stops on), temperature...
    host: reads the segments and answers them (see the module doc).
    limits: int [P·n] each row's first segment's most tokens.
    note_program: called with each program signature run.

  Returns:
    the run's figures: decode_steps, chunks, prefills, appends (programs),
    appended_tokens, parked_peak (rows waiting for the host at once),
    host_wait_seconds (the engine idle, waiting for a tool), slot_steps,
    live_row_steps, occupancy, seconds.
  """
  prefill_params, decode_params = params
  n = plan.n
  temperature, top_p, stop_ids = slot_plan.traced_args(sampling)
  stop_set = set(sampling.stop_token_ids or ())
  book = slot_rows.Book(plan)
  for p, ids in enumerate(prompts):
    book.add_prompt(
      ids, p, sampling.seed, None, limits[p * n : p * n + n], np.zeros(n)
    )
  rows = len(book.rows)
  own: list[list[int]] = [[] for _ in range(rows)]
  own_logp: list[list[float]] = [[] for _ in range(rows)]
  seg = [0] * rows  # where each row's segment in progress began
  ready: collections.deque[int] = collections.deque()  # wait for a slot
  appends: list[tuple[int, list[int]]] = []
  parked: set[int] = set()
  most_prefill = slot_plan.prefill_sizes(plan.slots)[-1]
  refill_at = max(1, plan.slots // 4)
  most_own = plan.own_pages * plan.page_size
  stats = collections.Counter()
  wait_seconds = 0.0
  note_program(("init", plan))
  pool = slot_program.init_pool(config, plan)
  start = time.perf_counter()

  def prompt_len(r: int) -> int:
    return len(book.prompts[book.rows[r].prompt].ids)

  def took(r: int, toks, logps) -> None:
    """Row r's new own tokens (sampled or appended)."""
    own[r].extend(int(t) for t in toks)
    own_logp[r].extend(float(x) for x in logps)

  def segment_ended(r: int) -> None:
    a = seg[r]
    apply(
      r,
      host.stopped(
        r,
        np.asarray(own[r][a:], np.int32),
        np.asarray(own_logp[r][a:], np.float32),
      ),
    )

  def apply(r: int, step: EpisodeStep) -> None:
    row = book.rows[r]
    if step.keep is not None and seg[r] + step.keep < len(own[r]):
      cut = seg[r] + step.keep
      del own[r][cut:], own_logp[r][cut:]
      row.length = cut
      row.tok = own[r][-1]
      row.pos = prompt_len(r) + cut - 1
    if step.pending:
      parked.add(r)
      stats["parked_peak"] = max(stats["parked_peak"], len(parked))
      return
    parked.discard(r)
    if step.limit is None:
      book.end_row(r)
      return
    if step.limit <= row.length + len(step.append) or step.limit > most_own:
      raise ValueError(
        f"slot_episodes.run: row {r} given limit {step.limit} at "
        f"{row.length} own tokens (+{len(step.append)} appended); expected "
        f"more than it holds and at most {most_own}"
      )
    row.limit = int(step.limit)
    if step.append:
      appends.append((r, [int(t) for t in step.append]))
    else:
      seg[r] = row.length
      ready.append(r)

  def prefill(chosen: list[int]) -> None:
    nonlocal pool
    f = next(
      s for s in slot_plan.prefill_sizes(most_prefill) if s >= len(chosen)
    )
    toks, mask, pages, seeds, index = book.prefill_inputs(chosen, f)
    note_program(("prefill", plan, f))
    pool, tok, logp, key_data = slot_program.prefill(
      config, plan, prefill_params, pool, toks, mask, pages, seeds, index,
      temperature, top_p,
    )  # fmt: skip
    tok, logp, key_data = jax.device_get((tok, logp, key_data))
    stats["prefills"] += 1
    stopped = []
    for i, p in enumerate(chosen):
      for j in range(n):
        at, r = i * n + j, p * n + j
        row = book.rows[r]
        row.key = np.asarray(key_data[at])
        row.tok, row.pos, row.length = int(tok[at]), prompt_len(r), 1
        took(r, tok[at : at + 1], logp[at : at + 1])
        if int(tok[at]) in stop_set or row.limit <= 1:
          stopped.append(r)
    # A row that stopped at its first token leaves the queue: the host
    # decides where it goes.
    book.queue = [item for item in book.queue if item[2] not in stopped]
    for r in stopped:
      segment_ended(r)

  def append_batch(batch: list[tuple[int, list[int]]]) -> None:
    """The observations of `batch` onto their rows' pages; each row's next
    token (`slot_append`)."""
    nonlocal pool
    size = slot_program.bucket_for(len(batch), plan.slots)
    width = slot_append.width_for(max(len(ids) for _, ids in batch) + 1)
    key = book.rows[batch[0][0]].key
    inputs = {
      "pos": np.zeros((size,), np.int32),
      "length": np.ones((size,), np.int32),
      "keys": np.zeros((size, *np.shape(key)), np.uint32),
      "entry": np.full((size,), -1, np.int32),
      "live": np.zeros((size,), bool),
    }
    tokens = np.full((size, width), plan.pad_id, np.int32)
    count = np.ones((size,), np.int32)
    for i, (r, ids) in enumerate(batch):
      row = book.rows[r]
      book.pages.hold(("row", r), min(row.length + len(ids), most_own))
      inputs["pos"][i], inputs["length"][i] = row.pos, row.length
      inputs["keys"][i] = row.key
      inputs["entry"][i] = book.prompts[row.prompt].entry
      inputs["live"][i] = True
      tokens[i, 0], tokens[i, 1 : len(ids) + 1] = row.tok, ids
      count[i] = len(ids) + 1
    owners = [("row", r) for r, _ in batch] + [None] * (size - len(batch))
    table = book.pages.table(owners, plan.own_pages)
    note_program(("append", plan, size, width))
    pool, tok, logp = slot_append.append_chunk(
      config, plan, decode_params, pool, inputs, table, book.prefix(),
      tokens, count, temperature, top_p,
    )  # fmt: skip
    tok, logp = jax.device_get((tok, logp))
    stats["appends"] += 1
    stats["appended_tokens"] += int(count[: len(batch)].sum()) - len(batch)
    for i, (r, ids) in enumerate(batch):
      row = book.rows[r]
      took(r, ids, [0.0] * len(ids))
      seg[r] = len(own[r])
      took(r, tok[i : i + 1], logp[i : i + 1])
      row.tok, row.pos = int(tok[i]), row.pos + len(ids) + 1
      row.length = len(own[r])
      if row.tok in stop_set or row.length >= row.limit:
        segment_ended(r)
      else:
        ready.append(r)

  def admit() -> None:
    """Free slots: rows that were given their next segment first (they hold
    pages already), then rows of prefilled prompts, then new prompts."""
    while True:
      while book.free_slots and ready:
        book.active.append(ready.popleft())
      if not book.free_slots or not book.waiting():
        return
      book.active.extend(book.take_queued(book.free_slots))
      if not book.free_slots or not book.waiting():
        return
      if book.free_slots < refill_at and book.active:
        return
      chosen = book.to_prefill(book.free_slots, most_prefill)
      if not chosen:
        return
      prefill(chosen)

  while True:
    idle = not (book.active or ready or appends or book.waiting())
    if parked:
      began = time.perf_counter()
      answers = host.poll(wait=idle)
      if idle:
        wait_seconds += time.perf_counter() - began
      for r, step in answers:
        apply(r, step)
    elif idle:
      break
    while appends:
      batch, appends[:] = appends[: plan.slots], appends[plan.slots :]
      append_batch(batch)
    admit()
    if not book.active:
      if book.waiting() and not (parked or ready or appends):
        raise RuntimeError(
          f"slot_episodes.run: {len(book.queue)} rows wait with no row "
          "decoding and no prompt prefilled"
        )
      continue
    size = slot_program.bucket_for(len(book.active), plan.slots)
    exit_live = book.exit_live(size, refill_at, ready=bool(ready))
    book.reserve(plan.chunk_steps)
    inputs, table = book.bucket_inputs(size)
    note_program(("decode", plan, size))
    pool, state, out_tok, out_logp, steps, live = slot_program.decode_chunk(
      config, plan, decode_params, pool, inputs, table, book.prefix(),
      temperature, top_p, stop_ids, jnp.int32(plan.chunk_steps),
      jnp.int32(exit_live),
    )  # fmt: skip
    state, out_tok, out_logp, steps, live = jax.device_get(
      (state, out_tok, out_logp, steps, live)
    )
    still, ended = [], []
    for i, r in enumerate(book.active):
      row = book.rows[r]
      grew = int(state["length"][i]) - row.length
      if grew > 0:
        took(r, out_tok[i, :grew], out_logp[i, :grew])
      row.tok, row.pos = int(state["tok"][i]), int(state["pos"][i])
      row.length = int(state["length"][i])
      (ended if state["done"][i] else still).append(r)
    book.active = still
    stats["chunks"] += 1
    stats["decode_steps"] += int(steps)
    stats["slot_steps"] += int(steps) * size
    stats["live_row_steps"] += int(live)
    for r in ended:
      segment_ended(r)

  summary = dict(stats)
  summary["occupancy"] = stats["live_row_steps"] / max(1, stats["slot_steps"])
  summary["host_wait_seconds"] = wait_seconds
  summary["seconds"] = time.perf_counter() - start
  summary["slots"] = plan.slots
  summary["kv_bytes_peak"] = slot_program.kv_bytes(
    config, plan, plan.pool_pages
  )
  summary["kv_bytes_held_peak"] = slot_program.kv_bytes(
    config, plan, book.pages.used_peak
  )
  return summary
