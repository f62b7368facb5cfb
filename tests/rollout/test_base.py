"""Tests of the rollout interface: SamplingConfig, RolloutBatch, pack."""

import numpy as np
import pytest

from rljax.rollout import base


class TestSamplingConfig:
  def test_defaults_are_rl_defaults(self):
    cfg = base.SamplingConfig()
    assert (cfg.n, cfg.temperature, cfg.top_p, cfg.top_k) == (1, 1.0, 1.0, 0)
    assert not cfg.is_greedy

  @pytest.mark.parametrize("kwargs", [{"greedy": True}, {"temperature": 0.0}])
  def test_is_greedy(self, kwargs):
    assert base.SamplingConfig(**kwargs).is_greedy

  def test_stop_token_ids_normalized_to_int_tuple(self):
    cfg = base.SamplingConfig(stop_token_ids=[np.int64(2), 7])
    assert cfg.stop_token_ids == (2, 7)
    assert all(type(t) is int for t in cfg.stop_token_ids)
    assert hash(cfg) == hash(base.SamplingConfig(stop_token_ids=(2, 7)))

  @pytest.mark.parametrize(
    "field, value, match",
    [
      ("n", 0, r"SamplingConfig.n=0"),
      ("temperature", -0.5, r"temperature=-0.5"),
      ("temperature", float("nan"), r"temperature=nan"),
      ("top_p", 0.0, r"top_p=0.0.*0 < top_p <= 1"),
      ("top_p", 1.5, r"top_p=1.5"),
      ("top_k", -1, r"top_k=-1"),
      ("max_new_tokens", 0, r"max_new_tokens=0"),
      ("stop_token_ids", (3, -1), r"stop_token_ids contains -1"),
    ],
  )
  def test_bad_values_raise_value_error_naming_the_field(
    self, field, value, match
  ):
    with pytest.raises(ValueError, match=match):
      base.SamplingConfig(**{field: value})

  @pytest.mark.parametrize(
    "field, value",
    [
      ("n", 2.0),
      ("n", True),
      ("top_k", 1.5),
      ("temperature", "1"),
      ("greedy", 1),
      ("stop_token_ids", "abc"),
      ("seed", 0.5),
    ],
  )
  def test_bad_types_raise_type_error(self, field, value):
    with pytest.raises(TypeError, match=f"SamplingConfig.{field}="):
      base.SamplingConfig(**{field: value})


def _batch(**overrides):
  kwargs = dict(
    prompt_ids=[[5, 6], [7]],
    response_ids=[[1, 2], [3], [4, 4, 4], [9]],
    behav_logp=[
      np.array([-0.1, -0.2]),
      np.array([-0.3]),
      np.array([-0.4, -0.5, -0.6]),
      np.array([-0.7]),
    ],
    finish_reason=["stop", "length", "length", "stop"],
    n=2,
  )
  kwargs.update(overrides)
  return base.RolloutBatch(**kwargs)


class TestRolloutBatch:
  def test_group_ids_and_lengths(self):
    batch = _batch()
    np.testing.assert_array_equal(batch.group_ids, [0, 0, 1, 1])
    np.testing.assert_array_equal(batch.response_lengths, [2, 1, 3, 1])
    assert (batch.num_prompts, batch.num_samples) == (2, 4)

  def test_wrong_number_of_responses_raises(self):
    with pytest.raises(ValueError, match=r"response_ids has 3 entries.*= 4"):
      _batch(response_ids=[[1], [2], [3]])

  def test_logp_length_mismatch_raises(self):
    logp = [np.zeros(2), np.zeros(2), np.zeros(3), np.zeros(1)]
    with pytest.raises(ValueError, match=r"row 1: 1 response tokens but 2"):
      _batch(behav_logp=logp)

  def test_bad_finish_reason_raises(self):
    with pytest.raises(ValueError, match=r"finish_reason\[2\]='abort'"):
      _batch(finish_reason=["stop", "length", "abort", "stop"])


