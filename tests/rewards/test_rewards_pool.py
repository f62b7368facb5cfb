"""RewardPool: results in order, per-item timeouts and failures counted as 0."""

import os
import sys

import numpy as np
import pytest

from rljax import rewards

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reward_helpers  # noqa: E402  (worker processes import it by this name)


def inputs(completions, truth="ok"):
  return rewards.make_inputs(
    [""] * len(completions), completions, [truth] * len(completions)
  )


class TestProcessMode:
  def test_failures_score_zero_and_are_counted(self):
    completions = ["ok", "hang", "raise", "no", "die", "ok", "ok"]
    # No math-verify warm-up: these workers never verify math.
    pool = rewards.RewardPool(
      reward_helpers.misbehaving_reward,
      num_workers=2,
      timeout_s=1.0,
      warm_up=None,
    )
    with pool:
      batch = pool.score(inputs(completions))
      np.testing.assert_array_equal(batch.scores, [1, 0, 0, 0, 0, 1, 1])
      assert batch.status == (
        "ok",
        "timeout",
        "error",
        "ok",
        "error",
        "ok",
        "ok",
      )
      assert (
        batch.metrics["timeouts"] == 1
        and batch.metrics["errors"] == 2
        and batch.metrics["items"] == 7
      )
      assert (
        batch.metrics["worker_restarts"] == 2
      )  # the hung one and the dead one
      # The pool is intact for the next batch.
      again = pool.score(inputs(["ok", "no", "ok"]))
      np.testing.assert_array_equal(again.scores, [1, 0, 1])
      assert again.metrics["timeouts"] == 0 and again.metrics["errors"] == 0

  def test_uninterruptible_math_check_is_killed(self):
    # sympy spends hours inside one C call on this answer; only the
    # per-item kill bounds it. The other items are still scored.
    completions = [
      "\\boxed{9^{9^{9^{9}}}}",
      "\\boxed{\\frac{1}{2}}",
      "#### 7",
      "<answer>3*5+7</answer>",
    ]
    truths = ["1", "0.5", "8", "22"]
    metadata = [
      {},
      {},
      {},
      {"verifier": "countdown", "numbers": [3, 5, 7], "target": 22},
    ]
    with rewards.RewardPool(
      rewards.correctness_reward, num_workers=2, timeout_s=2.0
    ) as pool:
      batch = pool.score(
        rewards.make_inputs([""] * 4, completions, truths, metadata)
      )
    np.testing.assert_array_equal(batch.scores, [0, 1, 0, 1])
    assert batch.status[0] == "timeout" and batch.metrics["timeouts"] == 1
    np.testing.assert_array_equal(batch.components["correct"], [0, 1, 0, 1])

  def test_rejects_functions_workers_cannot_import(self):
    with pytest.raises(ValueError, match="pickled"):
      rewards.RewardPool(lambda *a: 1.0)
    fn = reward_helpers.misbehaving_reward
    main_fn = type(fn)(fn.__code__, fn.__globals__, "main_fn")
    main_fn.__module__ = "__main__"
    with pytest.raises(ValueError, match="__main__"):
      rewards.RewardPool(main_fn)


class TestSerialMode:
  def test_failures_score_zero_and_are_counted(self):
    pool = rewards.RewardPool(
      reward_helpers.misbehaving_reward, mode="serial", timeout_s=0.5
    )
    batch = pool.score(inputs(["ok", "hang", "raise", "ok"]))
    np.testing.assert_array_equal(batch.scores, [1, 0, 0, 1])
    assert batch.status == ("ok", "timeout", "error", "ok")
    assert batch.metrics["timeouts"] == 1 and batch.metrics["errors"] == 1

  def test_timeout_interrupts_the_math_helper(self):
    # The alarm lands while math_reward waits on its helper process; the
    # helper is killed, the item times out, the next item is unaffected.
    pool = rewards.RewardPool(
      rewards.correctness_reward, mode="serial", timeout_s=1.0
    )
    batch = pool.score(
      rewards.make_inputs(
        ["", ""], ["\\boxed{9^{9^{9^{9}}}}", "#### 7"], ["1", "7"]
      )
    )
    assert batch.status == ("timeout", "ok")
    np.testing.assert_array_equal(batch.scores, [0, 1])

  def test_components_are_aligned(self):
    pool = rewards.RewardPool(
      reward_helpers.partial_components_reward, mode="serial"
    )
    batch = pool.score(inputs(["a", "bonus", "b"]))
    np.testing.assert_array_equal(batch.scores, [1, 2, 1])
    np.testing.assert_array_equal(batch.components["base"], [1, 1, 1])
    np.testing.assert_array_equal(batch.components["bonus"], [0, 1, 0])

  def test_lambdas_allowed(self):
    batch = rewards.RewardPool(
      lambda p, c, g, m: float(len(c)), mode="serial"
    ).score(inputs(["ab", "abc"]))
    np.testing.assert_array_equal(batch.scores, [2, 3])
    np.testing.assert_array_equal(batch.components["<lambda>"], [2, 3])


class TestArguments:
  def test_make_inputs_lengths(self):
    with pytest.raises(ValueError, match="lengths differ"):
      rewards.make_inputs(["a"], ["b", "c"], ["d"])

  @pytest.mark.parametrize(
    "kwargs,match",
    [
      ({"mode": "threads"}, "mode"),
      ({"num_workers": 0}, "num_workers"),
      ({"timeout_s": 0}, "timeout_s"),
    ],
  )
  def test_bad_arguments(self, kwargs, match):
    with pytest.raises(ValueError, match=match):
      rewards.RewardPool(reward_helpers.misbehaving_reward, **kwargs)

  def test_bad_items(self):
    pool = rewards.RewardPool(reward_helpers.misbehaving_reward, mode="serial")
    with pytest.raises(TypeError, match=r"inputs\[0\]"):
      pool.score([("", "ok", "ok", {})])
