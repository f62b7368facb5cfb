"""The paged own cache of continuous batching (`kv_pages`, `kv_page_size`):
the page book, the write/gather/scatter layout, the same samples as the
contiguous own cache, and a pool that follows the live tokens."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rljax.rollout import base, kv_pages
from rljax.rollout.jax_sampler import JaxSampler
from rljax.train import config as config_lib
from tests.rollout.test_inflight_updates import _CONFIG, _sharp

PROMPTS = [[5, 17, 3], [9], [4, 8, 15, 16, 23, 42, 7], [11, 12], [1, 2, 3], [6]]


@pytest.fixture(scope="module")
def params():
  """Sharp next-token distributions (no near-ties for float noise to
  flip): the in-flight tests' tiny model."""
  return _sharp(0)


def _engine(params, **kw):
  return JaxSampler(
    _CONFIG,
    params,
    max_prompt_len=16,
    batching="continuous",
    decode_slots=4,
    chunk_steps=8,
    **kw,
  )


def _assert_identical(a: base.RolloutBatch, b: base.RolloutBatch):
  assert a.response_ids == b.response_ids
  assert a.finish_reason == b.finish_reason
  for x, y in zip(a.behav_logp, b.behav_logp):
    np.testing.assert_array_equal(x, y)


class TestPageBook:
  def test_reserve_release_and_table(self):
    book = kv_pages.PageBook(slots=3, page_size=4, pages=6)
    book.reserve({0: 5, 2: 4})  # 2 pages and 1 page
    assert [len(r) for r in book.rows] == [2, 0, 1]
    assert book.used == 3 and book.used_peak == 3
    table = book.table(3)
    np.testing.assert_array_equal(table[1], [6, 6, 6])  # no page: N
    assert table[0, 2] == 6 and len(set(table[0, :2]) | {table[2, 0]}) == 3
    book.reserve({0: 9})  # grows row 0 to 3 pages, keeps the first two
    assert book.rows[0][:2] == list(table[0, :2]) and book.used == 4
    book.release(0)
    assert book.used == 1 and book.used_peak == 4 and book.rows[0] == []

  def test_shortfall_and_grow(self):
    book = kv_pages.PageBook(slots=2, page_size=4, pages=2)
    assert book.shortfall({0: 8, 1: 8}) == 2
    with pytest.raises(ValueError, match="2 pages short"):
      book.reserve({0: 8, 1: 8})
    book.grow(4)
    book.reserve({0: 8, 1: 8})
    assert sorted(book.rows[0] + book.rows[1]) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="3 < 4"):
      book.grow(3)

  def test_pool_sizes(self):
    # 4 rows of at most 64 tokens in pages of 16: 16 pages full, 8 steps
    # of 2 (the default 16 steps of 1).
    assert kv_pages.pool_unit(4, 64, 16, steps=8) == 2
    assert kv_pages.pool_unit(4, 64, 16) == 1
    assert [kv_pages.pool_pages(n, 2) for n in (0, 1, 2, 3, 16)] == [
      2,
      2,
      2,
      4,
      16,
    ]
    assert kv_pages.pages_for(17, 16) == 2 and kv_pages.pages_for(0, 16) == 0


class TestLayout:
  def test_write_then_gather_is_the_contiguous_cache(self):
    """Token t of row b, written through the table, reads back at slot t
    of row b's contiguous [Hkv, hd, C] / [Hkv, C, hd] rows."""
    s, hkv, hd, p, width = 2, 1, 2, 2, 3
    pool_k = jnp.zeros((5, hkv, hd, p))
    pool_v = jnp.zeros((5, hkv, p, hd))
    table = jnp.array([[3, 0, 5], [1, 4, 2]], jnp.int32)  # 5: row 0 holds 2
    for t in range(4):
      k = jnp.array([[[10 * b + t, -(10 * b + t)]] for b in range(s)], float)
      pool_k, pool_v = kv_pages.write(
        pool_k, pool_v, k, 2 * k, table, jnp.array([t, t]), p
      )
    # Row 1 is idle (slot C): its write is dropped.
    pool_k, pool_v = kv_pages.write(
      pool_k,
      pool_v,
      jnp.full((s, hkv, hd), 99.0),
      jnp.full((s, hkv, hd), 99.0),
      table,
      jnp.array([4, width * p]),
      p,
    )
    k, v = kv_pages.gather(pool_k, pool_v, table)
    assert k.shape == (s, hkv, hd, width * p) and v.shape == (
      s,
      hkv,
      width * p,
      hd,
    )
    np.testing.assert_array_equal(k[0, 0, 0, :4], [0, 1, 2, 3])
    np.testing.assert_array_equal(k[1, 0, 1, :4], [-10, -11, -12, -13])
    np.testing.assert_array_equal(v[1, 0, :4, 0], [20, 22, 24, 26])
    # Row 1's third page (2) untouched: its slot-C write was dropped.
    assert float(jnp.abs(pool_k[2]).max()) == 0.0
    # Row 0's slot 4 went to page 5 = N: dropped, nothing else changed.
    np.testing.assert_array_equal(pool_k[3, 0, 0], [0, 1])

  def test_scatter_inverts_gather_for_live_rows(self):
    rng = np.random.default_rng(0)
    pool_k = jnp.asarray(rng.normal(size=(6, 2, 3, 4)), jnp.float32)
    pool_v = jnp.asarray(rng.normal(size=(6, 2, 4, 3)), jnp.float32)
    table = jnp.array([[4, 1], [0, 6]], jnp.int32)
    k, v = kv_pages.gather(pool_k, pool_v, table)
    new_k, new_v = kv_pages.scatter(
      jnp.zeros_like(pool_k),
      jnp.zeros_like(pool_v),
      k,
      v,
      table,
      jnp.array([True, False]),
    )
    for page in (4, 1):
      np.testing.assert_array_equal(new_k[page], pool_k[page])
      np.testing.assert_array_equal(new_v[page], pool_v[page])
    assert float(jnp.abs(new_k[0]).max()) == 0.0  # row 1 is not live