class TestPack:
  def test_hand_computed_layout(self):
    packed = _batch().pack(pad_id=0)
    # Prompts left-padded to 2, responses right-padded to 3.
    np.testing.assert_array_equal(
      packed["tokens"],
      [
        [5, 6, 1, 2, 0],
        [5, 6, 3, 0, 0],
        [0, 7, 4, 4, 4],
        [0, 7, 9, 0, 0],
      ],
    )
    np.testing.assert_array_equal(
      packed["attention_mask"],
      [
        [1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0],
        [0, 1, 1, 1, 1],
        [0, 1, 1, 0, 0],
      ],
    )
    np.testing.assert_array_equal(
      packed["positions"],
      [
        [0, 1, 2, 3, 3],
        [0, 1, 2, 2, 2],
        [0, 0, 1, 2, 3],
        [0, 0, 1, 1, 1],
      ],
    )
    # logp[:, t] scores tokens[:, t + 1]: the first response token is at
    # column 2, so its log-prob sits in column 1.
    np.testing.assert_array_equal(
      packed["response_mask"],
      [
        [0, 1, 1, 0],
        [0, 1, 0, 0],
        [0, 1, 1, 1],
        [0, 1, 0, 0],
      ],
    )
    np.testing.assert_allclose(
      packed["behav_logp"],
      [
        [0, -0.1, -0.2, 0],
        [0, -0.3, 0, 0],
        [0, -0.4, -0.5, -0.6],
        [0, -0.7, 0, 0],
      ],
      rtol=1e-6,
    )
    np.testing.assert_array_equal(packed["prompt_lengths"], [2, 2, 1, 1])
    np.testing.assert_array_equal(packed["group_ids"], [0, 0, 1, 1])
    np.testing.assert_array_equal(
      packed["truncated"], [False, True, True, False]
    )
    assert packed["tokens"].dtype == np.int32
    assert packed["behav_logp"].dtype == np.float32

  def test_fixed_widths(self):
    packed = _batch().pack(pad_id=-1, prompt_len=4, response_len=5)
    assert packed["tokens"].shape == (4, 9)
    assert packed["behav_logp"].shape == (4, 8)
    np.testing.assert_array_equal(
      packed["tokens"][2], [-1, -1, -1, 7, 4, 4, 4, -1, -1]
    )
    assert packed["response_mask"][2].tolist() == [0, 0, 0, 1, 1, 1, 0, 0]

  def test_too_narrow_raises(self):
    with pytest.raises(ValueError, match=r"prompt_len=1.*longest prompt"):
      _batch().pack(prompt_len=1)
    with pytest.raises(ValueError, match=r"response_len=2.*longest response"):
      _batch().pack(response_len=2)


class TestCheckPrompts:
  def test_converts_to_int_lists(self):
    out = base.check_prompts([np.array([1, 2]), (3,)], vocab_size=10)
    assert out == [[1, 2], [3]]

  @pytest.mark.parametrize(
    "prompts, error, match",
    [
      ([], ValueError, "prompt_ids is empty"),
      ([[1], []], ValueError, r"prompt_ids\[1\] is empty"),
      ([[1, 12]], ValueError, r"prompt_ids\[0\] has token id 12"),
      ("hello", TypeError, "expected a list of lists"),
      ([[1], "ab"], TypeError, r"prompt_ids\[1\]"),
    ],
  )
  def test_bad_prompts(self, prompts, error, match):
    with pytest.raises(error, match=match):
      base.check_prompts(prompts, vocab_size=10)


def test_protocol_is_runtime_checkable():

  class Engine:
    def generate(self, prompt_ids, sampling):
      del prompt_ids, sampling

    def update_weights(self, params, quant_mode=None):
      del params, quant_mode

    def close(self):
      pass

  assert isinstance(Engine(), base.RolloutEngine)
  assert not isinstance(object(), base.RolloutEngine)
