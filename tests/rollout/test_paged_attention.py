"""Ragged paged attention (`paged_attention`): the C++ kernel and the XLA
reference against a numpy oracle of the equation, shared prompt pages,
causal queries, bf16 pools, holes and empty rows."""

from __future__ import annotations

import math

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.rollout import paged_attention as pa

native = pytest.mark.skipif(
  not pa.native_available(), reason="no C++ compiler: the XLA path runs"
)


def oracle(q, pool_k, pool_v, table, own_len, prefix, entry):
  """The module doc's equation, row by row, in float64."""
  q, pool_k, pool_v = (np.asarray(x, np.float64) for x in (q, pool_k, pool_v))
  b, t, hq, hd = q.shape
  n, hkv, _, p = pool_k.shape
  out = np.zeros_like(q)
  for r in range(b):
    keys, values = [], []
    e = int(entry[r])
    if e >= 0:
      for s in range(int(prefix.start[e]), int(prefix.end[e])):
        page = int(prefix.table[e, s // p])
        keys.append(pool_k[page, :, :, s % p])
        values.append(pool_v[page, :, s % p, :])
    pre = len(keys)
    for u in range(int(own_len[r])):
      page = int(table[r, u // p])
      keys.append(pool_k[page, :, :, u % p])
      values.append(pool_v[page, :, u % p, :])
    for i in range(t):
      seen = pre + max(0, int(own_len[r]) - (t - 1 - i))
      if seen <= 0 or not keys:
        continue
      k = np.stack(keys[:seen])  # [S, Hkv, hd]
      v = np.stack(values[:seen])
      for h in range(hq):
        c = h // (hq // hkv)
        x = k[:, c] @ q[r, i, h] / math.sqrt(hd)
        w = np.exp(x - x.max())
        out[r, i, h] = (w / w.sum()) @ v[:, c]
  return out


def layout(rng, b, t, hq, hkv, hd, p, dtype, lengths=None, entries=2):
  """Random pools, tables over distinct pages, prompt entries with a
  left-padded start, rows of varied lengths (one idle), some sharing."""
  w, wp = 5, 3
  n = b * w + entries * wp + 1
  pool_k = jnp.asarray(rng.normal(size=(n, hkv, hd, p)), dtype)
  pool_v = jnp.asarray(rng.normal(size=(n, hkv, p, hd)), dtype)
  perm = rng.permutation(n)
  table = perm[: b * w].reshape(b, w).astype(np.int32)
  ptable = perm[b * w : b * w + entries * wp].reshape(entries, wp)
  start = rng.integers(0, p + 2, entries)
  end = start + rng.integers(1, wp * p - p - 1, entries)
  prefix = pa.Prefix(
    ptable.astype(np.int32), start.astype(np.int32), end.astype(np.int32)
  )
  if lengths is None:
    lengths = rng.integers(t, w * p + 1, b)
    lengths[-1] = 0
  entry = rng.integers(-1, entries, b).astype(np.int32)
  q = jnp.asarray(rng.normal(size=(b, t, hq, hd)), jnp.float32)
  return q, pool_k, pool_v, table, np.asarray(lengths, np.int32), prefix, entry


def _run(impl, args):
  q, pool_k, pool_v, table, own, prefix, entry = args
  fn = jax.jit(
    lambda *a: pa.paged_attention(*a[:5], pa.Prefix(*a[5:8]), a[8], impl=impl)
  )
  return np.asarray(fn(q, pool_k, pool_v, table, own, *prefix, entry))


@pytest.mark.parametrize("impl", [pytest.param("native", marks=native), "xla"])
@pytest.mark.parametrize(
  "t, hq, hkv, hd, p",
  [(1, 9, 3, 64, 16), (3, 4, 2, 8, 8), (2, 4, 2, 8, 16), (1, 8, 2, 128, 32)],
)
def test_matches_the_equation(impl, t, hq, hkv, hd, p):
  rng = np.random.default_rng(hd + p + t)
  args = layout(rng, 6, t, hq, hkv, hd, p, jnp.float32)
  np.testing.assert_allclose(_run(impl, args), oracle(*args), atol=2e-5)


@native
@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
  lengths=st.lists(st.integers(0, 80), min_size=4, max_size=4),
  entry=st.lists(st.integers(-1, 1), min_size=4, max_size=4),
  seed=st.integers(0, 2**16),
)
def test_native_equals_reference_for_any_lengths(lengths, entry, seed):
  """Lengths and entries are data, not shapes: one compile, many cases
  (a row sees its slots only, whatever the others hold)."""
  rng = np.random.default_rng(seed)
  args = list(layout(rng, 4, 2, 4, 2, 8, 16, jnp.float32, lengths=lengths))
  args[6] = np.asarray(entry, np.int32)
  np.testing.assert_allclose(_run("native", args), _run("xla", args), atol=2e-5)


@pytest.mark.parametrize("impl", [pytest.param("native", marks=native), "xla"])
def test_bf16_pool_reads_exactly_its_values(impl):
  """A bf16 pool is widened exactly: the result equals f32 attention over
  the same (rounded) keys and values."""
  rng = np.random.default_rng(1)
  args = list(layout(rng, 5, 1, 9, 3, 64, 16, jnp.bfloat16))
  want = oracle(*[a.astype(jnp.float32) if i in (1, 2) else a
                  for i, a in enumerate(args)])  # fmt: skip
  np.testing.assert_allclose(_run(impl, args), want, atol=2e-5)


@native
def test_sharing_an_entry_changes_nothing():
  """Rows of one entry are scored together against its pages: each row's
  result is the one it gets alone."""
  rng = np.random.default_rng(2)
  args = list(layout(rng, 6, 1, 9, 3, 64, 16, jnp.float32))
  args[6] = np.zeros((6,), np.int32)
  together = _run("native", args)
  for r in range(6):
    alone = [
      a[r : r + 1] if i in (0, 3, 4, 6) else a for i, a in enumerate(args)
    ]
    np.testing.assert_allclose(
      _run("native", alone)[0], together[r], rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("impl", [pytest.param("native", marks=native), "xla"])
def test_a_query_without_keys_gets_zeros_and_holes_are_not_read(impl):
  rng = np.random.default_rng(3)
  q, pool_k, pool_v, table, own, prefix, entry = layout(
    rng, 3, 1, 4, 2, 8, 16, jnp.float32
  )
  entry = np.array([-1, -1, 0], np.int32)
  own = np.array([0, 5, 0], np.int32)
  # Row 1's unused pages are holes (N); poison every page no row reads.
  n = pool_k.shape[0]
  table = table.copy()
  table[1, 1:] = n
  read = {int(table[1, 0])} | {int(x) for x in prefix.table[0] if 0 <= x < n}
  poison = np.array([i not in read for i in range(n)])
  pool_k = jnp.where(poison[:, None, None, None], jnp.nan, pool_k)
  pool_v = jnp.where(poison[:, None, None, None], jnp.nan, pool_v)
  out = _run(impl, (q, pool_k, pool_v, table, own, prefix, entry))
  np.testing.assert_array_equal(out[0], 0.0)
  assert np.isfinite(out).all()
  want = oracle(q, pool_k, pool_v, table, own, prefix, entry)
  np.testing.assert_allclose(out, want, atol=2e-5)


class TestErrors:
  def test_bad_shapes_name_them(self):
    rng = np.random.default_rng(0)
    q, pool_k, pool_v, table, own, prefix, entry = layout(
      rng, 2, 1, 4, 2, 8, 16, jnp.float32
    )
    with pytest.raises(ValueError, match="expected k"):
      pa.paged_attention(q, pool_v, pool_v, table, own, prefix, entry)
    with pytest.raises(ValueError, match="table"):
      pa.paged_attention(q, pool_k, pool_v, table[:1], own, prefix, entry)

  def test_setting_is_checked(self, monkeypatch):
    monkeypatch.setenv(pa.IMPL_ENV, "fast")
    with pytest.raises(ValueError, match="RLJAX_PAGED_ATTENTION='fast'"):
      pa.choose(64, 16, jnp.float32)
    monkeypatch.setenv(pa.IMPL_ENV, "xla")
    assert pa.choose(64, 16, jnp.float32) == "xla"
    monkeypatch.setenv(pa.IMPL_ENV, "native")
    with pytest.raises(ValueError, match="head_dim=12"):
      pa.choose(12, 16, jnp.float32)
