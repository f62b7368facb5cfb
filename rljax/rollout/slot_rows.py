"""The host's book of a continuous run: every sample (row), every prompt,
which prompts hold a prefix entry, which rows wait and which decode, and
the program inputs of a decode bucket made from them.

  queue ──► pending ──► active ──► ended
  (no first    (first token       (in the decode batch:
   token yet)   from its prompt's  pages for its next chunk,
                prefill; waits     a place in the bucket)
                for a slot)

A row is sample j of prompt p (output row p·n + j). A prompt's prefill
samples the first tokens of all n rows at once, so a row whose prompt is
prefilled joins a free slot at no device cost. The queue is kept in
admission order: longest expected first (`priority`, descending; ties in
request order), so the long rows start early and the batch's tail is short.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

import numpy as np

from rljax.rollout import kv_pages
from rljax.rollout import paged_attention as attention_lib
from rljax.rollout import slot_program


@dataclasses.dataclass
class Prompt:
  """One prompt of the run: token ids, index and seed (its rows' PRNG
  keys), the caller's tag, rows not ended, its entry (None: none yet)."""

  ids: list[int]
  index: int
  seed: int
  tag: Any
  rows_left: int
  entry: int | None = None


@dataclasses.dataclass
class Row:
  """One sample's state: last token, its position, tokens sampled,
  limit, raw key data, and what it sampled (with each token's version)."""

  prompt: int
  limit: int
  tok: int = 0
  pos: int = 0
  length: int = 0
  key: np.ndarray | None = None
  tokens: list = dataclasses.field(default_factory=list)
  logps: list = dataclasses.field(default_factory=list)
  versions: list = dataclasses.field(default_factory=list)
  ended: bool = False


