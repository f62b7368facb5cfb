"""Continuous batching in the JAX sampler (`slot_program`, `slot_plan`,
`slot_scheduler`): the same samples as the static program, refills, a cache
that follows the live rows, bounded compiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import decoder as decoder_lib
from rljax.models import layers as layers_lib
from rljax.rollout import base, slot_plan, slot_program
from rljax.rollout.jax_sampler import JaxSampler

_CONFIG = models.tiny_config(vocab_size=128)
# More prompts than slot groups (refills), lengths over two prompt columns.
PROMPTS = [[5, 17, 3], [9], [4, 8, 15, 16, 23, 42, 7], [11, 12], [1, 2, 3], [6]]


@pytest.fixture(scope="module")
def params():
  """Sharp next-token distributions (no near-ties for float noise to flip),
  as tests/rollout/test_jax_sampler.py's tiny model."""
  p = models.init_params(_CONFIG, jax.random.key(0))
  p = jax.tree_util.tree_map(lambda x: x * 10.0, p)
  for norm in ("attn_norm", "mlp_norm"):
    p["layers"][norm]["scale"] = jnp.ones_like(p["layers"][norm]["scale"])
  p["final_norm"]["scale"] = jnp.ones_like(p["final_norm"]["scale"])
  return p


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
  assert a.response_ids == b.response_ids
  assert a.finish_reason == b.finish_reason
  for x, y in zip(a.behav_logp, b.behav_logp):
    np.testing.assert_allclose(x, y, atol=1e-5)


class TestSameSamplesAsStatic:
  def test_greedy_tokens_and_logp_with_stops(self, params):
    static, slots = _pair(params)
    cfg = base.SamplingConfig(
      n=2, greedy=True, max_new_tokens=40, stop_token_ids=(3, 5, 9)
    )
    a, b = static.generate(PROMPTS, cfg), slots.generate(PROMPTS, cfg)
    _assert_same(a, b)
    assert {"stop", "length"} <= set(b.finish_reason)
    # 6 prompts through 2 groups: refilled between chunks.
    assert b.timing["prefills"] >= 3
    assert b.timing["tokens"] == sum(len(r) for r in b.response_ids)

  def test_seeded_sampling_is_reproducible_and_static_equal(self, params):
    static, slots = _pair(params)
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
    # 70 tokens: the own cache grew past its first 64 slots.
    assert b1.timing["capacity_peak"] == 128


class TestGroupWidth:
  def test_single_row_groups_sample_as_static(self, params):
    static, slots = _pair(params, group_width=1)
    cfg = base.SamplingConfig(
      n=2, temperature=1.0, max_new_tokens=20, stop_token_ids=(3,), seed=5
    )
    batch = slots.generate(PROMPTS, cfg)
    _assert_same(static.generate(PROMPTS, cfg), batch)
    # 12 samples, one a group, 4 slots: refilled a sample at a time.
    assert batch.timing["slots"] == 4
    assert batch.timing["prefills"] >= 3

  def test_width_must_divide_n(self, params):
    _, slots = _pair(params, group_width=2)
    with pytest.raises(ValueError, match="group_width=2"):
      slots.generate(PROMPTS, base.SamplingConfig(n=3, max_new_tokens=2))


class TestPerSampleLimits:
  def test_each_sample_stops_at_its_limit_in_both_engines(self, params):
    static, slots = _pair(params)
    cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=12, seed=2)
    limits = [1, 12, 5, 3, 12, 7, 2, 9, 4, 4, 11, 6]
    a = static.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    b = slots.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    assert [len(r) for r in b.response_ids] == limits
    _assert_same(a, b)
    with pytest.raises(ValueError, match="max_new_tokens_per_sample"):
      slots.generate(PROMPTS, cfg, max_new_tokens_per_sample=[13] * 12)


class TestCompiles:
  def test_bounded_over_many_requests(self, params):
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
    for seed in range(3):
      sampler.generate(
        PROMPTS[seed:] + PROMPTS[:seed],
        base.SamplingConfig(**{**cfg.__dict__, "seed": seed}),
      )
    assert sampler.num_compiles == warm


class TestSlotPrograms:
  def test_prefill_sizes_and_capacities(self):
    assert slot_plan.prefill_sizes(8) == (2, 4, 8)
    assert slot_plan.prefill_sizes(1) == (1,)
    assert slot_program.cache_capacity(1, 512) == 64
    assert slot_program.cache_capacity(65, 512) == 128
    assert slot_program.cache_capacity(600, 512) == 512
    assert slot_program.cache_capacity(5, 16) == 16
    assert slot_plan.capacities(320) == (64, 128, 256, 320)

  def test_decode_step_equals_decode_with_prefix_cache(self, params):
    """Per-row write slots that happen to agree: the decoder's step."""
    rows, groups, lp, slots = 4, 2, 8, 16
    rng = np.random.default_rng(0)
    cache = models.init_decode_cache(_CONFIG, rows, slots)
    cache = jax.tree.map(
      lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), cache
    )
    prefix = models.init_cache(_CONFIG, groups, lp)
    prefix = jax.tree.map(
      lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), prefix
    )
    prefix = decoder_lib.to_prefix_cache(prefix)
    prefix_mask = jnp.asarray(rng.random((groups, lp)) > 0.3)
    tokens = jnp.asarray(rng.integers(0, 128, (rows, 1)), jnp.int32)
    positions = jnp.full((rows, 1), 12, jnp.int32)
    write = 5
    kv_mask = jnp.ones((rows, slots), jnp.int32)
    # Jitted: op-by-op dispatch of the unrolled layers is slower than a
    # compile.
    want, want_cache = jax.jit(
      decoder_lib.decode_with_prefix_cache, static_argnums=(0,)
    )(
      _CONFIG,
      params,
      tokens,
      positions,
      prefix,
      prefix_mask,
      cache,
      write,
      kv_mask,
    )
    decode_params = {
      **params,
      "layers": decoder_lib.unstack_layers(params["layers"]),
    }
    step = jax.jit(slot_program.decode_step, static_argnums=(0,))
    got, got_cache = step(
      _CONFIG,
      decode_params,
      tokens,
      positions,
      prefix,
      prefix_mask,
      cache,
      jnp.full((rows,), write, jnp.int32),
      rope_table=layers_lib.rope_table(_CONFIG, 32),
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(jax.tree.leaves(got_cache), jax.tree.leaves(want_cache)):
      np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


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
