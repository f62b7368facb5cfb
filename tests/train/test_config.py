"""The algorithm presets and the checks of a TrainConfig's values: each
field's rule, the checks over several fields, the settings refused as
silent no-ops, and the notes on research settings (no compute)."""

import math

import numpy as np
import pytest

from rljax.core import _validation
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
      ("algorithm", "trpo", "--algorithm='trpo'"),
      ("rollout.quant", "int4", "--rollout.quant='int4'"),
      ("rollout.engine", "sglang", "--rollout.engine='sglang'"),
      ("rollout.temperature", 0.0, "--rollout.temperature=0.0"),
      ("rollout.top_p", 1.5, "--rollout.top_p=1.5"),
      ("rollout.group_size", 0, "--rollout.group_size=0"),
      ("rollout.uaq_scale", -1.0, "--rollout.uaq_scale=-1.0"),
    ],
  )
  def test_bad_values_name_the_field(self, field, value, match):
    with pytest.raises(config_lib.ConfigError, match=match):
      config_lib.resolve("grpo", {field: value})

  def test_a_section_built_by_hand_is_validated_by_dotted_name(self):
    with pytest.raises(config_lib.ConfigError, match="--rollout.top_p=1.5"):
      config_lib.TrainConfig(rollout=config_lib.RolloutConfig(top_p=1.5))

  def test_a_section_of_the_wrong_type_is_named(self):
    with pytest.raises(config_lib.ConfigError, match="--loss=.*PolicyLoss"):
      config_lib.TrainConfig(loss={"eps_high": 0.3})

  def test_cores_own_check_is_reported_by_dotted_field(self):
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.resolve(
        "grpo", {"loss.surrogate": "cispo", "loss.dual_clip": 3.0}
      )
    assert [p.field for p in e.value.problems] == ["loss.dual_clip"]

  def test_group_methods_need_groups(self):
    with pytest.raises(ValueError, match="group_size >= 2"):
      config_lib.apply_preset("grpo", {"rollout.group_size": 1})

  def test_minibatches_must_divide_the_batch(self):
    with pytest.raises(ValueError, match="--update.minibatches=3"):
      config_lib.resolve(
        "grpo",
        {
          "rollout.prompts_per_step": 4,
          "rollout.group_size": 2,
          "update.minibatches": 3,
        },
      )

  def test_micro_batches_must_divide_the_minibatch(self):
    with pytest.raises(ValueError, match="--update.micro_batches=3"):
      config_lib.resolve(
        "grpo",
        {
          "rollout.prompts_per_step": 4,
          "rollout.group_size": 2,
          "update.micro_batches": 3,
        },
      )

  def test_gspo_with_naive_correction_is_rejected(self):
    with pytest.raises(ValueError, match="gspo"):
      config_lib.apply_preset("gspo", {"loss.correction": "naive"})

  def test_overlong_cache_must_fit(self):
    with pytest.raises(ValueError, match="--advantage.overlong_cache_len"):
      config_lib.resolve(
        "grpo",
        {"advantage": {"overlong_max_len": 10, "overlong_cache_len": 10}},
      )

  def test_replace_revalidates(self):
    cfg = config_lib.TrainConfig()
    with pytest.raises(ValueError, match="correction"):
      cfg.replace({"loss.correction": "bogus"})


def test_every_numeric_field_has_a_rule():
  """A new numeric field must say its range in FIELD_RULES."""
  numeric = [
    n
    for n in config_lib.field_names()
    if config_lib.field_type(n) in (int, float, float | None)
  ]
  missing = [n for n in numeric if n not in config_lib.FIELD_RULES]
  assert not missing, f"add a rule to config.FIELD_RULES for {missing}"


def test_wrong_type_is_a_problem_not_a_crash():
  with pytest.raises(config_lib.ConfigError, match="--run.steps='3'"):
    config_lib.resolve("grpo", {"run.steps": "3"})
  with pytest.raises(config_lib.ConfigError, match="--run.steps='3'"):
    config_lib.TrainConfig(run=config_lib.RunConfig(steps="3"))


def test_the_trainer_gets_cores_loss_config_itself():
  cfg = config_lib.resolve("dapo")
  assert type(cfg.loss) is objectives.PolicyLossConfig
  assert config_lib.SECTIONS["loss"] is objectives.PolicyLossConfig


def test_a_problem_is_worded_by_cores_field_message():
  # One wording of a bad setting for every config of rljax.
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.resolve("grpo", {"rollout.top_p": 1.5})
  line = _validation.field_message(
    "--rollout.top_p", 1.5, "a value in (0.0, 1.0]"
  )
  assert str(e.value).splitlines()[1:] == [f"  {line}"]


def test_numpy_scalars_are_refused_as_config_json_cannot_hold_them():
  with pytest.raises(config_lib.ConfigError, match="--run.steps=3; expected"):
    config_lib.resolve("grpo", {"run.steps": np.int64(3)})


