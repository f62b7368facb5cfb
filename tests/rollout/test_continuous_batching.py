"""Continuous batching in the JAX sampler (`slot_program`, `slot_plan`,
`slot_scheduler`): the same samples as the static program, refills, a
decode batch that shrinks to the live rows, longest-first admission that
leaves samples unchanged, bounded compiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import toy
from rljax.models import decoder as decoder_lib
from rljax.models import layers as layers_lib
from rljax.rollout import base
from rljax.rollout import kv_pages
from rljax.rollout import paged_attention as attention_lib
from rljax.rollout import slot_plan
from rljax.rollout import slot_program
from rljax.rollout.jax_sampler import JaxSampler

_CONFIG = models.tiny_config(vocab_size=128)
# More prompts than slot groups (refills), lengths over two prompt columns.
PROMPTS = [[5, 17, 3], [9], [4, 8, 15, 16, 23, 42, 7], [11, 12], [1, 2, 3], [6]]


@pytest.fixture(scope="module")
def params():
  """Sharp next-token distributions (no near-ties for float noise to flip),
  as tests/rollout/test_jax_sampler.py's tiny model."""
  return toy.sharp_params(_CONFIG, jax.random.key(0))


def _pair(params, **kw):
  static = JaxSampler(
    _CONFIG, params, max_prompt_len=16, max_batch=4, batching="static"
  )
  slots = JaxSampler(
    _CONFIG,
    params,
    max_prompt_len=16,
    batching="continuous",
    decode_slots=4,
    chunk_steps=8,
    **kw,
  )
  return static, slots


def _assert_same(a: base.RolloutBatch, b: base.RolloutBatch):
  """Same tokens; log-probs within float noise. The engines sum the same
  f32 terms in another order (the paged kernel's online softmax, matmuls
  at other batch sizes): ~1e-6 relative, and this sharp model's log-probs
  reach tens of nats, so rtol 1e-5 (plus atol 1e-5 near 0)."""
  assert a.response_ids == b.response_ids
  assert a.finish_reason == b.finish_reason
  for x, y in zip(a.behav_logp, b.behav_logp):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def engines(params):
  """One static and one continuous engine for the module (their programs
  compile once)."""
  return _pair(params)


class TestSameSamplesAsStatic:
  def test_greedy_tokens_and_logp_with_stops(self, engines):
    static, slots = engines
    cfg = base.SamplingConfig(
      n=2, greedy=True, max_new_tokens=40, stop_token_ids=(3, 5, 9)
    )
    a, b = static.generate(PROMPTS, cfg), slots.generate(PROMPTS, cfg)
    _assert_same(a, b)
    assert {"stop", "length"} <= set(b.finish_reason)
    # 6 prompts through 4 rows: prefilled as rows freed.
    assert b.timing["prefills"] >= 2
    assert b.timing["tokens"] == sum(len(r) for r in b.response_ids)

  def test_seeded_sampling_is_reproducible_and_static_equal(self, engines):
    static, slots = engines
    cfg = base.SamplingConfig(
      n=2, temperature=1.0, max_new_tokens=70, stop_token_ids=(3,), seed=3
    )
    b1 = slots.generate(PROMPTS, cfg)
    b2 = slots.generate(PROMPTS, cfg)
    assert b1.response_ids == b2.response_ids
    for x, y in zip(b1.behav_logp, b2.behav_logp):
      np.testing.assert_array_equal(x, y)
    # Keys depend on (seed, prompt, sample, t) only: the static engine
    # draws the same tokens.
    _assert_same(static.generate(PROMPTS, cfg), b1)
    assert b1.timing["capacity_peak"] == 70

  def test_xla_attention_samples_as_the_kernel(
    self, params, engines, monkeypatch
  ):
    """The engine on the XLA reference attention (any backend, no
    compiler): the same tokens and log-probs as on the kernel."""
    monkeypatch.setenv("RLJAX_PAGED_ATTENTION", "xla")
    _, slots = _pair(params)
    cfg = base.SamplingConfig(
      n=2, temperature=1.0, max_new_tokens=30, stop_token_ids=(3,), seed=4
    )
    got = slots.generate(PROMPTS, cfg)
    assert got.timing["attention"] == "xla"
    monkeypatch.delenv("RLJAX_PAGED_ATTENTION")
    _assert_same(engines[1].generate(PROMPTS, cfg), got)


class TestShrinkingBatch:
  def test_rows_leave_the_batch_as_they_end(self, engines):
    """Per-sample limits 1..12: as rows end, the chunks run in smaller row
    buckets (the live rows only), and the decode batch pays for fewer rows
    than the slots would."""
    _, slots = engines
    cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=12, seed=2)
    limits = [1, 12, 5, 3, 12, 7, 2, 9, 4, 4, 11, 6]
    batch = slots.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    assert [len(r) for r in batch.response_ids] == limits
    buckets = slots.last_stats["bucket_steps"]
    assert set(buckets) - {4} and min(buckets) < 4, buckets
    timing = batch.timing
    assert timing["slot_steps"] < 4 * timing["decode_steps"]
    assert timing["occupancy"] > 0.5

  def test_each_sample_stops_at_its_limit_in_both_engines(self, engines):
    static, slots = engines
    cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=12, seed=2)
    limits = [1, 12, 5, 3, 12, 7, 2, 9, 4, 4, 11, 6]
    a = static.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    b = slots.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    assert [len(r) for r in b.response_ids] == limits
    _assert_same(a, b)
    with pytest.raises(ValueError, match="max_new_tokens_per_sample"):
      slots.generate(PROMPTS, cfg, max_new_tokens_per_sample=[13] * 12)


