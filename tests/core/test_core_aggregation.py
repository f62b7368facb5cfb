"""Tests of rljax.core.aggregation: loss modes and micro-batch exactness."""

import functools

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from rljax.core import aggregation

LOSS = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)  # last row empty


class AggregateTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(
    # Valid tokens: row 0 → 1, 2; row 1 → 4; row 2 none (not a sequence).
    ("token-mean", None, 7.0, 3.0),
    ("seq-mean-token-mean", None, 1.5 + 4.0, 2.0),
    ("seq-mean-token-sum", None, 3.0 + 4.0, 2.0),
    ("seq-mean-token-sum-norm", 4.0, (3.0 + 4.0) / 4.0, 2.0),
    ("seq-mean-token-sum-norm", None, (3.0 + 4.0) / 3.0, 2.0),  # default: T = 3
  )
  def test_hand_computed(self, mode, norm_const, total, denominator):
    fn = self.variant(
      functools.partial(aggregation.aggregate, mode=mode, norm_const=norm_const)
    )
    got_total, got_denominator = fn(LOSS, MASK)
    self.assertAlmostEqual(float(got_total), total, places=5)
    self.assertAlmostEqual(float(got_denominator), denominator, places=6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_nan_at_padding_ignored_in_value_and_grad(self):
    loss = jnp.where(MASK, LOSS, jnp.nan)
    for mode in aggregation.AGGREGATION_MODES:
      fn = self.variant(
        lambda x, m=mode: aggregation.aggregate_mean(x, MASK, m)
      )
      value, grad = jax.value_and_grad(fn)(loss)
      chex.assert_tree_all_finite((value, grad))
      np.testing.assert_array_equal(np.asarray(grad)[~np.asarray(MASK)], 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_empty_mask_gives_zero_loss_and_grad(self):
    for mode in aggregation.AGGREGATION_MODES:
      fn = self.variant(
        lambda x, m=mode: aggregation.aggregate_mean(
          x, jnp.zeros((3, 3), bool), m
        )
      )
      value, grad = jax.value_and_grad(fn)(LOSS)
      self.assertEqual(float(value), 0.0)
      np.testing.assert_array_equal(grad, np.zeros((3, 3)))

  @hypothesis.given(
    batch=st.integers(1, 5),
    time=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    cuts=st.lists(st.integers(0, 5), max_size=3),
  )
  @hypothesis.settings(max_examples=20, deadline=None, derandomize=True)
  def test_micro_batch_accumulation_is_exact(self, batch, time, seed, cuts):
    rng = np.random.default_rng(seed)
    loss = rng.normal(size=(batch, time)).astype(np.float32)
    mask = rng.random((batch, time)) < rng.random()
    bounds = sorted({0, batch, *(min(c, batch) for c in cuts)})
    for mode in aggregation.AGGREGATION_MODES:
      full = aggregation.aggregate_mean(loss, mask, mode, norm_const=7.0)
      parts = [
        aggregation.aggregate(loss[a:b], mask[a:b], mode, norm_const=7.0)
        for a, b in zip(bounds[:-1], bounds[1:])
      ]
      total = sum(float(p[0]) for p in parts)
      denominator = sum(float(p[1]) for p in parts)
      np.testing.assert_allclose(
        aggregation.finalize(total, denominator),
        full,
        rtol=1e-5,
        atol=1e-6,
        err_msg=mode,
      )

  def test_bad_inputs(self):
    with pytest.raises(ValueError, match="aggregation='mean'.*'token-mean'"):
      aggregation.aggregate(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match="mask has shape"):
      aggregation.aggregate(LOSS, MASK[:, :2])
    with pytest.raises(ValueError, match="norm_const"):
      aggregation.aggregate(
        LOSS, MASK, "seq-mean-token-sum-norm", norm_const=-1.0
      )
    with pytest.raises(ValueError, match="per_token_loss must have rank 2"):
      aggregation.aggregate(LOSS[0], MASK[0])
    with pytest.raises(TypeError, match="per_token_loss must be a floating"):
      aggregation.aggregate(jnp.ones((2, 2), jnp.int32), jnp.ones((2, 2)))


class FinalizeTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_values(self):
    fn = self.variant(aggregation.finalize)
    self.assertAlmostEqual(float(fn(6.0, 4.0)), 1.5)
    self.assertEqual(float(fn(0.0, 0.0)), 0.0)
    grad = jax.grad(fn)(jnp.float32(3.0), jnp.float32(0.0))
    self.assertEqual(float(grad), 0.0)


class MaskedMeanTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_values(self):
    fn = self.variant(aggregation.masked_mean)
    self.assertAlmostEqual(float(fn(LOSS, MASK)), 7.0 / 3.0, places=6)
    self.assertEqual(float(fn(LOSS, jnp.zeros_like(MASK))), 0.0)


if __name__ == "__main__":
  absltest.main()
