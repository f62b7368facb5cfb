"""build_batch: from a packed rollout to the update step's batch.

Hand-computed advantages for tiny groups (GRPO z-scores, dynamic-sampling
filler, GAE with a critic), and the batch a real `train_step` trains on is
`build_batch` of its rollout. build_batch runs on the host (NumPy glue
around core's jitted kernels, which have their own jit/no-jit tests), so
there is no chex jit variant here.
"""

import hypothesis
import numpy as np
import jax.numpy as jnp
import pytest

from rljax.rollout.base import RolloutBatch
from rljax.train import batch as batch_lib
from rljax.train import build_batch as build_batch_lib
from rljax.train import update as update_lib
from rljax.train.config import apply_preset
from tests.train.test_trainer import make_trainer, small_config


def _rollout(prompts, responses, n):
  return RolloutBatch(
    prompt_ids=prompts,
    response_ids=responses,
    behav_logp=[np.full(len(r), -1.0, np.float32) for r in responses],
    finish_reason=["stop"] * len(responses),
    n=n,
  )


def _per_token(packed, per_sequence):
  return np.asarray(per_sequence)[:, None] * packed["response_mask"]


class TestBuildBatchOutcome:
  def setup_method(self):
    # Two prompts, two samples each; responses of 2, 3, 1, 2 tokens.
    self.rb = _rollout([[5, 6], [7]], [[1, 2], [3, 4, 5], [6], [7, 8]], n=2)
    self.packed = build_batch_lib.pack(self.rb, pad_id=0, response_len=4)

  def test_grpo_advantages_by_hand(self):
    cfg = apply_preset(
      "grpo",
      {"rollout.group_size": 2, "rollout.max_new_tokens": 4, "kl.coef": 0.0},
    )
    rewards = np.array([1.0, 0.0, 0.5, 0.5], np.float32)
    valid = np.ones(4, bool)
    batch, metrics = build_batch_lib.build_batch(
      cfg, self.packed, valid, rewards
    )
    # Group 1: mean 0.5, std 0.5 → ±0.5 / (0.5 + 1e-6); group 2: no spread.
    a = 0.5 / (0.5 + 1e-6)
    expected = _per_token(self.packed, [a, -a, 0.0, 0.0])
    np.testing.assert_allclose(batch["advantages"], expected, rtol=1e-6)
    np.testing.assert_array_equal(
      batch["loss_mask"], self.packed["response_mask"]
    )
    # One update per step: the loss reads the current θ, prox is a dummy.
    np.testing.assert_array_equal(batch["prox_logp"], batch["behav_logp"])
    assert "ref_logp" not in batch
    assert metrics["response_length_mean"] == 2.0
    assert metrics["response_length_max"] == 3.0
    assert metrics["valid_fraction"] == 1.0
    # Mean over the 8 response tokens: (2a − 3a) / 8.
    np.testing.assert_allclose(metrics["advantage_mean"], -a / 8, rtol=1e-5)
    np.testing.assert_allclose(metrics["advantage_abs_max"], a, rtol=1e-6)

  def test_dynamic_sampling_filler_is_masked_out(self):
    cfg = apply_preset(
      "dapo",
      {
        "rollout.group_size": 2,
        "rollout.max_new_tokens": 4,
        "advantage.overlong_shaping": False,
      },
    )
    rewards = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
    valid = np.array([True, True, False, False])
    batch, metrics = build_batch_lib.build_batch(
      cfg, self.packed, valid, rewards
    )
    a = 0.5 / (0.5 + 1e-6)
    np.testing.assert_allclose(
      batch["advantages"], _per_token(self.packed, [a, -a, 0, 0]), rtol=1e-6
    )
    np.testing.assert_array_equal(
      batch["loss_mask"], _per_token(self.packed, [1, 1, 0, 0])
    )
    assert metrics["valid_fraction"] == 0.5

  def test_given_prox_and_reference_are_passed_through(self):
    cfg = apply_preset(
      "grpo",
      {"rollout.group_size": 2, "rollout.max_new_tokens": 4, "kl.coef": 0.1},
    )
    shape = self.packed["response_mask"].shape
    prox = jnp.full(shape, -2.0)
    ref = jnp.full(shape, -3.0)
    batch, _ = build_batch_lib.build_batch(
      cfg,
      self.packed,
      np.ones(4, bool),
      np.zeros(4, np.float32),
      prox_logp=prox,
      ref_logp=ref,
    )
    assert batch["prox_logp"] is prox and batch["ref_logp"] is ref