class Book:
  """Rows, prompts, entries and pages of one run (see the module doc)."""

  def __init__(self, plan: slot_program.SlotPlan):
    self.plan = plan
    self.pages = kv_pages.PageBook(plan.pool_pages, plan.page_size)
    self.prompts: list[Prompt] = []
    self.rows: list[Row] = []
    self.queue: list[tuple[float, int, int]] = []  # (-priority, seq, row)
    self.active: list[int] = []
    self.free_entries = list(range(plan.entries - 1, -1, -1))
    self.ptable = np.full(
      (plan.entries, plan.prompt_pages), plan.pool_pages, np.int32
    )
    self.pstart = np.zeros((plan.entries,), np.int32)
    self.pend = np.zeros((plan.entries,), np.int32)
    self._seq = 0

  # -- adding work ------------------------------------------------------------

  def add_prompt(self, ids, index, seed, tag, limits, priorities) -> int:
    """A prompt and its n rows (`limits`, `priorities`: n each), queued."""
    p = len(self.prompts)
    self.prompts.append(
      Prompt(list(ids), int(index), int(seed), tag, self.plan.n)
    )
    for j in range(self.plan.n):
      r = len(self.rows)
      self.rows.append(Row(prompt=p, limit=int(limits[j])))
      bisect.insort(self.queue, (-float(priorities[j]), self._seq, r))
      self._seq += 1
    return p

  # -- admission --------------------------------------------------------------

  @property
  def free_slots(self) -> int:
    return self.plan.slots - len(self.active)

  def waiting(self) -> bool:
    return bool(self.queue)

  def admissible(self) -> bool:
    """A queued row whose prompt is prefilled (joins at no device cost)."""
    return any(
      self.prompts[self.rows[r].prompt].entry is not None
      for *_, r in self.queue
    )

  def to_prefill(self, free: int, most: int) -> list[int]:
    """Prompts to prefill for the next `free` slots, in queue order: those
    of queued rows without an entry, at most `most` and the free entries."""
    out, seen, slots = [], set(), 0
    for *_, r in self.queue:
      if slots >= free:
        break
      p = self.rows[r].prompt
      if self.prompts[p].entry is not None or p in seen:
        slots += 1
        continue
      if len(out) >= min(most, len(self.free_entries)):
        continue
      seen.add(p)
      out.append(p)
      slots += 1
    return out

  def open_entry(self, p: int) -> int:
    """An entry with the pages of prompt p's slots (left-padded to Lp)."""
    e = self.free_entries.pop()
    lp = self.plan.prompt_len
    start = lp - len(self.prompts[p].ids)
    pages = self.pages.hold_span(("entry", e), start, lp)
    self.ptable[e] = self.plan.pool_pages
    self.ptable[e, : len(pages)] = pages
    self.pstart[e], self.pend[e] = start, lp
    self.prompts[p].entry = e
    return e

  def take_queued(self, free: int) -> list[int]:
    """Up to `free` queued rows whose prompts are prefilled, in order,
    out of the queue."""
    out, keep = [], []
    for item in self.queue:
      r = item[2]
      if (
        len(out) < free and self.prompts[self.rows[r].prompt].entry is not None
      ):
        out.append(r)
      else:
        keep.append(item)
    self.queue = keep
    return out

  def drop_ended_from_queue(self) -> None:
    self.queue = [item for item in self.queue if not self.rows[item[2]].ended]

  # -- ends -------------------------------------------------------------------

  def end_row(self, r: int) -> bool:
    """Row r ended: its pages back; True when its prompt's rows all ended
    (the prompt's entry and pages are then let go)."""
    row = self.rows[r]
    row.ended = True
    self.pages.release(("row", r))
    prompt = self.prompts[row.prompt]
    prompt.rows_left -= 1
    if prompt.rows_left:
      return False
    if prompt.entry is not None:
      e = prompt.entry
      self.pages.release(("entry", e))
      self.ptable[e] = self.plan.pool_pages
      self.pstart[e] = self.pend[e] = 0
      self.free_entries.append(e)
      prompt.entry = None
    return True

  # -- a decode bucket --------------------------------------------------------

  def reserve(self, steps: int) -> None:
    """Each active row holds the pages of the own slots its next `steps`
    decode steps may write (slots < length - 1 + steps, below its limit)."""
    most = self.plan.own_pages * self.plan.page_size
    for r in self.active:
      row = self.rows[r]
      self.pages.hold(("row", r), min(row.length - 1 + steps, row.limit, most))

  def prefill_inputs(self, chosen: list[int], size: int) -> tuple:
    """(tokens, mask, prompt pages, seeds, sample index), each [size, ...]:
    prompts `chosen` left-padded to the prompt bucket, each given a new
    entry (`open_entry`); rows past them are padding without pages."""
    plan = self.plan
    lp = plan.prompt_len
    toks = np.full((size, lp), plan.pad_id, np.int32)
    mask = np.zeros((size, lp), np.int32)
    pages = np.full((size, plan.prompt_pages), plan.pool_pages, np.int32)
    # A seed's low 32 bits, as `jax.random.key` reads a Python int.
    seeds = np.zeros((size,), np.uint32)
    index = np.zeros((size,), np.int32)
    for i, p in enumerate(chosen):
      ids = self.prompts[p].ids
      toks[i, lp - len(ids) :] = ids
      mask[i, lp - len(ids) :] = 1
      pages[i] = self.ptable[self.open_entry(p)]
      seeds[i] = self.prompts[p].seed & 0xFFFFFFFF
      index[i] = self.prompts[p].index
    return toks, mask, pages, seeds, index

  def exit_live(self, size: int, refill_at: int, ready: bool = False) -> int:
    """The live-row count at which a decode chunk of the active rows in row
    bucket `size` leaves early: below the next smaller bucket (the batch
    shrinks); with rows waiting (or `ready` rows to re-enter), as soon as a
    row ends when one could join at once, else when `refill_at` slots are
    free."""
    smaller = [b for b in slot_program.row_buckets(self.plan.slots) if b < size]
    live = smaller[-1] if smaller else 0
    if ready or self.waiting():
      want = 1 if ready or self.admissible() else refill_at - self.free_slots
      live = max(live, len(self.active) - max(1, want))
    return live

  def bucket_inputs(
    self, size: int
  ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The row state and block table of the active rows, padded to `size`
    rows (padding rows done, without entry or pages)."""
    count = len(self.active)
    rows = [self.rows[r] for r in self.active]
    key = rows[0].key if rows else None
    out = {
      "tok": np.full((size,), self.plan.pad_id, np.int32),
      "pos": np.zeros((size,), np.int32),
      "length": np.ones((size,), np.int32),
      "limit": np.ones((size,), np.int32),
      "done": np.ones((size,), bool),
      "keys": np.zeros((size, *np.shape(key)), np.uint32),
      "entry": np.full((size,), -1, np.int32),
    }
    for i, row in enumerate(rows):
      out["tok"][i] = row.tok
      out["pos"][i] = row.pos
      out["length"][i] = row.length
      out["limit"][i] = row.limit
      out["done"][i] = False
      out["keys"][i] = row.key
      out["entry"][i] = self.prompts[row.prompt].entry
    owners = [("row", r) for r in self.active] + [None] * (size - count)
    return out, self.pages.table(owners, self.plan.own_pages)

  def prefix(self) -> attention_lib.Prefix:
    return attention_lib.Prefix(self.ptable, self.pstart, self.pend)

  def held_tokens(self) -> int:
    """Own tokens the active rows have written (fed): the KV floor."""
    return sum(max(0, self.rows[r].length - 1) for r in self.active)