class TestAdmissionOrder:
  def test_longest_expected_first_samples_the_same(self, engines):
    """Expected lengths (the trainer's running means) reorder admission,
    longest first; every sample keeps its tokens (its key is its own)."""
    _, slots = engines
    cfg = base.SamplingConfig(
      n=2, temperature=1.0, max_new_tokens=40, stop_token_ids=(3,), seed=7
    )
    plain = slots.generate(PROMPTS, cfg)
    plain_order = slots.last_stats["admitted"]
    expected = [3.0, 50.0, None, 9.0, 40.0, 1.0]
    ordered = slots.generate(PROMPTS, cfg, expected_lengths=expected)
    _assert_same(plain, ordered)
    order = slots.last_stats["admitted"]
    assert plain_order == sorted(plain_order)
    # Unknown (None) counts as max_new_tokens; ties keep request order.
    want = [min(40.0, e or 40.0) for e in expected]
    got = [want[r // 2] for r in order]
    assert got == sorted(got, reverse=True), order
    assert order[:2] == [2, 3] and order != plain_order
    with pytest.raises(ValueError, match="expected_lengths"):
      slots.generate(PROMPTS, cfg, expected_lengths=[1.0])

  def test_per_sample_limits_order_the_rows(self, engines):
    _, slots = engines
    cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=12, seed=2)
    limits = [1, 12, 5, 3, 12, 7, 2, 9, 4, 4, 11, 6]
    slots.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    order = slots.last_stats["admitted"]
    got = [limits[r] for r in order]
    # The longest first; a row whose prompt a sibling's admission already
    # prefilled may join a free slot ahead of its turn (at no device cost);
    # the limit-1 row ends at its prefill and never joins.
    assert got[:3] == [12, 12, 11] and got[-1] <= 4 and 1 not in got, got


class TestCompiles:
  def test_a_second_request_compiles_nothing(self, params):
    sampler = JaxSampler(
      _CONFIG,
      params,
      max_prompt_len=16,
      batching="continuous",
      decode_slots=4,
      chunk_steps=8,
    )
    cfg = base.SamplingConfig(
      n=2, temperature=1.0, max_new_tokens=20, stop_token_ids=(3,)
    )
    assert sampler.warmup(PROMPTS, cfg) > 0
    warm = sampler.num_compiles
    sampler.generate(PROMPTS, cfg)
    # Warm-up compiled every row bucket and prefill size: the requests'
    # programs are all among them, whatever their rows do; and XLA compiles
    # nothing for a request of the same shapes.
    compiled = []

    def note(event, seconds, **kwargs):
      del seconds, kwargs
      if event == "/jax/core/compile/backend_compile_duration":
        compiled.append(event)

    jax.monitoring.register_event_duration_secs_listener(note)
    try:
      for seed in range(1, 3):
        sampler.generate(
          PROMPTS[seed:] + PROMPTS[:seed],
          base.SamplingConfig(**{**cfg.__dict__, "seed": seed}),
        )
        assert sampler.num_compiles == warm
    finally:
      jax.monitoring.unregister_event_duration_listener(note)
    assert not compiled


class TestSlotPrograms:
  def test_buckets_and_prefill_sizes(self):
    assert slot_program.row_buckets(32) == (4, 8, 16, 32)
    assert slot_program.row_buckets(24) == (4, 8, 16, 24)
    assert slot_program.row_buckets(4) == (1, 2, 4)
    assert slot_program.bucket_for(1, 32) == 4
    assert slot_program.bucket_for(9, 24) == 16
    assert slot_program.bucket_for(17, 24) == 24
    assert slot_plan.prefill_sizes(1) == (1,)
    assert slot_plan.prefill_sizes(5) == (1, 2, 4, 8)
    assert slot_plan.page_aligned(20, 16) == 32

  def test_decode_step_equals_decode_with_prefix_cache(self, params):
    """Rows of two prompts over pages: the decoder's shared-prefix step
    over the same keys (prompt pages shared by each prompt's rows, own
    pages per row)."""
    rows, groups, lp, slots, page = 4, 2, 16, 16, 8
    rng = np.random.default_rng(0)
    cache = models.init_decode_cache(_CONFIG, rows, slots)
    cache = jax.tree.map(
      lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), cache
    )
    prefix = models.init_cache(_CONFIG, groups, lp)
    prefix = jax.tree.map(
      lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), prefix
    )
    prefix_mask = np.zeros((groups, lp), bool)
    prefix_mask[0, 5:] = prefix_mask[1, 9:] = True  # left-padded prompts
    tokens = jnp.asarray(rng.integers(0, 128, (rows, 1)), jnp.int32)
    positions = jnp.full((rows, 1), 12, jnp.int32)
    write = 5
    kv_mask = jnp.ones((rows, slots), jnp.int32)
    want, _ = jax.jit(
      decoder_lib.decode_with_prefix_cache, static_argnums=(0,)
    )(
      _CONFIG,
      params,
      tokens,
      positions,
      decoder_lib.to_prefix_cache(prefix),
      jnp.asarray(prefix_mask),
      cache,
      write,
      kv_mask,
    )
    # The same keys in pages: prompt g in pages 2g, 2g + 1; row b's own
    # slots in pages 4 + 2b, 5 + 2b.
    pool = models.init_decode_cache(_CONFIG, 12, page)
    layers = []
    for i in range(_CONFIG.num_layers):
      pk, pv = kv_pages.write_blocks(
        pool["k"][i],
        pool["v"][i],
        prefix["k"][i],
        prefix["v"][i],
        jnp.arange(4, dtype=jnp.int32).reshape(2, 2),
      )
      own_k = jnp.transpose(cache["k"][i], (0, 3, 1, 2))  # [B, S, Hkv, hd]
      own_v = jnp.transpose(cache["v"][i], (0, 2, 1, 3))
      pk, pv = kv_pages.write_blocks(
        pk, pv, own_k, own_v, 4 + jnp.arange(8, dtype=jnp.int32).reshape(4, 2)
      )
      layers.append((pk, pv))
    pool = {"k": tuple(k for k, _ in layers), "v": tuple(v for _, v in layers)}
    decode_params = {
      **params,
      "layers": decoder_lib.unstack_layers(params["layers"]),
    }
    prefix_pages = attention_lib.Prefix(
      jnp.arange(4, dtype=jnp.int32).reshape(2, 2),
      jnp.array([5, 9], jnp.int32),
      jnp.array([lp, lp], jnp.int32),
    )
    step = jax.jit(
      slot_program.decode_step, static_argnums=(0,), static_argnames="attention"
    )
    got, _ = step(
      _CONFIG,
      decode_params,
      pool,
      tokens[:, 0],
      positions[:, 0],
      jnp.full((rows,), write + 1, jnp.int32),
      4 + jnp.arange(8, dtype=jnp.int32).reshape(4, 2),
      prefix_pages,
      jnp.array([0, 0, 1, 1], jnp.int32),
      rope_table=layers_lib.rope_table(_CONFIG, 32),
      attention=attention_lib.choose(_CONFIG.head_dim, page, jnp.float32),
    )
    np.testing.assert_allclose(got, want[:, 0], rtol=1e-5, atol=1e-5)