def test_a_cross_check_that_cannot_run_does_not_hide_the_others():
  # update.minibatches of the wrong type breaks the batch-size check; the
  # GSPO correction check still reports its own problem.
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.apply_preset(
      "gspo", {"update.minibatches": "2", "loss.correction": "naive"}
    )
  assert [p.field for p in e.value.problems] == [
    "update.minibatches",
    "loss.correction",
  ]


class TestSilentSettings:
  """Settings that would make a run silently not what it says (out of
  range, infinite, or a no-op because of another field) are refused by
  field, value and range before anything loads; the legitimate research
  settings among them are accepted with a note."""

  @pytest.mark.parametrize(
    "layer,field",
    [
      ({"loss.eps_low": 1.5}, "loss.eps_low"),
      ({"rollout.temperature": 1e-30}, "rollout.temperature"),
      ({"rollout.uaq_scale": 1e-30}, "rollout.uaq_scale"),
      (
        {"rollout.fake_quant": True, "rollout.quant": "none"},
        "rollout.fake_quant",
      ),
      ({"run.max_staleness": 3}, "run.max_staleness"),
      (
        {"advantage.estimator": "gae", "critic.value_coef": 0.0},
        "critic.value_coef",
      ),
      ({"rollout.vllm_urls": "http://127.0.0.1:8000"}, "rollout.vllm_urls"),
      ({"optim.weight_decay": float("inf")}, "optim.weight_decay"),
      ({"kl.coef": float("inf")}, "kl.coef"),
      ({"update.entropy_coef": float("inf")}, "update.entropy_coef"),
      ({"model.lora_alpha": float("inf")}, "model.lora_alpha"),
      ({"optim.learning_rate": float("nan")}, "optim.learning_rate"),
      ({"run.seed": 99999999999999999999}, "run.seed"),
      ({"run.run_dir": ""}, "run.run_dir"),
      ({"task.reward_workers": 1000}, "task.reward_workers"),
    ],
  )
  def test_refused_with_field_value_and_range(self, layer, field):
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.resolve("grpo", layer)
    assert [p.field for p in e.value.problems] == [field]
    assert f"--{field}=" in str(e.value) and "expected" in str(e.value)

  def test_every_float_field_is_finite_unless_documented(self):
    floats = [
      n
      for n in config_lib.field_names()
      if config_lib.field_type(n) in (float, float | None)
    ]
    for name in floats:
      problems = config_lib.validation.field_problems(name, math.inf)
      assert bool(problems) != (name in config_lib.validation.INF_ALLOWED), name

  def test_pipelined_staleness_and_a_vllm_url_on_loopback_pass(self):
    cfg = config_lib.resolve(
      "grpo",
      {
        "run.pipelined": True,
        "run.max_staleness": 3,
        "rollout.engine": "vllm",
        "rollout.vllm_urls": "http://127.0.0.1:8000,http://localhost:8001",
      },
    )
    assert cfg.run.max_staleness == 3

  def test_a_remote_engine_url_needs_the_allow_flag(self):
    layer = {
      "rollout.engine": "vllm",
      "rollout.vllm_urls": "http://10.1.2.3:80",
    }
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.resolve("grpo", layer)
    assert [p.field for p in e.value.problems] == ["rollout.vllm_urls"]
    assert "--rollout.vllm_allow_remote" in str(e.value)
    assert "10.1.2.3" in str(e.value)
    layer["rollout.vllm_allow_remote"] = True
    assert config_lib.resolve("grpo", layer).rollout.vllm_allow_remote

  @pytest.mark.parametrize(
    "layer,words",
    [
      ({"loss.eps_high": math.inf}, "--loss.eps_high=inf"),
      ({"loss.eps_low": math.inf}, "--loss.eps_low=inf"),
      ({"optim.learning_rate": 0.0}, "--optim.learning_rate=0"),
    ],
  )
  def test_research_settings_are_accepted_with_a_note(self, layer, words):
    assert config_lib.notes(config_lib.resolve("grpo")) == []
    (note,) = config_lib.notes(config_lib.resolve("grpo", layer))
    assert note.startswith(words)

  def test_model_bounds_lora_rank_and_the_generation_length(self):
    from rljax.models import config as model_config_lib

    smollm2 = model_config_lib.tiny_config(
      hidden_size=576, max_position_embeddings=8192
    )
    ok = config_lib.resolve("grpo", {"model.lora_rank": 64})
    assert config_lib.model_problems(ok, smollm2) == []
    for layer, field in [
      ({"model.lora_rank": 100000}, "model.lora_rank"),
      ({"rollout.max_new_tokens": 100000}, "rollout.max_new_tokens"),
      # the prompt bound and the generation together past the context
      (
        {"rollout.max_new_tokens": 8100, "task.max_prompt_tokens": 128},
        "rollout.max_new_tokens",
      ),
    ]:
      problems = config_lib.model_problems(
        config_lib.resolve("grpo", layer), smollm2
      )
      assert [p.field for p in problems] == [field], layer
      assert "8192" in str(problems[0]) or "576" in str(problems[0])


