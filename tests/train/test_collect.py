"""Dynamic sampling on RolloutBatch.select_groups (rljax/train/collect.py)."""

import numpy as np
import pytest

from rljax.rollout.base import RolloutBatch
from rljax.train import collect


def _batch(first_prompt: int, prompts: int, n: int = 2) -> RolloutBatch:
  return RolloutBatch(
    prompt_ids=[[first_prompt + i] for i in range(prompts)],
    response_ids=[
      [100 * (first_prompt + b // n) + b % n] for b in range(prompts * n)
    ],
    behav_logp=[np.zeros(1, np.float32) for _ in range(prompts * n)],
    finish_reason=["stop"] * (prompts * n),
    n=n,
  )


class TestSelectGroups:
  def test_indices_keep_order_and_rows(self):
    rb = _batch(0, 3).select_groups([2, 0])
    assert rb.prompt_ids == [[2], [0]]
    assert rb.response_ids == [[200], [201], [0], [1]]

  def test_mask(self):
    rb = _batch(0, 3).select_groups(np.array([False, True, True]))
    assert rb.prompt_ids == [[1], [2]]

  def test_bad_index_names_the_range(self):
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
      _batch(0, 3).select_groups([3])


def test_select_takes_kept_groups_first_then_pads_with_dropped():
  # Round 0: prompts 0, 1 (only 1 kept); round 1: prompts 10, 11 (10 kept).
  rounds = [
    collect.Round(
      _batch(0, 2),
      np.array([0.0, 0.0, 1.0, 0.0]),
      {"acc": np.array([0.0, 0.0, 1.0, 0.0])},
      np.array([False, True]),
    ),
    collect.Round(
      _batch(10, 2),
      np.array([1.0, 0.0, 1.0, 1.0]),
      {"acc": np.array([1.0, 0.0, 1.0, 1.0])},
      np.array([True, False]),
    ),
  ]
  out = collect.select(rounds, 3)
  rb, valid, rewards, comps = out.batch, out.valid, out.rewards, out.components
  kept, dropped = out.kept_groups, out.dropped_groups
  assert rb.prompt_ids == [[1], [10], [0]]  # kept in order, then a filler
  np.testing.assert_array_equal(valid, [1, 1, 1, 1, 0, 0])
  np.testing.assert_array_equal(rewards, [1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
  np.testing.assert_array_equal(comps["acc"], rewards)
  assert (kept, dropped) == (2, 2)
