"""pass@k and avg@k against brute-force combinatorics."""

import itertools
import math

import numpy as np
import pytest

from rljax import rewards


def brute_force_pass_at_k(n, c, k):
  """Fraction of the k-subsets of n samples (c correct) containing a correct one."""
  samples = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


class TestPassAtK:
  @pytest.mark.parametrize("n", [1, 2, 5, 8])
  def test_matches_brute_force(self, n):
    for c in range(n + 1):
      for k in range(1, n + 1):
        assert rewards.pass_at_k(n, c, k) == pytest.approx(
          brute_force_pass_at_k(n, c, k), abs=1e-12
        )

  def test_hand_values(self):
    assert rewards.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert rewards.pass_at_k(4, 1, 2) == pytest.approx(
      0.5
    )  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert rewards.pass_at_k(10, 0, 5) == 0.0
    assert rewards.pass_at_k(10, 6, 5) == 1.0  # n - c < k

  def test_large_n_is_stable(self):
    n, c, k = 1000, 3, 100
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert rewards.pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-10)

  @pytest.mark.parametrize(
    "args,match",
    [
      ((0, 0, 1), "n"),
      ((5, 6, 1), "c"),
      ((5, 1, 6), "k"),
      ((5, 1, 0), "k"),
      ((5.0, 1, 1), "n"),
    ],
  )
  def test_bad_input(self, args, match):
    with pytest.raises((ValueError, TypeError), match=match):
      rewards.pass_at_k(*args)


class TestAggregates:
  def test_mean_pass_at_k(self):
    correct = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert rewards.mean_pass_at_k(correct, 1) == pytest.approx(
      (0.25 + 0 + 1) / 3
    )
    assert rewards.mean_pass_at_k(correct, 2) == pytest.approx(
      (0.5 + 0 + 1) / 3
    )

  def test_avg_at_k(self):
    correct = np.array([[1, 0, 1, 1], [0, 0, 1, 0]])
    assert rewards.avg_at_k(correct) == pytest.approx(4 / 8)
    assert rewards.avg_at_k(correct, k=2) == pytest.approx(1 / 4)

  def test_bad_shapes(self):
    with pytest.raises(ValueError, match="shape"):
      rewards.avg_at_k(np.ones(4))
    with pytest.raises(ValueError, match="k is 5"):
      rewards.avg_at_k(np.ones((2, 4)), k=5)
