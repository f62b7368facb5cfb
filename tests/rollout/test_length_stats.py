"""Per-prompt response lengths for longest-first admission
(`length_stats.ResponseLengths`)."""

from __future__ import annotations

import pytest

from rljax.rollout.length_stats import ResponseLengths


def test_running_mean_over_a_window():
  stats = ResponseLengths(window=2)
  a, b = [1, 2, 3], [4]
  assert stats.expected([a, b]) == [None, None]
  stats.update([a, b], [[10, 20], [5]])
  assert stats.expected([a, b, [9]]) == [15.0, 5.0, None]
  stats.update([a], [[40]])
  stats.update([a], [[60, 80]])  # the first rollout leaves the window
  assert stats.expected([a]) == [(40 + 70) / 2]


def test_capacity_keeps_the_recent_prompts():
  stats = ResponseLengths(capacity=2)
  stats.update([[1], [2]], [[1], [2]])
  stats.update([[1]], [[3]])  # 1 is the most recent now
  stats.update([[3]], [[4]])
  assert len(stats) == 2
  assert stats.expected([[1], [2], [3]]) == [2.0, None, 4.0]


def test_bad_input_names_it():
  with pytest.raises(ValueError, match="window=0"):
    ResponseLengths(window=0)
  with pytest.raises(ValueError, match="2 prompts, 1 length lists"):
    ResponseLengths().update([[1], [2]], [[3]])