class TestSameSamplesAsContiguous:
  @pytest.mark.parametrize("page_size", [4, 16])
  def test_greedy_with_stops(self, params, page_size):
    cfg = base.SamplingConfig(
      n=2, greedy=True, max_new_tokens=40, stop_token_ids=(3, 5, 9)
    )
    want = _engine(params).generate(PROMPTS, cfg)
    got = _engine(params, kv_page_size=page_size).generate(PROMPTS, cfg)
    _assert_identical(want, got)
    assert {"stop", "length"} <= set(got.finish_reason)

  @pytest.mark.parametrize("width", [None, 1])
  def test_seeded_long_tail_and_less_kv(self, params, width):
    """A seeded sampled rollout whose per-sample limits have a long tail
    (two of twelve samples at 200 tokens, the rest 9-42): the same tokens
    and log-probs, bit for bit; the pool holds far less than the own cache
    that every row keeps at the longest live row's length."""
    cfg = base.SamplingConfig(
      n=2, temperature=1.0, max_new_tokens=200, stop_token_ids=(3,), seed=3
    )
    limits = [200 if i % 5 == 0 else 9 + 3 * i for i in range(12)]
    want = _engine(params, group_width=width).generate(
      PROMPTS, cfg, max_new_tokens_per_sample=limits
    )
    engine = _engine(params, group_width=width, kv_page_size=4)
    got = engine.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    _assert_identical(want, got)
    assert max(len(r) for r in got.response_ids) > 100
    paged, own = got.timing["kv_bytes_peak"], want.timing["kv_bytes_peak"]
    assert paged <= 0.5 * own, (paged, own)
    assert got.timing["kv_bytes_held_peak"] <= paged
    # Grown at least once, and a second request compiles nothing more.
    compiles = engine.num_compiles
    engine.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    assert engine.num_compiles == compiles

  def test_recompute_in_flight_rewrites_the_pages(self, params):
    """An in-flight update with the same weights and inflight_kv=recompute
    rewrites every live row's pages with what they held: a page written to
    the wrong row or slot would change the greedy tokens."""
    cfg = base.SamplingConfig(n=2, greedy=True, max_new_tokens=30)
    plain = _engine(params, kv_page_size=4).generate(PROMPTS, cfg)
    updates = iter([(params, 1), (params, 2), (params, 3)])
    engine = _engine(params, kv_page_size=4, inflight_kv="recompute")
    batch = engine.generate(
      PROMPTS, cfg, weight_updates=lambda: next(updates, None)
    )
    assert batch.response_ids == plain.response_ids
    for x, y in zip(batch.behav_logp, plain.behav_logp):
      np.testing.assert_allclose(x, y, atol=1e-4)
    assert engine.last_stats["weight_swaps"] == 3


class TestErrors:
  @pytest.mark.parametrize("value", [-1, 1.5, True, "16"])
  def test_bad_page_size(self, params, value):
    with pytest.raises(ValueError, match=f"kv_page_size={value!r}"):
      _engine(params, kv_page_size=value)

  def test_trainer_flag_needs_continuous_batching(self):
    with pytest.raises(ValueError, match="kv_page_size=16; expected 0"):
      config_lib.resolve("grpo", {"rollout.kv_page_size": 16})
    cfg = config_lib.resolve(
      "grpo", {"rollout.kv_page_size": 16, "rollout.batching": "continuous"}
    )
    assert cfg.rollout.kv_page_size == 16
