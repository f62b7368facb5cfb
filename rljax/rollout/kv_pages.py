"""The continuous engine's KV cache: pages of one pool, read through tables.

Every key and value of a continuous run sits in pages of P token slots of
one pool per layer, allocated once at its full size (`pool_pages`):

  pool    k [N, Hkv, hd, P], v [N, Hkv, P, hd] per layer (a page is laid
          out for the attention's two products, `paged_attention`)
  owners  a prompt's prefix entry holds the pages of its prompt slots, read
          by all n samples of the prompt; a row (one sample) holds the pages
          of its own generated tokens: own token u at slot u % P of its
          page u // P. Index N (out of range) marks a hole.

  host (`PageBook`)                     device (`write_tokens`,
  admission: an entry takes the pages    `write_blocks`, `paged_attention`)
  of its prompt; before a chunk, each    a prefill writes a prompt's keys
  live row takes the pages its next      into its entry's pages; a decode
  chunk may write; an ended row's or a   step writes each live row's new
  finished prompt's pages go back to     key into its page, then attends
  the free list                          over prefix + own pages in place

A page never moves: a decode batch that shrinks to its live rows
(`slot_scheduler`) permutes rows of the block table, not KV. The pool is
sized for every slot row at the new-token capacity plus every entry at the
prompt bucket, so a run never grows it (no pool-size compile keys, no
resize copies): what the rows hold is reported as "held" KV, the pool as
"reserved". This is vLLM's PagedAttention layout (Kwon et al., 2023,
"Efficient Memory Management for Large Language Model Serving with
PagedAttention") with one addition: a prompt's pages are shared by its
samples (copy-free prefix sharing).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def pages_for(tokens: int, page_size: int) -> int:
  """Pages that hold `tokens` slots."""
  return -(-max(0, tokens) // page_size)


def pool_pages(
  slots: int, new_tokens: int, entries: int, prompt_len: int, page_size: int
) -> int:
  """N: every slot row at `new_tokens` own slots plus every entry at a
  `prompt_len`-slot prompt (a prompt bucket is a whole number of pages)."""
  return slots * pages_for(new_tokens, page_size) + entries * pages_for(
    prompt_len, page_size
  )  # fmt: skip


class PageBook:
  """The host's record of which pages each owner (an entry, a row) holds.

  Pages come from a free list (`hold`), go back when their owner ends
  (`release`); `table` writes the block table of some owners.
  """

  def __init__(self, pages: int, page_size: int):
    if page_size < 1 or pages < 1:
      raise ValueError(
        f"PageBook: page_size={page_size}, pages={pages}; expected both >= 1"
      )
    self.page_size = page_size
    self.pages = pages
    self._free = list(range(pages - 1, -1, -1))
    self._held: dict[Hashable, list[int]] = {}
    self.used_peak = 0

  @property
  def used(self) -> int:
    return self.pages - len(self._free)

  def held(self, owner: Hashable) -> list[int]:
    return self._held.get(owner, [])

  def hold(self, owner: Hashable, tokens: int) -> list[int]:
    """Gives `owner` enough pages for slots 0 .. tokens - 1 (keeping those
    it holds); returns its pages."""
    pages = self._held.setdefault(owner, [])
    need = pages_for(tokens, self.page_size) - len(pages)
    if need > len(self._free):
      raise ValueError(
        f"PageBook.hold: {need} pages wanted, {len(self._free)} free of "
        f"{self.pages}; the pool is sized for every row at its limit"
      )
    for _ in range(max(0, need)):
      pages.append(self._free.pop())
    self.used_peak = max(self.used_peak, self.used)
    return pages

  def hold_span(self, owner: Hashable, first: int, last: int) -> list[int]:
    """Pages for slots first .. last - 1 only: the page list has `pages`
    (N, a hole) before the page of slot `first` (a left-padded prompt)."""
    if owner in self._held:
      raise ValueError(f"PageBook.hold_span: {owner!r} already holds pages")
    lo, hi = first // self.page_size, pages_for(last, self.page_size)
    if hi - lo > len(self._free):
      raise ValueError(
        f"PageBook.hold_span: {hi - lo} pages wanted, {len(self._free)} free"
      )
    pages = [self.pages] * lo + [self._free.pop() for _ in range(hi - lo)]
    self._held[owner] = pages
    self.used_peak = max(self.used_peak, self.used)
    return pages

  def release(self, owner: Hashable) -> None:
    """The owner's pages back to the free list (holes are not pages)."""
    pages = self._held.pop(owner, [])
    self._free.extend(p for p in reversed(pages) if p < self.pages)

  def table(self, owners: Sequence[Hashable | None], width: int) -> np.ndarray:
    """int32 [len(owners), width]: each owner's pages, N where it holds
    none (and for a None owner: a padding row)."""
    out = np.full((len(owners), width), self.pages, np.int32)
    for i, owner in enumerate(owners):
      pages = self._held.get(owner, []) if owner is not None else []
      out[i, : min(width, len(pages))] = pages[:width]
    return out