class TestBuildBatchGae:
  def test_gae_advantages_and_returns_by_hand(self):
    # One sequence of 3 response tokens, reward 1 on the last; γ = λ = 1:
    # A_t = R − V_t, returns_t = R.
    cfg = apply_preset(
      "ppo",
      {
        "rollout.group_size": 1,
        "rollout.max_new_tokens": 3,
        "advantage.gamma": 1.0,
        "advantage.gae_lambda": 1.0,
        "critic.gae_lambda": 1.0,
        "kl.in_reward_coef": 0.0,
      },
    )
    rb = _rollout([[5, 6]], [[1, 2, 3]], n=1)
    packed = build_batch_lib.pack(rb, pad_id=0, response_len=3)
    mask = packed["response_mask"] > 0
    values = np.zeros(mask.shape, np.float32)
    values[mask] = [0.2, 0.5, 0.7]
    batch, _ = build_batch_lib.build_batch(
      cfg,
      packed,
      np.ones(1, bool),
      np.ones(1, np.float32),
      values=jnp.asarray(values),
    )
    np.testing.assert_allclose(
      np.asarray(batch["advantages"])[mask], [0.8, 0.5, 0.3], rtol=1e-6
    )
    np.testing.assert_allclose(
      np.asarray(batch["returns"])[mask], [1.0, 1.0, 1.0], rtol=1e-6
    )
    np.testing.assert_array_equal(np.asarray(batch["advantages"])[~mask], 0)
    np.testing.assert_array_equal(batch["old_values"], values)


def test_train_step_trains_on_build_batch_of_its_rollout(tmp_path, monkeypatch):
  """The batch the update epochs get is `build_batch` of the collected
  rollout, and its advantages are GRPO's z-scores of the rewards."""
  seen = {}
  real_build = build_batch_lib.build_batch
  real_epochs = update_lib.run_epochs

  def spy_build(cfg, packed, valid, rewards, **inputs):
    out = real_build(cfg, packed, valid, rewards, **inputs)
    seen.update(packed=packed, valid=valid, rewards=rewards, inputs=inputs)
    seen["built"] = out[0]
    return out

  def spy_epochs(update_step, state, batch, *args):
    seen["trained"] = batch
    return real_epochs(update_step, state, batch, *args)

  monkeypatch.setattr(build_batch_lib, "build_batch", spy_build)
  monkeypatch.setattr(update_lib, "run_epochs", spy_epochs)
  cfg = small_config("grpo", tmp_path, steps=1, kl_coef=0.0)
  trainer = make_trainer(cfg)
  try:
    rollout = {}
    real_collect = trainer.collector.collect

    def spy_collect(step):
      rollout["out"] = real_collect(step)
      return rollout["out"]

    trainer.collector.collect = spy_collect
    trainer.actor.sync(trainer.policy_params(), trainer.step_num)
    trainer.train_step()
  finally:
    trainer.close()
  assert seen["trained"] is seen["built"]
  np.testing.assert_array_equal(seen["rewards"], rollout["out"].rewards)
  again, _ = real_build(
    cfg, seen["packed"], seen["valid"], seen["rewards"], **seen["inputs"]
  )
  for k, v in seen["built"].items():
    np.testing.assert_array_equal(np.asarray(again[k]), np.asarray(v), k)
  r = np.asarray(seen["rewards"], np.float64).reshape(
    -1, cfg.rollout.group_size
  )
  z = (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(
    seen["built"]["advantages"],
    _per_token(seen["packed"], z.reshape(-1)),
    rtol=1e-4,
    atol=1e-5,
  )


class TestPromptWidth:
  """`batch.prompt_width`: the prompt part's width in an update batch."""

  def test_by_hand(self):
    widths = {n: batch_lib.prompt_width(n) for n in (1, 8, 9, 49, 51, 64, 65)}
    assert widths == {1: 8, 8: 8, 9: 16, 49: 56, 51: 56, 64: 64, 65: 80}
    assert [batch_lib.prompt_width(n) for n in (100, 129, 200, 257)] == [
      112,
      160,
      224,
      320,
    ]

  @hypothesis.given(hypothesis.strategies.integers(1, 1 << 16))
  def test_covers_with_little_padding(self, n):
    w = batch_lib.prompt_width(n)
    assert w >= n and w % 8 == 0
    assert w - n < (8 if n <= 64 else w / 5)
    assert batch_lib.prompt_width(w) == w  # a width is its own width

  def test_few_shapes(self):
    # One compile of the update step per width: 8 up to 64, then 4 per octave.
    widths = {batch_lib.prompt_width(n) for n in range(1, 4097)}
    assert len(widths) == 8 + 4 * 6

  def test_bad_length(self):
    with pytest.raises(ValueError, match="length=0; expected >= 1"):
      batch_lib.prompt_width(0)

  def test_pack_pads_prompts_to_it(self):
    rb = _rollout([list(range(2, 53))], [[1, 2]], n=1)  # a 51-token prompt
    packed = build_batch_lib.pack(rb, pad_id=0, response_len=4)
    assert packed["tokens"].shape == (1, 56 + 4)
    assert packed["prompt_lengths"].tolist() == [51]
