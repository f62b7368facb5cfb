"""Attention over a paged KV cache, each row bounded by its own length.

The continuous engine keeps every key and value in pages of P token slots
of one pool (`kv_pages`): a prompt's in the pages of its prefix entry, read
by all n samples of the prompt; each row's generated tokens in pages of its
own. `paged_attention` is one attention call of B rows, T queries each:

  row b, query t (own position len_b - T + t), query head h, kv head c:
    keys   [prefix slots s in [start_e, end_e) of entry e = entry[b];
            own slots u < len_b - (T - 1 - t)]
    out    = Σ_j softmax_j(q · k_j / sqrt(hd)) v_j

so a row pays for its own tokens, not the longest row's (ragged), a query
never sees a later query's key (causal among the T: a decode step has
T = 1; the speculative verify pass k + 1; an observation's prefill its
length), and a prompt read once serves every row of its entry.

Two implementations, one result:
  native  `paged_attention.cc`, a C++ custom call (XLA FFI) built on first
          use (`native_build`): reads the pages where they lie, the rows of
          an entry together against each prompt page, each row's own pages
          up to its length; f32 or bf16 pools (bf16 widened as read, every
          product and sum in f32). On the CPU backend when it builds.
  xla     `reference`: gathers each row's prompt and own pages into a dense
          [B, S] layout and runs masked dense attention. Any backend; the
          kernel's test oracle. Its cost follows the table widths (every
          row at the longest), its gather is a copy.

`RLJAX_PAGED_ATTENTION=auto|native|xla` picks (auto: native where it runs).

Layouts: q [B, T, Hq, hd]; pool k [N, Hkv, hd, P] and v [N, Hkv, P, hd]
(`kv_pages`: f32, bf16, or uint16 holding bf16 bits); table int32 [B, W] own pages; prefix table [E, Wp] with
start, end [E]; entry [B] (-1: none); own_len [B]. A page index outside
[0, N) is a hole: never read (the host only asks for slots it wrote).
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rljax.rollout import native_build

IMPL_ENV = "RLJAX_PAGED_ATTENTION"
IMPLS = ("auto", "native", "xla")
TARGET = "RljaxPagedAttention"
SOURCE = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "paged_attention.cc"
)
# (head_dim, page_size) pairs the native kernel is compiled for.
NATIVE_SHAPES = frozenset(
  {(8, 8), (8, 16), (32, 16), (64, 16), (128, 16), (64, 32), (128, 32)}
)
# Added to masked scores in the reference (finite: no NaN on empty rows).
_MASK_VALUE = float(jnp.finfo(jnp.float32).min) / 2


class Prefix(NamedTuple):
  """The prompt pages rows may share: entry e's keys are slots [start[e],
  end[e]) of the page sequence table[e] (int32 [E, Wp], [E], [E])."""

  table: jax.Array
  start: jax.Array
  end: jax.Array


def impl_setting() -> str:
  """The `RLJAX_PAGED_ATTENTION` setting (default "auto"), checked."""
  value = os.environ.get(IMPL_ENV, "auto").strip().lower() or "auto"
  if value not in IMPLS:
    raise ValueError(f"{IMPL_ENV}={value!r}: expected one of {IMPLS}")
  return value


def native_available() -> bool:
  """Whether the C++ kernel is built and registered (builds it once)."""
  if jax.default_backend() != "cpu":
    return False
  return native_build.load(SOURCE, (TARGET,)) is not None


def choose(head_dim: int, page_size: int, dtype) -> str:
  """ "native" or "xla" for a pool of `dtype`, per the setting and what the
  kernel supports; "native" asked for where it cannot run is an error."""
  setting = impl_setting()
  fits = (head_dim, page_size) in NATIVE_SHAPES and jnp.dtype(dtype) in (
    jnp.dtype(jnp.float32),
    jnp.dtype(jnp.bfloat16),
    jnp.dtype(jnp.uint16),
  )
  if setting == "xla":
    return "xla"
  usable = fits and native_available()
  if setting == "native" and not usable:
    raise ValueError(
      f"{IMPL_ENV}=native: the kernel cannot run head_dim={head_dim}, "
      f"page_size={page_size}, pool dtype {jnp.dtype(dtype)} on backend "
      f"{jax.default_backend()!r} ({native_build.last_error.get(SOURCE, '')});"
      f" expected (head_dim, page_size) in {sorted(NATIVE_SHAPES)}, an f32 "
      "or bf16 pool, the CPU and a C++ compiler"
    )
  return "native" if usable else "xla"


def _check(q, pool_k, pool_v, table, own_len, prefix, entry):
  if q.ndim != 4 or pool_k.ndim != 4 or pool_v.ndim != 4:
    raise ValueError(
      f"paged_attention: q {q.shape}, pool k {pool_k.shape}, v "
      f"{pool_v.shape}; expected q [B, T, Hq, hd], k [N, Hkv, hd, P], v "
      "[N, Hkv, P, hd]"
    )
  b, _, hq, hd = q.shape
  n, hkv, _, p = pool_k.shape
  if pool_k.shape != (n, hkv, hd, p) or pool_v.shape != (n, hkv, p, hd):
    raise ValueError(
      f"paged_attention: pool k {pool_k.shape}, v {pool_v.shape} with "
      f"hd={hd}; expected k [N, Hkv, {hd}, P] and v [N, Hkv, P, {hd}]"
    )
  if hq % hkv:
    raise ValueError(f"paged_attention: {hq} query heads over {hkv} kv heads")
  if table.ndim != 2 or table.shape[0] != b:
    raise ValueError(f"paged_attention: table {table.shape}; expected [{b}, W]")
  if own_len.shape != (b,) or entry.shape != (b,):
    raise ValueError(
      f"paged_attention: own_len {own_len.shape}, entry {entry.shape}; "
      f"expected [{b}]"
    )
  e = prefix.table.shape[0]
  if (
    prefix.table.ndim != 2
    or prefix.start.shape != (e,)
    or prefix.end.shape != (e,)
  ):
    raise ValueError(
      f"paged_attention: prefix table {prefix.table.shape}, start "
      f"{prefix.start.shape}, end {prefix.end.shape}; expected [E, Wp], "
      "[E], [E]"
    )


def paged_attention(
  q: jax.Array,
  pool_k: jax.Array,
  pool_v: jax.Array,
  table: jax.Array,
  own_len: jax.Array,
  prefix: Prefix,
  entry: jax.Array,
  *,
  impl: str | None = None,
) -> jax.Array:
  """Each row's queries over its prompt pages and its own pages (the
  module doc); float32 math, the result in q's dtype.

  Args:
    q: [B, T, Hq, hd] queries (after RoPE).
    pool_k, pool_v: one layer's pool, k [N, Hkv, hd, P], v [N, Hkv, P, hd].
    table: int32 [B, W] each row's own pages in order.
    own_len: int32 [B] own slots the last query sees (0: none).
    prefix: the entries' prompt pages (`Prefix`).
    entry: int32 [B] each row's entry, -1 for none.
    impl: "native" or "xla"; None: `choose`.

  Returns:
    [B, T, Hq, hd]; a query that sees no key gets zeros.
  """
  _check(q, pool_k, pool_v, table, own_len, prefix, entry)
  if impl is None:
    impl = choose(q.shape[-1], pool_k.shape[-1], pool_k.dtype)
  args = (
    q.astype(jnp.float32),
    pool_k,
    pool_v,
    table.astype(jnp.int32),
    own_len.astype(jnp.int32),
    prefix.table.astype(jnp.int32),
    prefix.start.astype(jnp.int32),
    prefix.end.astype(jnp.int32),
    entry.astype(jnp.int32),
  )
  if impl == "native":
    if not native_available():
      raise ValueError(
        "paged_attention: impl='native' but the kernel is not available: "
        f"{native_build.last_error.get(SOURCE, 'not on the CPU backend')}"
      )
    out = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32))(
      *args, scale=np.float32(1.0 / math.sqrt(q.shape[-1]))
    )
  elif impl == "xla":
    pools = [
      jax.lax.bitcast_convert_type(x, jnp.bfloat16)
      if x.dtype == jnp.uint16
      else x
      for x in args[1:3]
    ]
    out = reference(args[0], *pools, *args[3:5], Prefix(*args[5:8]), args[8])
  else:
    raise ValueError(f"paged_attention: impl={impl!r}; expected native or xla")
  return out.astype(q.dtype)


def _rows_pages(pool, pages):
  """pool [N, Hkv, a, b] gathered at pages [B, W] -> [B, W, Hkv, a, b]."""
  return jnp.take(pool, pages, axis=0, mode="clip")


def reference(q, pool_k, pool_v, table, own_len, prefix, entry):
  """`paged_attention` as dense masked attention over gathered pages."""
  b, t, hq, hd = q.shape
  _, hkv, _, p = pool_k.shape
  w, wp = table.shape[1], prefix.table.shape[1]
  g = hq // hkv
  has = entry >= 0
  e = jnp.maximum(entry, 0)
  pages = prefix.table[e]  # [B, Wp]
  k_pre = _rows_pages(pool_k, pages).transpose(0, 2, 1, 4, 3)
  v_pre = _rows_pages(pool_v, pages).transpose(0, 2, 1, 3, 4)
  k_own = _rows_pages(pool_k, table).transpose(0, 2, 1, 4, 3)
  v_own = _rows_pages(pool_v, table).transpose(0, 2, 1, 3, 4)
  k = jnp.concatenate(
    [k_pre.reshape(b, hkv, wp * p, hd), k_own.reshape(b, hkv, w * p, hd)], 2
  ).astype(jnp.float32)
  v = jnp.concatenate(
    [v_pre.reshape(b, hkv, wp * p, hd), v_own.reshape(b, hkv, w * p, hd)], 2
  ).astype(jnp.float32)
  slot = jnp.arange(wp * p)
  pre_ok = (
    has[:, None]
    & (slot[None] >= prefix.start[e][:, None])
    & (slot[None] < prefix.end[e][:, None])
  )
  own_slot = jnp.arange(w * p)
  last = own_len[:, None] - (t - 1 - jnp.arange(t))[None]  # [B, T]
  own_ok = own_slot[None, None] < last[..., None]  # [B, T, W·P]
  ok = jnp.concatenate(
    [jnp.broadcast_to(pre_ok[:, None], (b, t, wp * p)), own_ok], -1
  )
  qg = q.reshape(b, t, hkv, g, hd).astype(jnp.float32)
  scores = jnp.einsum("btkgd,bksd->btkgs", qg, k) / math.sqrt(hd)
  scores = jnp.where(ok[:, :, None, None], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1)
  # Slots no query sees may be holes or stale pages: zero them, so that a
  # non-finite value there cannot reach the output through a 0 weight.
  v = jnp.where(jnp.any(ok, axis=1)[:, None, :, None], v, 0.0)
  out = jnp.einsum("btkgs,bksd->btkgd", probs, v)
  seen = jnp.any(ok, axis=-1)[:, :, None, None, None]
  return jnp.where(seen, out, 0.0).reshape(b, t, hq, hd)
