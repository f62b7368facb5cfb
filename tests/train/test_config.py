"""TrainConfig validation and the algorithm presets (no compute)."""

import pytest

from rljax.core import objectives
from rljax.train import config as config_lib


class TestPresets:
  @pytest.mark.parametrize("algorithm", config_lib.ALGORITHMS)
  def test_every_preset_builds_a_valid_loss(self, algorithm):
    cfg = config_lib.apply_preset(algorithm)
    assert cfg.algorithm == algorithm
    loss = cfg.loss
    assert isinstance(loss, objectives.PolicyLossConfig)
    assert loss.surrogate == cfg.loss.surrogate

  def test_dapo_is_clip_higher_token_mean_dynamic_no_kl(self):
    cfg = config_lib.apply_preset("dapo")
    assert (cfg.loss.eps_low, cfg.loss.eps_high) == (0.2, 0.28)
    assert cfg.loss.aggregation == "token-mean"
    assert cfg.advantage.dynamic_sampling and cfg.kl.coef == 0.0

  def test_ppo_uses_a_critic_and_kl_in_reward(self):
    cfg = config_lib.apply_preset("ppo")
    assert cfg.uses_critic and cfg.kl.in_reward_coef > 0 and cfg.uses_reference

  def test_drgrpo_normalises_by_the_generation_budget(self):
    cfg = config_lib.apply_preset("drgrpo", {"rollout.max_new_tokens": 77})
    assert cfg.loss.norm_const == 77.0

  def test_explicit_override_beats_preset(self):
    cfg = config_lib.apply_preset("dapo", {"loss.eps_high": 0.3})
    assert cfg.loss.eps_high == 0.3

  def test_unknown_override_field_is_named(self):
    with pytest.raises(ValueError, match="nonexistent"):
      config_lib.apply_preset("grpo", nonexistent=1)


class TestValidation:
  @pytest.mark.parametrize(
    "field,value,match",
    [
      ("algorithm", "trpo", "algorithm='trpo'"),
      ("rollout_quant", "int4", "rollout_quant='int4'"),
      ("engine", "sglang", "engine='sglang'"),
      ("temperature", 0.0, "temperature=0.0"),
      ("top_p", 1.5, "top_p=1.5"),
      ("group_size", 0, "group_size=0"),
      ("uaq_scale", -1.0, "uaq_scale=-1.0"),
    ],
  )
  def test_bad_values_name_the_field(self, field, value, match):
    with pytest.raises(ValueError, match=match):
      config_lib.TrainConfig(**{field: value})

  def test_group_methods_need_groups(self):
    with pytest.raises(ValueError, match="group_size >= 2"):
      config_lib.apply_preset("grpo", {"rollout.group_size": 1})

  def test_minibatches_must_divide_the_batch(self):
    with pytest.raises(ValueError, match="minibatches=3"):
      config_lib.TrainConfig(prompts_per_step=4, group_size=2, minibatches=3)

  def test_micro_batches_must_divide_the_minibatch(self):
    with pytest.raises(ValueError, match="micro_batches=3"):
      config_lib.TrainConfig(prompts_per_step=4, group_size=2, micro_batches=3)

  def test_gspo_with_naive_correction_is_rejected(self):
    with pytest.raises(ValueError, match="gspo"):
      config_lib.apply_preset("gspo", {"loss.correction": "naive"})

  def test_overlong_cache_must_fit(self):
    with pytest.raises(ValueError, match="overlong_cache_len"):
      config_lib.TrainConfig(overlong_max_len=10, overlong_cache_len=10)

  def test_replace_revalidates(self):
    cfg = config_lib.TrainConfig()
    with pytest.raises(ValueError, match="correction"):
      cfg.replace({"loss.correction": "bogus"})


class TestResolve:
  """One resolution order for flags, JSON files and grid cells."""

  def test_grid_cell_algorithm_gets_that_preset(self):
    # A GRPO script and a GRPO JSON base; the cell asks for DAPO.
    script = {"algorithm": "grpo", "steps": 5, "kl_coef": 1e-3}
    base = {
      "algorithm": "grpo",
      "kl_coef": 0.01,
      "eps_high": 0.2,
      "prompts_per_step": 3,
    }
    cfg = config_lib.resolve("grpo", script, base, {}, {"algorithm": "dapo"})
    assert cfg.algorithm == "dapo"
    assert cfg.advantage.dynamic_sampling and cfg.loss.eps_high == 0.28
    assert cfg.kl.coef == 0.0
    # Fields the DAPO preset does not set still come from the base.
    assert (cfg.rollout.prompts_per_step, cfg.run.steps) == (3, 5)

  def test_layers_apply_in_the_documented_order(self):
    script = {"algorithm": "dapo", "eps_high": 0.3, "steps": 5}
    base = {"eps_high": 0.31, "steps": 6}
    typed = {"steps": 7}
    cfg = config_lib.resolve("dapo", script, base, typed, {})
    # preset 0.28 < script 0.3 < base 0.31; script 5 < base 6 < typed 7.
    assert (cfg.loss.eps_high, cfg.run.steps) == (0.31, 7)
    cfg = config_lib.resolve("dapo", script, base, typed, {"steps": 8})
    assert cfg.run.steps == 8  # the grid cell is last

  def test_unnamed_layer_beats_preset_even_after_algorithm_change(self):
    # Typed flags that name no algorithm are meant for every cell.
    cfg = config_lib.resolve(
      "grpo", {"algorithm": "grpo"}, {}, {"kl_coef": 0.5}, {"algorithm": "dapo"}
    )
    assert cfg.kl.coef == 0.5 and cfg.advantage.dynamic_sampling

  def test_unknown_fields_of_every_layer_are_reported(self):
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.resolve("grpo", {"stepz": 1}, {"lr": 2})
    assert "--stepz=1" in str(e.value) and "--lr=2" in str(e.value)


