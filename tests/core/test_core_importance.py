"""Tests of rljax.core.importance: the behaviour-correction weights, clip
scales and keep-masks of every correction, token and sequence level."""

import functools

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

from rljax.core import importance
from rljax.core.objectives import PolicyLossConfig


class ImportanceWeightsTest(chex.TestCase):
  # ρ = [0.5, 1, 3, 10], C = 2; the last token is padding.
  rho = np.array([[0.5, 1.0, 3.0, 10.0]], np.float32)
  mask = np.array([[True, True, True, False]])

  def _weights(self, correction, cap=2.0):
    prox = jnp.log(jnp.asarray(self.rho)) - 1.0
    behav = jnp.full_like(prox, -1.0)
    fn = self.variant(
      functools.partial(
        importance.importance_weights, correction=correction, cap=cap
      )
    )
    return fn(prox, behav, self.mask)

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    expected = {
      "naive": ([1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]),
      "ignore_behavior": ([1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]),
      "decoupled": ([0.5, 1, 3, 0], [1, 1, 1, 1], [1, 1, 1, 0]),
      "tis": ([0.5, 1, 2, 0], [1, 1, 1, 1], [1, 1, 1, 0]),
      "acr": ([0.5, 1, 2, 0], [1, 1, 1.5, 1], [1, 1, 1, 0]),
      "mis": ([0.5, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]),
    }
    for correction, (weight, scale, keep) in expected.items():
      iw = self._weights(correction)
      np.testing.assert_allclose(
        iw.weight[0], weight, rtol=1e-5, err_msg=correction
      )
      np.testing.assert_allclose(
        iw.upper_scale[0, :3], scale[:3], rtol=1e-5, err_msg=correction
      )
      np.testing.assert_array_equal(
        iw.keep[0], np.array(keep, bool), err_msg=correction
      )

  @chex.variants(with_jit=True, without_jit=True)
  def test_extreme_log_ratios_finite(self):
    prox = jnp.array([[1e4, -1e4, 0.0]])
    behav = jnp.array([[-1e4, 1e4, 0.0]])
    for correction in importance.CORRECTIONS:
      fn = self.variant(
        functools.partial(
          importance.importance_weights, correction=correction, cap=2.0
        )
      )
      iw = fn(prox, behav, jnp.ones((1, 3), bool))
      chex.assert_tree_all_finite(iw)

  # Three sequences, three tokens (row 1's last token is padding):
  #   ρ row 0 = [2, 2, .5]  → ρ(y) = 2,   geometric mean 2^(1/3) ≈ 1.26
  #   ρ row 1 = [4, 2, pad] → ρ(y) = 8,   geometric mean √8 ≈ 2.83
  #   ρ row 2 = [.1, 1, 1]  → ρ(y) = .1,  geometric mean .1^(1/3) ≈ .464
  seq_rho = np.array(
    [[2.0, 2.0, 0.5], [4.0, 2.0, 7.0], [0.1, 1.0, 1.0]], np.float32
  )
  seq_mask = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]], bool)

  def _seq_weights(self, correction, cap, veto=None):
    prox = jnp.log(jnp.asarray(self.seq_rho)) - 2.0
    behav = jnp.full_like(prox, -2.0)
    fn = self.variant(
      functools.partial(
        importance.importance_weights,
        correction=correction,
        cap=cap,
        veto_threshold=veto,
      )
    )
    return fn(prox, behav, self.seq_mask)

  @chex.variants(with_jit=True, without_jit=True)
  def test_sequence_level_hand_computed(self):
    expected = {
      # w = min(ρ(y), C) on every valid token, nothing rejected.
      ("seq_tis", 3.0): (
        [[2, 2, 2], [3, 3, 0], [0.1, 0.1, 0.1]],
        [[1, 1, 1], [1, 1, 0], [1, 1, 1]],
      ),
      # ρ(y) ∈ [1/3, 3] only for row 0: rows 1 (8) and 2 (.1) rejected.
      ("seq_mis", 3.0): (
        [[2, 2, 2], [0, 0, 0], [0, 0, 0]],
        [[1, 1, 1], [0, 0, 0], [0, 0, 0]],
      ),
      # Geometric mean in [1/1.5, 1.5] only for row 0; no reweighting.
      ("geo_rs", 1.5): (
        [[1, 1, 1], [0, 0, 0], [0, 0, 0]],
        [[1, 1, 1], [0, 0, 0], [0, 0, 0]],
      ),
      # With C = 3 row 2 (.464 ≥ 1/3) and row 1 (2.83 ≤ 3) pass too.
      ("geo_rs", 3.0): (
        [[1, 1, 1], [1, 1, 0], [1, 1, 1]],
        [[1, 1, 1], [1, 1, 0], [1, 1, 1]],
      ),
    }
    for (correction, cap), (weight, keep) in expected.items():
      iw = self._seq_weights(correction, cap)
      msg = f"{correction} C={cap}"
      np.testing.assert_allclose(iw.weight, weight, rtol=1e-5, err_msg=msg)
      np.testing.assert_array_equal(iw.keep, np.array(keep, bool), err_msg=msg)
      np.testing.assert_array_equal(
        iw.upper_scale, np.ones((3, 3)), err_msg=msg
      )

  @chex.variants(with_jit=True, without_jit=True)
  def test_veto_rejects_sequences_with_a_low_token_ratio(self):
    # τ = .2: row 2 holds ρ = .1 < τ and goes whole; padding (row 1's ρ = 7)
    # never vetoes. Combined with token-level tis, C = 3.
    iw = self._seq_weights("tis", 3.0, veto=0.2)
    np.testing.assert_allclose(
      iw.weight, [[2, 2, 0.5], [3, 2, 0], [0, 0, 0]], rtol=1e-5
    )
    np.testing.assert_array_equal(iw.keep, [[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    iw = self._seq_weights("seq_tis", 3.0, veto=0.05)  # no token below .05
    np.testing.assert_array_equal(iw.keep, self.seq_mask)

  def test_sequence_ratio_is_a_log_space_product(self):
    # 400 tokens of ρ = e^0.2: ρ(y) = e^80 overflows f32 as a product; in log
    # space seq_tis gives exactly C and seq_mis rejects, with no inf/NaN.
    prox = jnp.full((1, 400), -1.0)
    behav = prox - 0.2
    mask = jnp.ones((1, 400), bool)
    tis = importance.importance_weights(prox, behav, mask, "seq_tis", cap=2.0)
    np.testing.assert_allclose(tis.weight, 2.0, rtol=1e-6)
    mis = importance.importance_weights(prox, behav, mask, "seq_mis", cap=2.0)
    self.assertFalse(bool(mis.keep.any()))
    geo = importance.importance_weights(prox, behav, mask, "geo_rs", cap=1.3)
    self.assertTrue(bool(geo.keep.all()))  # e^0.2 ≈ 1.22 per token ≤ 1.3

  def test_bad_veto(self):
    with pytest.raises(ValueError, match="veto_threshold"):
      importance.importance_weights(
        jnp.zeros((1, 2)),
        jnp.zeros((1, 2)),
        jnp.ones((1, 2)),
        "tis",
        veto_threshold=1.5,
      )
    with pytest.raises(ValueError, match="veto_threshold"):
      PolicyLossConfig(veto_threshold=0.0)

  def test_bad_correction(self):
    with pytest.raises(ValueError, match="correction='x'"):
      importance.importance_weights(
        jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2)), "x"
      )


if __name__ == "__main__":
  absltest.main()
