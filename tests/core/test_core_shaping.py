"""Tests of rljax.core.shaping: DAPO overlong shaping, length penalty, filters."""

import functools

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

from rljax.core import advantages, shaping


class SoftOverlongPunishmentTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    fn = self.variant(
      functools.partial(
        shaping.soft_overlong_punishment, max_len=20, cache_len=4
      )
    )
    out = fn(jnp.array([10, 16, 17, 18, 20, 21, 100]))
    np.testing.assert_allclose(
      out, [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0], rtol=1e-6
    )

  def test_bad_lengths(self):
    with pytest.raises(ValueError, match="cache_len"):
      shaping.soft_overlong_punishment(jnp.array([1]), max_len=10, cache_len=11)
    with pytest.raises(ValueError, match="cache_len"):
      shaping.soft_overlong_punishment(jnp.array([1]), max_len=10, cache_len=0)
    with pytest.raises(ValueError, match="max_len"):
      shaping.soft_overlong_punishment(jnp.array([1]), max_len=-1, cache_len=1)


class OverlongFilterMaskTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_truncated_rows_masked(self):
    mask = jnp.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
    out = self.variant(shaping.overlong_filter_mask)(
      jnp.array([False, True, False]), mask
    )
    np.testing.assert_array_equal(out, [[1, 1, 0], [0, 0, 0], [1, 0, 0]])

  def test_shape_mismatch(self):
    with pytest.raises(ValueError, match="truncated has shape"):
      shaping.overlong_filter_mask(jnp.array([True]), jnp.ones((2, 3)))


class LengthPenaltyTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    fn = self.variant(functools.partial(shaping.length_penalty, alpha=0.5))
    np.testing.assert_allclose(
      fn(jnp.array([50, 100, 150]), 100.0), [-0.25, 0.0, -0.25], rtol=1e-6
    )
    np.testing.assert_allclose(
      fn(jnp.array([50, 100]), jnp.array([25.0, 200.0])),
      [-0.5, -0.25],
      rtol=1e-6,
    )

  def test_bad_target(self):
    with pytest.raises(ValueError, match="target_len"):
      shaping.length_penalty(jnp.array([1, 2]), 0.0)
    with pytest.raises(ValueError, match="target_len has shape"):
      shaping.length_penalty(jnp.array([1, 2]), jnp.ones(3))


class ZeroVarianceGroupsTest(chex.TestCase):
  rewards = jnp.array(
    [
      1.0,
      1.0,
      0.0,
      0.0,
      1.0,
      1.0,
      1.0,
      1.0,
      0.0,
      0.0,
      0.0,
      0.0,
      0.5,
      0.2,
      0.5,
      0.5,
    ]
  )

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    out = self.variant(
      functools.partial(shaping.zero_variance_groups, group_size=4)
    )(self.rewards)
    np.testing.assert_array_equal(out, [False, True, True, False])

  @chex.variants(with_jit=True, without_jit=True)
  def test_keep_mask_matches_nonzero_advantages(self):
    keep = self.variant(
      functools.partial(shaping.group_keep_mask, group_size=4)
    )(self.rewards)
    np.testing.assert_array_equal(
      keep, np.repeat([True, False, False, True], 4)
    )
    # Every dropped sample would have had a zero GRPO advantage.
    adv = advantages.grpo(self.rewards, 4)
    np.testing.assert_array_equal(np.asarray(adv)[~np.asarray(keep)], 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_informative_group_indices(self):
    for max_groups, indices, valid in (
      (2, [0, 3], [True, True]),
      (3, [0, 3, 0], [True, True, False]),
      (6, [0, 3, 0, 0, 0, 0], [True, True] + [False] * 4),
      (1, [0], [True]),
    ):
      fn = self.variant(
        functools.partial(
          shaping.informative_group_indices, group_size=4, max_groups=max_groups
        )
      )
      got_indices, got_valid = fn(self.rewards)
      np.testing.assert_array_equal(got_indices, indices)
      np.testing.assert_array_equal(got_valid, valid)

  def test_bad_group(self):
    with pytest.raises(ValueError, match="N=16.*group_size=5"):
      shaping.zero_variance_groups(self.rewards, 5)
    with pytest.raises(ValueError, match="max_groups"):
      shaping.informative_group_indices(self.rewards, 4, 0)


class PackageImportTest(absltest.TestCase):
  def test_contract_names(self):
    from rljax.core import advantages as adv_mod, kl, objectives  # noqa: F401
    import rljax.core as core

    for name in ("grpo", "drgrpo", "rloo", "gae"):
      self.assertTrue(callable(getattr(adv_mod, name)))
    for name in ("k1", "k2", "k3"):
      self.assertTrue(callable(getattr(kl, name)))
    self.assertTrue(callable(objectives.policy_loss))
    fields = {f for f in objectives.PolicyLossConfig.__dataclass_fields__}
    self.assertTrue(
      {
        "surrogate",
        "correction",
        "eps_low",
        "eps_high",
        "tis_cap",
        "aggregation",
        "norm_const",
      }
      <= fields
    )
    for name in core.__all__:
      self.assertTrue(hasattr(core, name), name)


if __name__ == "__main__":
  absltest.main()
