"""The JAX sampler's host-side planning (`request_plan`) and weight helpers
(`sampler_weights`), against hand-computed values; and that the names the
engine module had before its split still import from it."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.rollout import base, jax_sampler, request_plan, sampler_weights


def test_chunks_are_whole_prompt_groups_of_at_most_max_batch_rows():
  # n = 4, max_batch = 8: two prompts (8 rows) a chunk, the tail alone.
  assert request_plan.chunk_indices(5, 4, 8) == [[0, 1], [2, 3], [4]]
  # max_batch < n still takes one prompt a chunk.
  assert request_plan.chunk_indices(2, 8, 4) == [[0], [1]]


def test_bucket_for_picks_the_smallest_covering_bucket():
  assert request_plan.bucket_for((16, 32), 16) == 16
  assert request_plan.bucket_for((16, 32), 17) == 32
  with pytest.raises(ValueError, match="17 tokens exceeds the largest"):
    request_plan.bucket_for((16,), 17)


@pytest.mark.parametrize(
  "buckets,most,match",
  [
    ((32, 16), 32, "strictly increasing"),
    ((16,), 20, "largest prompt bucket 16 < max_prompt_len=20"),
    (None, 0, "max_prompt_len=0"),
  ],
)
def test_bad_prompt_buckets_are_refused(buckets, most, match):
  with pytest.raises(ValueError, match=match):
    request_plan.check_prompt_buckets(buckets, most)


def test_static_chunk_left_pads_and_caps_each_row():
  sampling = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=8)
  chunk = request_plan.static_chunk(
    [[5, 6], [7], [8, 9, 10]],
    [10, 11, 12],
    sampling,
    prompt_len=4,
    max_batch=16,
    pad_id=0,
    cache_dtype=jnp.float32,
    activation_dtype=None,
    mesh=None,
    fuse_projections=False,
    max_steps=3,
    row_limits=np.array([1, 5, 2, 2, 9, 1]),
  )
  # 3 prompts pad to 4 (a power of two, under max_batch // n = 8).
  np.testing.assert_array_equal(
    chunk.tokens,
    [[0, 0, 5, 6], [0, 0, 0, 7], [0, 8, 9, 10], [0, 0, 0, 0]],
  )
  np.testing.assert_array_equal(
    chunk.mask,
    [[0, 0, 1, 1], [0, 0, 0, 1], [0, 1, 1, 1], [0, 0, 0, 0]],
  )
  np.testing.assert_array_equal(
    chunk.row_prompt, [10, 10, 11, 11, 12, 12, 0, 0]
  )
  np.testing.assert_array_equal(chunk.row_sample, [0, 1] * 4)
  # The loop bound is min(max_steps, max_new_tokens) = 3; each row's cap is
  # its own limit under it, the padding rows the bound.
  assert chunk.limit == 3
  np.testing.assert_array_equal(chunk.limits, [1, 3, 2, 2, 3, 1, 3, 3])
  assert chunk.stop_ids == (-1,)  # no stop id: one that never matches
  assert chunk.plan.num_prompts == 4 and chunk.plan.num_stop_ids == 1
  assert chunk.plan.new_token_capacity == 16


def test_static_kv_bytes_counts_prefix_once_and_own_slots_per_row():
  config = models.tiny_config()
  config = dataclasses.replace(config, num_layers=2, num_kv_heads=1, head_dim=4)
  sampling = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=16)
  chunk = request_plan.static_chunk(
    [[1], [2]],
    [0, 1],
    sampling,
    prompt_len=16,
    max_batch=16,
    pad_id=0,
    cache_dtype=jnp.float32,
    activation_dtype=None,
    mesh=None,
    fuse_projections=False,
  )
  # k and v x 2 layers x 1 head x 4 dims x 4 bytes = 64 bytes a token;
  # 2 prompts x 16 prefix tokens + 4 rows x 16 own slots = 96 tokens.
  assert request_plan.static_kv_bytes(config, chunk.plan, 5) == 64 * 96


def test_slot_groups_are_a_power_of_two_capped_by_the_slots():
  assert request_plan.slot_groups(3, 4, None, 256) == (4, 4)
  assert request_plan.slot_groups(3, 4, 2, 256) == (2, 8)  # 6 units -> 8
  assert request_plan.slot_groups(3, 4, None, 8) == (4, 2)
  assert request_plan.slot_groups(1, 4, None, 2) == (4, 1)  # at least one
  with pytest.raises(ValueError, match="group_width=3 does not divide"):
    request_plan.slot_groups(3, 4, 3, 256)


def test_row_limits_are_checked_against_rows_and_max_new_tokens():
  assert request_plan.check_row_limits(None, 4, 8) is None
  out = request_plan.check_row_limits([1, 8, 2, 3], 4, 8)
  assert out.dtype == np.int64 and out.tolist() == [1, 8, 2, 3]
  for bad in ([1, 9, 2, 3], [1, 2, 3], [0, 1, 1, 1], [1.0, 2.0, 3.0, 4.0]):
    with pytest.raises(ValueError, match="max_new_tokens_per_sample"):
      request_plan.check_row_limits(bad, 4, 8)


def test_weight_helpers():
  assert sampler_weights.check_quant("f32", "here") == "none"
  with pytest.raises(ValueError, match="here: quant='int4'"):
    sampler_weights.check_quant("int4", "here")
  tree = {"a": jnp.zeros((2, 3), jnp.float32), "b": jnp.zeros(4, jnp.int8)}
  assert sampler_weights.tree_nbytes(tree) == 2 * 3 * 4 + 4
  assert sampler_weights.cache_dtype(jnp.float16, "none", None) == jnp.float16
  assert sampler_weights.cache_dtype(None, "none", None) == jnp.float32


def test_the_engine_module_still_exports_its_old_names():
  for name in (
    "JaxSampler",
    "QUANT_MODES",
    "BATCHING_MODES",
    "default_prompt_buckets",
    "rollout_config",
    "tree_nbytes",
    "sample_keys",
    "sample_next_token",
    "decode_segments",
    "new_token_capacity",
    "_TOP_P_FAST_K",
  ):
    assert hasattr(jax_sampler, name), name
  assert jax_sampler.QUANT_MODES == sampler_weights.QUANT_MODES