def _flag_config(argv, **script_defaults):
  from absl import flags
  from rljax.train import flags as train_flags

  fv = flags.FlagValues()
  train_flags.define_train_flags(fv, **script_defaults)
  fv(["prog", *argv])
  return train_flags.config_from_flags(flag_values=fv)


class TestFlags:
  def test_typed_flag_beats_preset_and_script_default(self):
    cfg = _flag_config(["--eps_high=0.5"], algorithm="dapo", eps_high=0.3)
    assert cfg.loss.eps_high == 0.5 and cfg.advantage.dynamic_sampling

  def test_other_algorithm_than_the_scripts_gets_its_preset(self):
    cfg = _flag_config(
      ["--algorithm=grpo"],
      algorithm="dapo",
      eps_high=0.28,
      dynamic_sampling=True,
      steps=9,
    )
    assert (cfg.loss.eps_high, cfg.advantage.dynamic_sampling, cfg.kl.coef) == (
      0.2,
      False,
      1e-3,
    )
    assert cfg.run.steps == 9

  # Each bad flag of issue 16 item 7, named in the error.
  @pytest.mark.parametrize(
    "argv,field",
    [
      (["--adam_b1=2"], "adam_b1"),
      (["--adam_b2=1"], "adam_b2"),
      (["--weight_decay=-1"], "weight_decay"),
      (["--entropy_coef=-5"], "entropy_coef"),
      (["--value_clip=-1"], "value_clip"),
      (["--warmup_steps=-5"], "warmup_steps"),
      (["--max_resample_rounds=-1"], "max_resample_rounds"),
      (["--reward_workers=-1"], "reward_workers"),
      (["--kl_coef=-1"], "kl_coef"),
      (["--max_grad_norm=-1"], "max_grad_norm"),
      (["--mesh_shape=foo"], "mesh_shape"),
      (["--checkpoint_every=0"], "checkpoint_every"),
      (["--logprob_chunk=-1"], "logprob_chunk"),
      (["--max_prompt_tokens=1"], "max_prompt_tokens"),
      (["--task=foo"], "task"),
      (["--keep_checkpoints=0"], "keep_checkpoints"),
      (["--eval_every=1", "--eval_size=0"], "eval_size"),
      (["--task=gsm8k"], "data_path"),
      (["--task_difficulty=impossible"], "task_difficulty"),
    ],
  )
  def test_bad_flag_is_named_with_value_and_range(self, argv, field):
    with pytest.raises(config_lib.ConfigError) as e:
      _flag_config(argv)
    assert [p.field for p in e.value.problems] == [field]
    assert f"--{field}=" in str(e.value) and "expected" in str(e.value)

  def test_several_bad_flags_are_reported_together(self):
    with pytest.raises(config_lib.ConfigError) as e:
      _flag_config(
        [
          "--adam_b1=2",
          "--kl_coef=-1",
          "--mesh_shape=foo",
          "--logprob_chunk=-1",
          "--eval_every=1",
          "--eval_size=0",
        ]
      )
    assert {p.field for p in e.value.problems} == {
      "adam_b1",
      "kl_coef",
      "mesh_shape",
      "logprob_chunk",
      "eval_size",
    }
    assert "5 problems" in str(e.value)
    assert "chunk_size" not in str(e.value)


def test_every_numeric_field_has_a_rule():
  """A new numeric field must say its range in FIELD_RULES."""
  import typing

  hints = typing.get_type_hints(config_lib.TrainConfig)
  numeric = [
    n
    for n in config_lib.field_names()
    if hints[n] in (int, float, float | None)
  ]
  missing = [n for n in numeric if n not in config_lib.FIELD_RULES]
  assert not missing, f"add a rule to config.FIELD_RULES for {missing}"


def test_wrong_type_is_a_problem_not_a_crash():
  with pytest.raises(config_lib.ConfigError, match="--steps='3'"):
    config_lib.TrainConfig(steps="3")
