"""Training on multi-turn trajectories, worked by hand: where
`RolloutBatch.pack` puts the action mask and turn rewards, how GAE steps
over observation tokens, which fields a `RolloutBatch` checks.

The properties over random observation spans are in `test_action_mask.py`;
this file pins the same contract on rows small enough to compute by hand.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rljax.rollout.base import RolloutBatch
from rljax.train import build_batch as bb
from rljax.train.config import apply_preset
from tests.train.test_action_mask import rollout


def one_row(mask, turn_rewards=None, prompt=(5, 6)):
  mask = np.asarray(mask)  # as given: the validation sees it
  return RolloutBatch(
    prompt_ids=[list(prompt)],
    response_ids=[list(range(10, 10 + len(mask)))],
    behav_logp=[np.where(mask != 0, -1.0, 0.0).astype(np.float32)],
    finish_reason=["stop"],
    n=1,
    action_mask=[mask],
    turn_rewards=turn_rewards,
  )


class TestByHand:
  def test_pack_aligns_action_mask_and_turn_rewards_with_logp(self):
    rb = one_row([1, 1, 0, 0, 1], [[(1, 0.5), (4, 1.0)]])
    packed = rb.pack(pad_id=0, prompt_len=3, response_len=6)
    # logp column t scores token t + 1: the response starts at column 2.
    np.testing.assert_array_equal(
      packed["action_mask"][0], [0, 0, 1, 1, 0, 0, 1, 0]
    )
    np.testing.assert_array_equal(
      packed["turn_rewards"][0], [0, 0, 0, 0.5, 0, 0, 1.0, 0]
    )
    np.testing.assert_array_equal(
      packed["response_mask"][0], [0, 0, 1, 1, 1, 1, 1, 0]
    )

  def test_gae_discounts_per_model_token(self):
    # Model, model, obs, obs, model; V = 0.2, 0.5, 0.7 on the model tokens;
    # turn reward 0.5 at token 1, outcome 1 at token 4; γ = 0.5, λ = 1.
    # Returns: G_4 = 1, G_1 = 0.5 + γ·G_4 = 1 (one step over the
    # observation, not three), G_0 = γ·G_1 = 0.5; A = G − V.
    cfg = apply_preset(
      "ppo",
      {
        "rollout.group_size": 1,
        "rollout.max_new_tokens": 5,
        "advantage.gamma": 0.5,
        "advantage.gae_lambda": 1.0,
        "critic.gae_lambda": 1.0,
        "kl.in_reward_coef": 0.0,
      },
    )
    rb = one_row([1, 1, 0, 0, 1], [[(1, 0.5)]])
    packed = bb.pack(rb, pad_id=0, response_len=5)
    model = (packed["response_mask"] > 0) & (packed["action_mask"] > 0)
    values = np.full(model.shape, 9.0, np.float32)  # 9: never read
    values[model] = [0.2, 0.5, 0.7]
    batch, metrics = bb.build_batch(
      cfg,
      packed,
      np.ones(1, bool),
      np.ones(1, np.float32),
      values=jnp.asarray(values),
    )
    np.testing.assert_allclose(
      np.asarray(batch["returns"])[model], [0.5, 1.0, 1.0], rtol=1e-6
    )
    np.testing.assert_allclose(
      np.asarray(batch["advantages"])[model], [0.3, 0.5, 0.3], rtol=1e-6
    )
    np.testing.assert_array_equal(np.asarray(batch["advantages"])[~model], 0)
    np.testing.assert_array_equal(np.asarray(batch["loss_mask"]), model)
    assert metrics["response_model_tokens_mean"] == 3.0
    assert metrics["response_obs_tokens_mean"] == 2.0
    assert metrics["response_length_mean"] == 5.0

  def test_group_advantage_scores_the_whole_trajectory(self):
    # Outcomes 1 and 0, but the second trajectory earned 1 in a turn
    # reward: both returns are 1, so GRPO's advantages are 0.
    cfg = apply_preset(
      "grpo",
      {"rollout.group_size": 2, "rollout.max_new_tokens": 4, "kl.coef": 0.0},
    )
    masks = [np.array([1, 0, 1], bool), np.array([1, 0, 0, 1], bool)]
    rb = RolloutBatch(
      prompt_ids=[[5, 6]],
      response_ids=[[10, 11, 12], [10, 11, 12, 13]],
      behav_logp=[np.full(3, -1.0, np.float32), np.full(4, -1.0, np.float32)],
      finish_reason=["stop", "stop"],
      n=2,
      action_mask=masks,
      turn_rewards=[[], [(0, 1.0)]],
    )
    packed = bb.pack(rb, pad_id=0, response_len=4)
    valid = np.ones(2, bool)
    batch, _ = bb.build_batch(cfg, packed, valid, np.array([1.0, 0.0]))
    np.testing.assert_array_equal(batch["advantages"], 0.0)
    # Without the turn reward: ±1 on the model tokens, 0 on observations.
    rb.turn_rewards = None
    batch, _ = bb.build_batch(
      cfg, bb.pack(rb, pad_id=0, response_len=4), valid, np.array([1.0, 0.0])
    )
    a = 0.5 / (0.5 + 1e-6)
    response = packed["response_mask"] > 0
    np.testing.assert_allclose(
      np.asarray(batch["advantages"])[response],
      [a, 0, a, -a, 0, 0, -a],
      rtol=1e-6,
    )

  def test_reinforce_pp_turn_rewards_are_rewards_to_go(self):
    # Row 0: model, model, obs, model; outcome 1, turn reward 1 at token 1:
    # G = 2, 2, ·, 1. Row 1: two model tokens, outcome 0: G = 0, 0. Whitened
    # over the 5 model tokens: mean 1, std √0.8.
    cfg = apply_preset(
      "reinforce_pp",
      {
        "rollout.group_size": 1,
        "rollout.max_new_tokens": 4,
        "kl.in_reward_coef": 0.0,
      },
    )
    rb = RolloutBatch(
      prompt_ids=[[5, 6], [7, 8]],
      response_ids=[[10, 11, 12, 13], [10, 11]],
      behav_logp=[np.full(4, -1.0, np.float32), np.full(2, -1.0, np.float32)],
      finish_reason=["stop", "stop"],
      n=1,
      action_mask=[np.array([1, 1, 0, 1], bool), np.ones(2, bool)],
      turn_rewards=[[(1, 1.0)], []],
    )
    packed = bb.pack(rb, pad_id=0, response_len=4)
    batch, _ = bb.build_batch(
      cfg, packed, np.ones(2, bool), np.array([1.0, 0.0], np.float32)
    )
    s = np.sqrt(0.8) + 1e-6
    response = packed["response_mask"] > 0
    np.testing.assert_allclose(
      np.asarray(batch["advantages"])[response],
      [1 / s, 1 / s, 0, 0, -1 / s, -1 / s],
      rtol=1e-5,
    )


class TestRolloutBatchFields:
  def test_length_mismatch_names_the_row(self):
    with pytest.raises(ValueError, match=r"action_mask\[0\] has shape \(2,\)"):
      RolloutBatch(
        prompt_ids=[[1]],
        response_ids=[[3, 4, 5]],
        behav_logp=[np.zeros(3, np.float32)],
        finish_reason=["stop"],
        action_mask=[np.ones(2, bool)],
      )

  def test_rejects_non_binary_flags_and_wrong_row_count(self):
    with pytest.raises(ValueError, match=r"action_mask\[0\] holds"):
      one_row([1, 2, 0])
    with pytest.raises(ValueError, match="action_mask has 2 entries"):
      RolloutBatch(
        prompt_ids=[[1]],
        response_ids=[[3]],
        behav_logp=[np.zeros(1, np.float32)],
        finish_reason=["stop"],
        action_mask=[np.ones(1, bool)] * 2,
      )

  def test_int8_flags_become_bool(self):
    rb = one_row(np.array([1, 0, 1], np.int8))
    assert rb.action_mask[0].dtype == bool
    assert rb.action_mask[0].tolist() == [True, False, True]

  @pytest.mark.parametrize(
    "pairs, match",
    [
      ([(2, 1.0)], r"token_index 2, an observation token"),
      ([(5, 1.0)], r"expected an index into response 0, in \[0, 5\)"),
      ([(1, float("nan"))], "finite float"),
      ([(1.0, 1.0)], "finite float"),
    ],
  )
  def test_turn_rewards_sit_on_turn_ends(self, pairs, match):
    with pytest.raises(ValueError, match=match):
      one_row([1, 1, 0, 0, 1], [pairs])

  def test_turn_rewards_row_must_be_a_list(self):
    with pytest.raises(TypeError, match=r"turn_rewards\[0\]=None"):
      one_row([1, 0], [None])

  def test_select_groups_and_concat_carry_the_fields(self):
    masks = [np.array(m, bool) for m in ([1, 0, 1], [1], [0, 1], [1, 1, 0])]
    rb = rollout(masks, seed=0, turn_rewards=True)
    sel = rb.select_groups([1])
    assert [m.tolist() for m in sel.action_mask] == [[False, True], [1, 1, 0]]
    assert sel.turn_rewards == rb.turn_rewards[2:]
    plain = RolloutBatch(
      prompt_ids=[[1]],
      response_ids=[[3, 4], [5]],
      behav_logp=[np.zeros(2, np.float32), np.zeros(1, np.float32)],
      finish_reason=["stop", "stop"],
      n=2,
    )
    both = RolloutBatch.concat([plain, sel])
    assert [m.tolist() for m in both.action_mask] == [
      [True, True],
      [True],
      [False, True],
      [True, True, False],
    ]
    assert both.turn_rewards == [[], []] + sel.turn_rewards
    assert RolloutBatch.concat([plain, plain]).action_mask is None

  def test_checkpointed_in_flight_rollouts_keep_the_fields(self, tmp_path):
    from rljax.train import checkpoint

    masks = [np.array(m, bool) for m in ([1, 0, 1], [1], [0, 1], [1, 1, 0])]
    rb = rollout(masks, seed=0, turn_rewards=True)
    path = tmp_path / "aux.npz"
    np.savez(path, **checkpoint.rollout_to_arrays(rb, {}, prefix="p0_"))
    with np.load(path) as aux:
      back, _ = checkpoint.rollout_from_arrays(dict(aux), prefix="p0_")
    assert [m.tolist() for m in back.action_mask] == [m.tolist() for m in masks]
    assert back.turn_rewards == [
      [(i, pytest.approx(r)) for i, r in row] for row in rb.turn_rewards
    ]
    plain = rollout(masks, seed=0, action_mask=None)
    arrays = checkpoint.rollout_to_arrays(plain, {}, prefix="p0_")
    assert not any("action_mask" in k or "turn_" in k for k in arrays)
    again, _ = checkpoint.rollout_from_arrays(arrays, prefix="p0_")
    assert again.action_mask is None and again.turn_rewards is None
