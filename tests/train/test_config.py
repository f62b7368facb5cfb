"""TrainConfig validation and the algorithm presets (no compute)."""
import dataclasses

import pytest

from rljax.core import objectives
from rljax.train import config as config_lib


class TestPresets:

  @pytest.mark.parametrize("algorithm", config_lib.ALGORITHMS)
  def test_every_preset_builds_a_valid_loss(self, algorithm):
    cfg = config_lib.apply_preset(algorithm)
    assert cfg.algorithm == algorithm
    loss = cfg.policy_loss_config()
    assert isinstance(loss, objectives.PolicyLossConfig)
    assert loss.surrogate == cfg.surrogate

  def test_dapo_is_clip_higher_token_mean_dynamic_no_kl(self):
    cfg = config_lib.apply_preset("dapo")
    assert (cfg.eps_low, cfg.eps_high) == (0.2, 0.28)
    assert cfg.aggregation == "token-mean"
    assert cfg.dynamic_sampling and cfg.kl_coef == 0.0

  def test_ppo_uses_a_critic_and_kl_in_reward(self):
    cfg = config_lib.apply_preset("ppo")
    assert cfg.uses_critic and cfg.kl_in_reward_coef > 0 and cfg.uses_reference

  def test_drgrpo_normalises_by_the_generation_budget(self):
    cfg = config_lib.apply_preset("drgrpo", max_new_tokens=77)
    assert cfg.policy_loss_config().norm_const == 77.0

  def test_explicit_override_beats_preset(self):
    cfg = config_lib.apply_preset("dapo", eps_high=0.3)
    assert cfg.eps_high == 0.3

  def test_unknown_override_field_is_named(self):
    with pytest.raises(ValueError, match="nonexistent"):
      config_lib.apply_preset("grpo", nonexistent=1)


class TestValidation:

  @pytest.mark.parametrize("field,value,match", [
      ("algorithm", "trpo", "algorithm='trpo'"),
      ("rollout_quant", "int4", "rollout_quant='int4'"),
      ("engine", "sglang", "engine='sglang'"),
      ("temperature", 0.0, "temperature=0.0"),
      ("top_p", 1.5, "top_p=1.5"),
      ("group_size", 0, "group_size=0"),
      ("uaq_scale", -1.0, "uaq_scale=-1.0"),
  ])
  def test_bad_values_name_the_field(self, field, value, match):
    with pytest.raises(ValueError, match=match):
      config_lib.TrainConfig(**{field: value})

  def test_group_methods_need_groups(self):
    with pytest.raises(ValueError, match="group_size >= 2"):
      config_lib.apply_preset("grpo", group_size=1)

  def test_minibatches_must_divide_the_batch(self):
    with pytest.raises(ValueError, match="minibatches=3"):
      config_lib.TrainConfig(prompts_per_step=4, group_size=2, minibatches=3)

  def test_micro_batches_must_divide_the_minibatch(self):
    with pytest.raises(ValueError, match="micro_batches=3"):
      config_lib.TrainConfig(prompts_per_step=4, group_size=2, micro_batches=3)

  def test_gspo_with_naive_correction_is_rejected(self):
    with pytest.raises(ValueError, match="gspo"):
      config_lib.apply_preset("gspo", correction="naive")

  def test_overlong_cache_must_fit(self):
    with pytest.raises(ValueError, match="overlong_cache_len"):
      config_lib.TrainConfig(overlong_max_len=10, overlong_cache_len=10)

  def test_replace_revalidates(self):
    cfg = config_lib.TrainConfig()
    with pytest.raises(ValueError, match="correction"):
      dataclasses.replace(cfg, correction="bogus")