class TestErrors:
  @pytest.mark.parametrize(
    "kw, field",
    [
      ({"batching": "paged"}, "batching"),
      ({"decode_slots": 0}, "decode_slots"),
      ({"chunk_steps": 1.5}, "chunk_steps"),
      ({"group_width": -2}, "group_width"),
    ],
  )
  def test_bad_settings_name_the_field(self, kw, field):
    with pytest.raises(ValueError, match=field):
      JaxSampler(_CONFIG, **kw)


class TestCachePrecision:
  def test_bf16_pool_logp_within_the_rounding_of_its_keys(self):
    """bf16 weights run with a bf16 pool (`paged_cache_dtype`): keys and
    values rounded once to bf16 (relative error <= 2^-9), every product and
    sum in f32. The behaviour log-probs stay within 2e-3 of the policy's
    own forward pass (f32 activations over unrounded keys), the bound the
    static engine's bf16 test argues (8e-4 here; an f32 pool: 2e-5); a
    pool read at the wrong slot or not widened exactly would move them by
    far more. Weights at their initial scale: the sharp model's 10x
    weights make attention logits 100x larger, and the rounding with them."""
    bf16 = jax.tree.map(
      lambda x: x.astype(jnp.bfloat16),
      models.init_params(_CONFIG, jax.random.key(0)),
    )
    engine = JaxSampler(
      _CONFIG,
      bf16,
      max_prompt_len=16,
      batching="continuous",
      decode_slots=4,
      chunk_steps=8,
    )
    batch = engine.generate(
      PROMPTS, base.SamplingConfig(n=2, max_new_tokens=12, seed=3)
    )
    assert engine._slot_plan(PROMPTS, base.SamplingConfig(n=2)).cache_dtype == (
      jnp.bfloat16
    )
    packed = batch.pack()
    logits = models.forward(
      _CONFIG,
      bf16,
      jnp.asarray(packed["tokens"]),
      jnp.asarray(packed["attention_mask"]),
      activation_dtype=jnp.float32,
    )
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    ref = np.take_along_axis(
      np.asarray(logp), packed["tokens"][:, 1:, None], axis=-1
    )[..., 0]
    mask = packed["response_mask"] > 0
    np.testing.assert_allclose(packed["behav_logp"][mask], ref[mask], atol=2e-3)
