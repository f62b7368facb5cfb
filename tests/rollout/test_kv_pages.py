"""The page pool of continuous batching (`kv_pages`, `kv_page_size`): the
page book, the token and block writes in the pool's layout, the same
samples at every page size, and a pool that is allocated once."""

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


class TestPageBook:
  def test_hold_release_and_table(self):
    book = kv_pages.PageBook(pages=6, page_size=4)
    book.hold("a", 5)  # 2 pages
    book.hold("b", 4)  # 1 page
    assert book.used == 3 and book.used_peak == 3
    table = book.table(["a", None, "b"], 3)
    np.testing.assert_array_equal(table[1], [6, 6, 6])  # no owner: N
    assert table[0, 2] == 6 and len(set(table[0, :2]) | {table[2, 0]}) == 3
    first = list(table[0, :2])
    book.hold("a", 9)  # grows to 3 pages, keeps the first two
    assert book.held("a")[:2] == first and book.used == 4
    book.release("a")
    assert book.used == 1 and book.used_peak == 4 and book.held("a") == []

  def test_a_left_padded_span_holds_no_leading_pages(self):
    book = kv_pages.PageBook(pages=8, page_size=4)
    pages = book.hold_span("prompt", 5, 16)  # slots 5..15: pages 1..3
    assert pages[0] == 8 and len(pages) == 4 and book.used == 3
    book.release("prompt")
    assert book.used == 0

  def test_the_pool_never_grows(self):
    book = kv_pages.PageBook(pages=2, page_size=4)
    with pytest.raises(ValueError, match="3 pages wanted, 2 free"):
      book.hold("a", 12)
    assert kv_pages.pool_pages(4, 64, 4, 32, 16) == 4 * 4 + 4 * 2
    assert kv_pages.pages_for(17, 16) == 2 and kv_pages.pages_for(0, 16) == 0


class TestLayout:
  def test_tokens_land_at_their_slots(self):
    """Token t of row b, written at own slot start_b + t through the table,
    sits at slot (start_b + t) % P of page table[b, (start_b + t) // P];
    tokens past `count`, past the table and into holes are dropped."""
    hkv, hd, p = 1, 2, 2
    pool_k = jnp.zeros((6, hkv, hd, p))
    pool_v = jnp.zeros((6, hkv, p, hd))
    table = jnp.array([[3, 0, 6], [1, 4, 2]], jnp.int32)  # 6: a hole
    k = jnp.array(
      [[[[10 * b + t, -(10 * b + t)]] for t in range(3)] for b in range(2)],
      jnp.float32,
    )  # [B=2, T=3, Hkv, hd]
    pool_k, pool_v = kv_pages.write_tokens(
      pool_k,
      pool_v,
      k,
      2 * k,
      table,
      jnp.array([3, 1], jnp.int32),
      jnp.array([3, 2], jnp.int32),
    )
    # Row 0: slots 3, 4, 5: page 0 slot 1, then page 6 (a hole): dropped.
    np.testing.assert_array_equal(pool_k[0, 0, :, 1], [0, 0])
    assert float(jnp.abs(pool_k[3]).max()) == 0.0
    # Row 1: slots 1, 2 (count 2): page 1 slot 1, page 4 slot 0.
    np.testing.assert_array_equal(pool_k[1, 0, :, 1], [10, -10])
    np.testing.assert_array_equal(pool_v[4, 0, 0], [22, -22])
    assert float(jnp.abs(pool_k[2]).max()) == 0.0  # its third token: count

  def test_blocks_are_whole_pages(self):
    rng = np.random.default_rng(0)
    k = jnp.asarray(rng.normal(size=(2, 8, 3, 5)), jnp.float32)  # Lp = 2 P
    v = 2 * k
    pool_k, pool_v = kv_pages.write_blocks(
      jnp.zeros((5, 3, 5, 4)),
      jnp.zeros((5, 3, 4, 5)),
      k,
      v,
      jnp.array([[2, 5], [0, 4]], jnp.int32),  # 5: not written
    )
    np.testing.assert_array_equal(pool_k[2], k[0, :4].transpose(1, 2, 0))
    np.testing.assert_array_equal(pool_v[4], v[1, 4:].transpose(1, 0, 2))
    assert float(jnp.abs(pool_k[1]).max()) == 0.0


class TestSamePagesAnySize:
  def test_greedy_with_stops(self, params):
    """Pages of 8 (the native kernel's smallest for this head size) and of
    16: the same tokens and log-probs."""
    cfg = base.SamplingConfig(
      n=2, greedy=True, max_new_tokens=40, stop_token_ids=(3, 5, 9)
    )
    want = _engine(params, kv_page_size=16).generate(PROMPTS, cfg)
    got = _engine(params, kv_page_size=8).generate(PROMPTS, cfg)
    assert got.response_ids == want.response_ids
    for x, y in zip(got.behav_logp, want.behav_logp):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    assert {"stop", "length"} <= set(got.finish_reason)
    assert got.timing["page_size"] == 8

  def test_the_pool_holds_every_row_at_its_limit_and_rows_hold_less(
    self, params
  ):
    """A long-tailed rollout (two of twelve samples at 200 tokens): the
    pool is sized once for 4 rows of 256 slots and 4 prompt entries; the
    pages the rows held at their most stay well under it."""
    cfg = base.SamplingConfig(
      n=2, temperature=1.0, max_new_tokens=200, stop_token_ids=(3,), seed=3
    )
    limits = [200 if i % 5 == 0 else 9 + 3 * i for i in range(12)]
    engine = _engine(params)
    got = engine.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    assert [len(r) for r in got.response_ids] <= limits
    per_token = (
      2 * _CONFIG.num_layers * _CONFIG.num_kv_heads * _CONFIG.head_dim * 4
    )
    assert got.timing["kv_bytes_peak"] == per_token * (4 * 256 + 4 * 16)
    assert got.timing["kv_bytes_held_peak"] <= 0.6 * got.timing["kv_bytes_peak"]
    assert (
      got.timing["kv_bytes_written_peak"] <= got.timing["kv_bytes_held_peak"]
    )


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
