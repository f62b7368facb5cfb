"""Format rewards, the reward-function interface, combine, overlong shaping."""

import dataclasses

import numpy as np
import pytest

from rljax import rewards
from rljax.core import shaping as core_shaping

NO_META = {}


class TestR1Format:
  @pytest.mark.parametrize(
    "completion,expected",
    [
      ("<think>7+5=12</think><answer>12</answer>", True),
      ("  <think>\nsteps\n</think>\n<answer> 12 </answer>\n", True),
      ("<think>a</think><answer>  </answer>", False),  # empty answer
      ("<answer>12</answer>", False),  # no think block
      ("<think>a</think>", False),  # no answer block
      ("<answer>12</answer><think>a</think>", False),  # wrong order
      ("<think>a</think><answer>12</answer> trailing", False),
      ("<think>a<think>b</think><answer>12</answer>", False),  # tag twice
      ("<think>a</think><answer>1</answer><answer>2</answer>", False),
    ],
  )
  def test_layout(self, completion, expected):
    assert rewards.has_r1_format(completion) is expected

  def test_prompt_that_opens_think(self):
    completion = "7+5=12</think><answer>12</answer>"
    assert (
      rewards.r1_format_reward(
        "... Assistant: <think>", completion, "12", NO_META
      ).score
      == 1.0
    )
    assert (
      rewards.r1_format_reward(
        "... Assistant:", completion, "12", NO_META
      ).score
      == 0.0
    )

  def test_components_named(self):
    out = rewards.r1_format_reward(
      "", "<think>a</think><answer>1</answer>", "1", NO_META
    )
    assert out == rewards.RewardOutput(1.0, {"r1_format": 1.0})


class TestBoxedFormat:
  @pytest.mark.parametrize(
    "completion,expected",
    [
      ("so \\boxed{3}", 1.0),
      ("\\boxed{}", 0.0),
      ("\\boxed{3", 0.0),
      ("no box: 3", 0.0),
      ("\\boxed{\\frac{1}{2}}", 1.0),
    ],
  )
  def test_values(self, completion, expected):
    assert (
      rewards.boxed_format_reward("", completion, "", NO_META).score == expected
    )

  def test_format_is_independent_of_correctness(self):
    assert (
      rewards.boxed_format_reward("", "\\boxed{4}", "5", NO_META).score == 1.0
    )


def constant_reward(prompt, completion, ground_truth, metadata):
  return 0.25


class TestCombine:
  def test_weighted_sum_and_named_components(self):
    fn = rewards.combine(
      [
        (rewards.correctness_reward, 1.0),
        (rewards.boxed_format_reward, 0.5),
        (constant_reward, -2.0),
      ]
    )
    out = fn("", "\\boxed{12}", "12", NO_META)
    assert out.score == pytest.approx(1.0 * 1.0 + 0.5 * 1.0 - 2.0 * 0.25)
    assert out.components == {
      "correctness_reward": 1.0,
      "correctness_reward/correct": 1.0,
      "boxed_format_reward": 1.0,
      "boxed_format_reward/boxed_format": 1.0,
      "constant_reward": 0.25,
    }

  def test_wrong_answer_keeps_format_credit(self):
    fn = rewards.combine(
      [
        ("correct", rewards.correctness_reward, 1.0),
        ("format", rewards.boxed_format_reward, 0.1),
      ]
    )
    out = fn("", "\\boxed{13}", "12", NO_META)
    assert out.score == pytest.approx(0.1)
    assert out.components["correct"] == 0.0 and out.components["format"] == 1.0

  def test_bad_terms(self):
    with pytest.raises(ValueError, match="empty"):
      rewards.combine([])
    with pytest.raises(ValueError, match="duplicate"):
      rewards.combine([(constant_reward, 1.0), (constant_reward, 2.0)])
    with pytest.raises(ValueError, match="weight"):
      rewards.combine([(constant_reward, float("nan"))])
    with pytest.raises(TypeError, match="not callable"):
      rewards.combine([("x", 3, 1.0)])

  def test_bad_return_type_named(self):
    fn = rewards.combine([("broken", lambda *a: "1.0", 1.0)])
    with pytest.raises(TypeError, match="broken"):
      fn("", "", "", NO_META)


