"""Non-finite rewards (rljax/rewards/finite.py): counted, named and their
groups dropped, so that no NaN reaches the advantages."""

import numpy as np
import pytest

from rljax.rewards import finite


class TestDropNonfiniteGroups:
  def test_a_group_with_a_nan_or_inf_is_dropped_and_zero_filled(self):
    rewards = np.array([1.0, np.nan, 0.5, 0.0, np.inf, 1.0, -np.inf, 0.0])
    clean, keep, bad = finite.drop_nonfinite_groups(rewards, 2)
    np.testing.assert_array_equal(keep, [False, True, False, False])
    np.testing.assert_array_equal(bad, [1, 4, 6])
    np.testing.assert_array_equal(
      clean, [1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 0.0, 0.0]
    )

  def test_finite_rewards_pass_unchanged(self):
    rewards = np.array([0.0, 1.0, 0.25, 0.75])
    clean, keep, bad = finite.drop_nonfinite_groups(rewards, 4)
    np.testing.assert_array_equal(clean, rewards)
    assert keep.tolist() == [True] and bad.size == 0

  def test_rewards_that_are_not_groups_are_refused(self):
    with pytest.raises(ValueError, match="group_size=3"):
      finite.drop_nonfinite_groups(np.zeros(4), 3)

  def test_the_message_names_the_samples_and_values(self):
    rewards = np.array([np.nan, 1.0, np.inf])
    text = finite.describe(rewards, np.array([0, 2]))
    assert text == "2 non-finite rewards (sample 0: nan, sample 2: inf)"