def write_tokens(pool_k, pool_v, k, v, table, start, count):
  """Rows' new keys and values into their own pages.

  Token t of row b (k[b, t], v[b, t]: [Hkv, hd]) goes to own slot
  start[b] + t, for t < count[b]; later tokens, slots past the table and
  holes (page N) are dropped.

  Args:
    pool_k, pool_v: one layer's pool, k [N, Hkv, hd, P], v [N, Hkv, P, hd]
      (`storage_dtype`).
    k, v: [B, T, Hkv, hd].
    table: int32 [B, W] the rows' pages.
    start, count: int32 [B].
  """
  n, _, _, p = pool_k.shape
  t = k.shape[1]
  width = table.shape[1]
  slot = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None]  # [B, T]
  ok = (jnp.arange(t)[None] < count[:, None]) & (slot < width * p)
  column = jnp.clip(slot // p, 0, width - 1)
  page = jnp.where(ok, jnp.take_along_axis(table, column, axis=1), n)
  offset = slot % p
  pool_k = pool_k.at[page, :, :, offset].set(stored(k, pool_k), mode="drop")
  pool_v = pool_v.at[page, :, offset, :].set(stored(v, pool_v), mode="drop")
  return pool_k, pool_v


def write_blocks(pool_k, pool_v, k, v, pages):
  """Whole pages of keys and values: a prefill's prompts into their
  entries' pages, a recompute's rows into theirs.

  Args:
    pool_k, pool_v: one layer's pool, k [N, Hkv, hd, P], v [N, Hkv, P, hd].
    k, v: [F, Wp · P, Hkv, hd], slot s in block s // P.
    pages: int32 [F, Wp] the page of each P-slot block; N: not written.
  """
  f, lp, hkv, hd = k.shape
  p = pool_k.shape[-1]
  blocks = k.reshape(f, lp // p, p, hkv, hd)
  k_pages = blocks.transpose(0, 1, 3, 4, 2).reshape(-1, hkv, hd, p)
  v_pages = (
    v.reshape(f, lp // p, p, hkv, hd)
    .transpose(0, 1, 3, 2, 4)
    .reshape(-1, hkv, p, hd)
  )
  index = pages.reshape(-1)
  pool_k = pool_k.at[index].set(stored(k_pages, pool_k), mode="drop")
  pool_v = pool_v.at[index].set(stored(v_pages, pool_v), mode="drop")
  return pool_k, pool_v


# XLA:CPU runs a scatter into a bf16 array in f32: it converted the whole
# pool to f32 and back around every write, two passes over every page per
# layer and step (a decode step several times slower), and a bitcast of
# the pool to uint16 around the scatter is a copy of it. So a bf16 pool is
# kept as its uint16 bit patterns: a scatter of those is done in place, and
# the attention reads them as bf16 (`paged_attention`).
def storage_dtype(cache_dtype) -> jnp.dtype:
  """The pool's array dtype for a cache of `cache_dtype`: uint16 holds
  bf16's bits; float32 is kept as is."""
  if jnp.dtype(cache_dtype) == jnp.bfloat16:
    return jnp.dtype(jnp.uint16)
  return jnp.dtype(cache_dtype)


def stored(x, pool) -> jax.Array:
  """Keys or values `x` as the pool stores them (rounded to bf16 for a
  uint16 pool)."""
  if pool.dtype == jnp.uint16:
    return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
  return x.astype(pool.dtype)


def readable(pool) -> jax.Array:
  """The pool as the values it holds (a uint16 pool as bf16)."""
  if pool.dtype == jnp.uint16:
    return jax.lax.bitcast_convert_type(pool, jnp.bfloat16)
  return pool