class TestCorrectnessReward:
  def test_dispatches_on_verifier(self):
    countdown = {"verifier": "countdown", "numbers": [3, 5, 7], "target": 22}
    assert (
      rewards.correctness_reward(
        "", "<answer>3*5+7</answer>", "22", countdown
      ).score
      == 1.0
    )
    assert (
      rewards.correctness_reward(
        "", "<answer>22</answer>", "22", countdown
      ).score
      == 0.0
    )  # 22 is not given
    assert (
      rewards.correctness_reward(
        "", "<answer>22</answer>", "22", {"verifier": "math"}
      ).score
      == 1.0
    )

  def test_bad_metadata(self):
    with pytest.raises(ValueError, match="verifier"):
      rewards.correctness_reward("", "", "1", {"verifier": "chess"})
    with pytest.raises(ValueError, match="target"):
      rewards.correctness_reward(
        "", "", "1", {"verifier": "countdown", "numbers": [1]}
      )


class TestOverlong:
  # L_max = 100, L_cache = 20: free up to 80, then -(len-80)/20, -1 past 100.
  @pytest.mark.parametrize(
    "length,expected",
    [
      (0, 0.0),
      (80, 0.0),
      (81, -0.05),
      (90, -0.5),
      (100, -1.0),
      (101, -1.0),
      (500, -1.0),
    ],
  )
  def test_hand_values(self, length, expected):
    fn = rewards.OverlongPenalty(max_length=100, cache_length=20)
    out = fn("", "", "", {"completion_tokens": length})
    assert out.score == pytest.approx(expected)
    assert out.components == {"overlong": pytest.approx(expected)}

  def test_batch_matches_core(self):
    lengths = np.array([10, 85, 99, 130])
    np.testing.assert_allclose(
      rewards.overlong_penalty(lengths, 100, 20),
      np.asarray(core_shaping.soft_overlong_punishment(lengths, 100, 20)),
    )

  def test_errors(self):
    with pytest.raises(ValueError, match="cache_length"):
      rewards.OverlongPenalty(max_length=10, cache_length=20)
    with pytest.raises(ValueError, match="completion_tokens"):
      rewards.OverlongPenalty(100, 20)("", "", "", {})

  def test_combines_with_correctness(self):
    fn = rewards.combine(
      [
        (rewards.correctness_reward, 1.0),
        (rewards.OverlongPenalty(100, 20), 1.0),
      ]
    )
    out = fn("", "\\boxed{3}", "3", {"completion_tokens": 90})
    assert out.score == pytest.approx(0.5)
    assert dataclasses.asdict(out)["components"]["overlong"] == pytest.approx(
      -0.5
    )


class TestCorrectnessOptions:
  def test_last_number_fallback(self):
    assert rewards.Correctness()(
      "", "7 + 5 = 12", "12", NO_META
    ) == rewards.RewardOutput(0.0, {"correct": 0.0})
    assert (
      rewards.Correctness(last_number_fallback=True)(
        "", "7 + 5 = 12", "12", NO_META
      ).score
      == 1.0
    )

  def test_named_in_combine(self):
    fn = rewards.combine(
      [
        (rewards.Correctness(last_number_fallback=True), 1.0),
        (rewards.boxed_format_reward, 0.1),
      ]
    )
    out = fn("", "7 + 5 = 12", "12", NO_META)
    assert out.score == 1.0 and out.components == {
      "correct": 1.0,
      "boxed_format_reward": 0.0,
      "boxed_format_reward/boxed_format": 0.0,
    }
