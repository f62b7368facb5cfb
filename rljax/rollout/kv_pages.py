"""Paged own cache for continuous batching: KV that follows the live tokens.

With `page_size` P > 0 (`SlotPlan.page_size`), the rows' generated tokens do
not sit in an own cache of S rows × C slots (`slot_program`'s contiguous
layout, whose C follows the *longest* live row, so one long sample holds
every row at its length). They sit in pages of P token slots taken from one
pool shared by every row:

  pool    k [N, Hkv, hd, P], v [N, Hkv, P, hd] per layer
          (`models.init_decode_cache(config, N, P)`: a page is laid out as
          one row of the contiguous cache, P slots long);
  table   int32 [S, C/P]: row b's token t is at slot t % P of page
          table[b, t // P]; N (out of range) where the row holds no page.

  host (`PageBook`)                     device (`write`, `gather`)
  before a chunk: each live row gets    a decode step writes each live
  the pages its next chunk may write;   row's new key/value into its page
  the pool grows in steps of S·C/16    (idle rows: page N, dropped), then
  when it runs out (`pool_pages`)  ──►  gathers every row's pages into the
  after a chunk: an ended row's         [S, Hkv, hd, C] / [S, Hkv, C, hd]
  pages go back to the free list        layout `shared_prefix_attention` reads

So the pool holds about the live rows' tokens (plus at most one chunk ahead
per row and the rounding of N), not S × C. The price is the gather: every
decode step copies each row's live pages of every layer into the contiguous
layout before the attention reads them (one layer at a time, so the copy's
memory is one layer's S × C, not the cache's). This is the block table of
vLLM's PagedAttention (Kwon et al., 2023, "Efficient Memory Management for
Large Language Model Serving with PagedAttention"), kept in JAX: XLA has no
paged-attention kernel on the CPU, so the gather is an explicit copy.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def pool_pages(needed: int, unit: int) -> int:
  """Pool size for `needed` pages: the next multiple of `unit` (N grows in
  a few fixed steps, so a run compiles a few pool shapes)."""
  return max(unit, -(-needed // unit) * unit)


def pool_unit(slots: int, most: int, page_size: int, steps: int = 16) -> int:
  """A pool step: 1/`steps` of the pages S rows of `most` tokens would
  hold (the contiguous cache at its largest). 16 steps: the pool reserves
  at most 1/16 of that above what the rows hold, for at most 16 pool sizes
  (each a decode program per own-cache capacity it meets); 8 left the real
  workload's pool at 0.51x of the contiguous cache where the pages held
  0.41x (docs/performance.md)."""
  full = slots * -(-most // page_size)
  return max(1, -(-full // steps))


def pages_for(tokens: int, page_size: int) -> int:
  """Pages that hold `tokens` slots."""
  return -(-max(0, tokens) // page_size)


class PageBook:
  """The host's record of which pool page each slot row holds.

  Pages are handed out from a free list (`reserve`), given back when a row
  ends (`release`), and the pool can grow (`grow`); `table` writes the
  block table a decode chunk reads.
  """

  def __init__(self, slots: int, page_size: int, pages: int):
    if page_size < 1 or pages < 1:
      raise ValueError(
        f"PageBook: page_size={page_size}, pages={pages}; expected both >= 1"
      )
    self.page_size = page_size
    self.pages = pages
    self._free = list(range(pages - 1, -1, -1))
    self.rows: list[list[int]] = [[] for _ in range(slots)]
    self.used_peak = 0

  @property
  def used(self) -> int:
    return self.pages - len(self._free)

  def shortfall(self, wanted: dict[int, int]) -> int:
    """Pages missing from the free list for rows to hold `wanted[row]`
    token slots each."""
    more = sum(
      max(0, pages_for(t, self.page_size) - len(self.rows[r]))
      for r, t in wanted.items()
    )
    return max(0, more - len(self._free))

  def reserve(self, wanted: dict[int, int]) -> None:
    """Gives each row enough pages for `wanted[row]` token slots."""
    if self.shortfall(wanted):
      raise ValueError(
        f"PageBook.reserve: {self.shortfall(wanted)} pages short of "
        f"{len(self._free)} free; grow the pool first"
      )
    for row, tokens in wanted.items():
      while len(self.rows[row]) < pages_for(tokens, self.page_size):
        self.rows[row].append(self._free.pop())
    self.used_peak = max(self.used_peak, self.used)

  def release(self, row: int) -> None:
    """A row's pages back to the free list (the row ended)."""
    self._free.extend(reversed(self.rows[row]))
    self.rows[row] = []

  def grow(self, pages: int) -> None:
    """The pool now has `pages` pages; the new ones are free."""
    if pages < self.pages:
      raise ValueError(f"PageBook.grow: {pages} < {self.pages} pages")
    self._free[:0] = range(pages - 1, self.pages - 1, -1)
    self.pages = pages

  def table(self, width: int) -> np.ndarray:
    """int32 [S, width] block table; `pages` (out of range) where a row
    holds no page."""
    out = np.full((len(self.rows), width), self.pages, np.int32)
    for row, pages in enumerate(self.rows):
      out[row, : min(width, len(pages))] = pages[:width]
    return out


def write(pool_k, pool_v, k, v, table, write_index, page_size: int):
  """Row b's new key k[b] [Hkv, hd] and value v[b] into its page.

  write_index[b] is the token slot; at or past the table's slots (an idle
  row) the write is dropped, as is one to an unheld page (index N).
  """
  rows = jnp.arange(table.shape[0], dtype=jnp.int32)
  width = table.shape[1]
  column = jnp.minimum(write_index // page_size, width - 1)
  page = jnp.where(
    write_index < width * page_size, table[rows, column], pool_k.shape[0]
  )
  offset = write_index % page_size
  pool_k = pool_k.at[page, :, :, offset].set(
    k.astype(pool_k.dtype), mode="drop"
  )
  pool_v = pool_v.at[page, :, offset, :].set(
    v.astype(pool_v.dtype), mode="drop"
  )
  return pool_k, pool_v


def gather(pool_k, pool_v, table):
  """Every row's pages in the contiguous own-cache layout: k [S, Hkv, hd,
  C], v [S, Hkv, C, hd] with C = width · P (an unheld page reads some other
  page's slots, which the row's mask s ≤ t_b leaves out)."""
  s, width = table.shape
  _, hkv, hd, p = pool_k.shape
  k = jnp.take(pool_k, table, axis=0, mode="clip")  # [S, W, Hkv, hd, P]
  v = jnp.take(pool_v, table, axis=0, mode="clip")  # [S, W, Hkv, P, hd]
  k = k.transpose(0, 2, 3, 1, 4).reshape(s, hkv, hd, width * p)
  v = v.transpose(0, 2, 1, 3, 4).reshape(s, hkv, width * p, hd)
  return k, v


def scatter(pool_k, pool_v, k, v, table, rows_live):
  """Contiguous k [S, Hkv, hd, C], v [S, Hkv, C, hd] written back into the
  rows' pages, for the live rows only (`recompute_kv`)."""
  s, width = table.shape
  _, hkv, hd, p = pool_k.shape
  index = jnp.where(rows_live[:, None], table, pool_k.shape[0])
  k = k.reshape(s, hkv, hd, width, p).transpose(0, 3, 1, 2, 4)
  v = v.reshape(s, hkv, width, p, hd).transpose(0, 2, 1, 3, 4)
  pool_k = pool_k.at[index].set(k.astype(pool_k.dtype), mode="drop")
  pool_v = pool_v.at[index].set(v.astype(pool_v.dtype), mode="drop")
  return pool_k, pool_v