class TestSettingsNothingReads:
  """A setting that the rest of the config leaves unread (a data file of
  a generated task, a tool field of a task without tools, a critic field
  where no critic trains) is refused by field and value, with what reads
  it: accepted, the run's config.json would record what it never did."""

  @pytest.mark.parametrize(
    "task", ["arithmetic", "countdown", "tool_arithmetic"]
  )
  def test_a_data_file_of_a_generated_task(self, task):
    layer = {"task.name": task, "task.data_path": "/no/such.jsonl"}
    if task == "tool_arithmetic":
      layer["task.max_prompt_tokens"] = 128
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.resolve("grpo", layer)
    assert [p.field for p in e.value.problems] == ["task.data_path"]
    assert "--task.data_path='/no/such.jsonl'; expected ''" in str(e.value)
    assert "the task generates its problems" in str(e.value)
    assert "dataset tasks" in str(e.value) and "gsm8k" in str(e.value)
    # A dataset task reads it.
    cfg = config_lib.resolve(
      "grpo", {"task.name": "gsm8k", "task.data_path": "/x.jsonl"}
    )
    assert cfg.task.data_path == "/x.jsonl"

  @pytest.mark.parametrize(
    "field,value",
    [
      ("task.tool", "python"),
      ("task.tool_format", "qwen"),
      ("task.tool_prompt", "example"),
      ("task.tool_choice", "required"),
      ("task.max_turns", 2),
      ("task.max_turn_tokens", 16),
    ],
  )
  def test_a_tool_field_of_a_task_without_tools(self, field, value):
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.resolve("grpo", {field: value})
    assert [p.field for p in e.value.problems] == [field]
    default = config_lib.field_default(field)
    assert f"--{field}={value!r}; expected {default!r}" in str(e.value)
    assert "only tool tasks (tool_arithmetic)" in str(e.value)
    # The tool task reads it.
    tool = {
      "task.name": "tool_arithmetic",
      "task.max_prompt_tokens": 128,
      field: value,
    }
    assert config_lib.lookup(config_lib.resolve("grpo", tool), field) == value

  @pytest.mark.parametrize(
    "field,value",
    [
      ("critic.pretrain_steps", 5),
      ("critic.learning_rate", 1e-3),
      ("critic.gae_lambda", 0.9),
      ("critic.value_clip", 0.3),
      ("critic.value_coef", 1.0),
    ],
  )
  def test_a_critic_field_without_a_critic(self, field, value):
    for algorithm in ("grpo", "dapo", "rloo"):
      with pytest.raises(config_lib.ConfigError) as e:
        config_lib.resolve(algorithm, {field: value})
      assert [p.field for p in e.value.problems] == [field]
      assert f"--{field}={value!r}; expected" in str(e.value)
      assert "an algorithm with a critic (ppo, vapo, orz)" in str(e.value)
    for algorithm in ("ppo", "vapo", "orz"):
      cfg = config_lib.resolve(algorithm, {field: value})
      assert config_lib.lookup(cfg, field) == value

  def test_a_critic_presets_values_are_not_typed_values(self):
    # PPO's preset sets critic.gae_lambda=0.95; without its critic that
    # value was not typed, and is not refused.
    cfg = config_lib.resolve("ppo", {"advantage.estimator": "grpo"})
    assert not cfg.uses_critic and cfg.critic.gae_lambda == 0.95


class TestBoundsBeforeAnythingLoads:
  """Values that would fail late (an allocation in the first rollout, a
  held-out set prepared for minutes) are bounded by the config."""

  def test_a_kv_page_no_longer_than_a_row(self):
    layer = {
      "rollout.batching": "continuous",
      "task.max_prompt_tokens": 100,
      "rollout.max_new_tokens": 60,
    }
    ok = config_lib.resolve("grpo", layer, {"rollout.kv_page_size": 160})
    assert ok.rollout.kv_page_size == 160
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.resolve("grpo", layer, {"rollout.kv_page_size": 10**9})
    assert [p.field for p in e.value.problems] == ["rollout.kv_page_size"]
    assert "--rollout.kv_page_size=1000000000; expected <= 160" in str(e.value)
    assert "task.max_prompt_tokens=100 + rollout.max_new_tokens=60" in str(
      e.value
    )

  @pytest.mark.parametrize(
    "task", ["arithmetic", "countdown", "tool_arithmetic"]
  )
  def test_a_generated_held_out_set_within_the_training_pool(self, task):
    from rljax.train.tasks import GENERATED_POOL

    layer = {"task.name": task, "task.max_prompt_tokens": 128}
    cfg = config_lib.resolve("grpo", layer, {"task.eval_size": GENERATED_POOL})
    assert cfg.task.eval_size == GENERATED_POOL
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.resolve("grpo", layer, {"task.eval_size": 10**6})
    assert [p.field for p in e.value.problems] == ["task.eval_size"]
    assert f"--task.eval_size=1000000; expected <= {GENERATED_POOL}" in str(
      e.value
    )
    # A dataset's held-out rows are bounded by its file (read at start).
    big = {"task.name": "gsm8k", "task.data_path": "/x.jsonl"}
    assert config_lib.resolve("grpo", big, {"task.eval_size": 10**6})
