"""TrainConfig validation and the algorithm presets (no compute)."""

import dataclasses
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


class TestResolve:
  """One resolution order for flags, JSON files and grid cells."""

  def test_grid_cell_algorithm_gets_that_preset(self):
    # A GRPO script and a GRPO JSON base; the cell asks for DAPO.
    script = {"algorithm": "grpo", "run.steps": 5, "kl.coef": 1e-3}
    base = {
      "algorithm": "grpo",
      "kl": {"coef": 0.01},
      "loss": {"eps_high": 0.2},
      "rollout": {"prompts_per_step": 3},
    }
    cfg = config_lib.resolve("grpo", script, base, {}, {"algorithm": "dapo"})
    assert cfg.algorithm == "dapo"
    assert cfg.advantage.dynamic_sampling and cfg.loss.eps_high == 0.28
    assert cfg.kl.coef == 0.0
    # Fields the DAPO preset does not set still come from the base.
    assert (cfg.rollout.prompts_per_step, cfg.run.steps) == (3, 5)

  def test_preset_json_flags_grid_apply_in_the_documented_order(self):
    script = {"algorithm": "dapo", "loss.eps_high": 0.3, "run.steps": 5}
    json_base = {"loss": {"eps_high": 0.31}, "run": {"steps": 6}}
    typed = {"run.steps": 7, "rollout.top_p": 0.9}
    cfg = config_lib.resolve("dapo", script, json_base, typed, {})
    # preset 0.28 < script 0.3 < base 0.31; script 5 < base 6 < typed 7.
    assert (cfg.loss.eps_high, cfg.run.steps) == (0.31, 7)
    grid = {"run.steps": 8, "loss": {"eps_high": 0.4}}
    cfg = config_lib.resolve("dapo", script, json_base, typed, grid)
    # The grid cell is last; what it does not name stays from below it.
    assert (cfg.run.steps, cfg.loss.eps_high, cfg.rollout.top_p) == (
      8,
      0.4,
      0.9,
    )
    assert cfg.loss.eps_low == 0.2  # untouched: the preset's value

  def test_unnamed_layer_beats_preset_even_after_algorithm_change(self):
    # Typed flags that name no algorithm are meant for every cell.
    cfg = config_lib.resolve(
      "grpo", {"algorithm": "grpo"}, {}, {"kl.coef": 0.5}, {"algorithm": "dapo"}
    )
    assert cfg.kl.coef == 0.5 and cfg.advantage.dynamic_sampling

  def test_unknown_fields_of_every_layer_are_reported(self):
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.resolve("grpo", {"stepz": 1}, {"lr": 2})
    assert "--stepz=1" in str(e.value) and "--lr=2" in str(e.value)

  @pytest.mark.parametrize(
    "layer,name",
    [
      ({"loss.eps_hi": 0.3}, "loss.eps_hi"),
      ({"loss": {"eps_hi": 0.3}}, "loss.eps_hi"),
      ({"losses.eps_high": 0.3}, "losses.eps_high"),
    ],
  )
  def test_an_unknown_dotted_field_is_named(self, layer, name):
    with pytest.raises(config_lib.ConfigError) as e:
      config_lib.resolve("grpo", layer)
    assert [p.field for p in e.value.problems] == [name]
    assert f"--{name}=0.3" in str(e.value) and "loss.eps_high" in str(e.value)

  def test_nested_dotted_and_section_objects_are_one_config(self):
    dotted = config_lib.resolve(
      "grpo", {"loss.eps_high": 0.3, "rollout.quant": "none"}
    )
    nested = config_lib.resolve(
      "grpo", {"loss": {"eps_high": 0.3}, "rollout": {"quant": "none"}}
    )
    assert dotted == nested
    assert dotted.loss == dataclasses.replace(
      config_lib.resolve("grpo").loss, eps_high=0.3
    )

  def test_a_legacy_flat_key_resolves_to_the_same_config(self):
    legacy = {
      "eps_high": 0.28,
      "rollout_quant": "fp8",
      "model": "tiny",
      "critic_lambda": 0.9,
      "lr_schedule": "cosine",
      "adam_b1": 0.8,
      "mesh_shape": "1,2,1",
      "allow_config_change": "seed,eps_high",
    }
    new = {
      "loss.eps_high": 0.28,
      "rollout.quant": "fp8",
      "model.name": "tiny",
      "critic.gae_lambda": 0.9,
      "optim.schedule": "cosine",
      "optim.b1": 0.8,
      "mesh": {"data": 1, "fsdp": 2, "tensor": 1},
      "run.allow_config_change": "run.seed,loss.eps_high",
    }
    assert config_lib.resolve("grpo", legacy) == config_lib.resolve("grpo", new)

  def test_every_legacy_key_names_a_field(self):
    fields = set(config_lib.field_names())
    for old, new in config_lib.LEGACY_KEYS.items():
      assert new in fields or new in config_lib.SECTIONS, old

  def test_a_flat_config_json_of_an_older_rljax_loads(self, capsys):
    import json
    import os

    path = os.path.join(
      os.path.dirname(__file__),
      "../../docs/qurl/runs/q1_instrument/fp32_s0/config.json",
    )
    with open(path) as f:
      saved = json.load(f)
    cfg = config_lib.from_dict(saved, source="config.json")
    assert cfg.rollout.quant == saved["rollout_quant"]
    assert cfg.loss.correction == saved["correction"]
    assert cfg.model.name == saved["model"]
    assert "eps_high -> loss.eps_high" in capsys.readouterr().out


class TestRunDirectory:
  def test_the_resolved_config_round_trips_through_the_run_dir(self, tmp_path):
    import json

    from rljax.train import rundir as rundir_lib

    cfg = config_lib.resolve(
      "drgrpo",
      {
        "model.name": "tiny",
        "loss.eps_high": 0.3,
        "run.run_dir": str(tmp_path),
        "run.tensorboard": False,
      },
    )
    rundir_lib.RunDir(cfg).close()
    with open(tmp_path / rundir_lib.CONFIG_FILE) as f:
      saved = json.load(f)
    assert saved["loss"]["eps_high"] == 0.3  # nested by section
    assert saved["loss"]["norm_const"] == 32.0  # as resolved, not None
    assert config_lib.from_dict(saved) == cfg
    assert rundir_lib.config_changes(saved, cfg) == {}

  def test_resume_compares_dotted_fields_of_legacy_and_nested_configs(self):
    from rljax.train import rundir as rundir_lib

    legacy = {
      "algorithm": "drgrpo",
      "advantage": "drgrpo",  # the flat field, now advantage.estimator
      "eps_high": 0.2,
      "aggregation": "seq-mean-token-sum-norm",
    }
    cfg = config_lib.resolve(
      "drgrpo", {"loss.eps_high": 0.3, "run.allow_config_change": "loss"}
    )
    # norm_const: None in the flat file, filled in by both resolutions.
    assert rundir_lib.config_changes(legacy, cfg) == {
      "loss.eps_high": (0.2, 0.3)
    }
    assert rundir_lib.allowed_changes(cfg) >= {"loss.eps_high", "loss.tis_cap"}
    rundir_lib.check_resume_config(legacy, cfg, step=3)
    strict = cfg.replace({"run.allow_config_change": "eps_high"})  # old name
    rundir_lib.check_resume_config(legacy, strict, step=3)
    with pytest.raises(
      rundir_lib.ConfigChangeError,
      match="--run.allow_config_change=loss.eps_high",
    ):
      rundir_lib.check_resume_config(
        legacy, cfg.replace({"run.allow_config_change": ""}), step=3
      )
    with pytest.raises(ValueError, match="loss.eps_hi"):
      rundir_lib.allowed_changes(
        cfg.replace({"run.allow_config_change": "loss.eps_hi"})
      )


def _flag_config(argv, *script_defaults):
  from absl import flags

  from rljax.train import flags as train_flags

  fv = flags.FlagValues()
  train_flags.define_train_flags(*script_defaults, flag_values=fv)
  fv(["prog", *argv])
  return train_flags.config_from_flags(flag_values=fv)


class TestFlags:
  def test_a_dotted_flag_reaches_its_section(self):
    cfg = _flag_config(
      [
        "--loss.eps_high=0.28",
        "--rollout.quant=none",
        "--optim.b2=0.95",
        "--mesh.fsdp=2",
        "--noadvantage.dynamic_sampling",
        "--loss.dual_clip=3",
      ]
    )
    assert cfg.loss.eps_high == 0.28 and cfg.loss.dual_clip == 3.0
    assert cfg.rollout.quant == "none"
    assert cfg.optim.b2 == 0.95 and cfg.optim_config(critic=True).b2 == 0.95
    assert cfg.mesh.fsdp == 2
    assert not cfg.advantage.dynamic_sampling

  def test_every_field_has_its_flag(self):
    from absl import flags

    from rljax.train import flags as train_flags

    fv = flags.FlagValues()
    train_flags.define_train_flags(flag_values=fv)
    assert set(config_lib.field_names()) <= set(fv)
    assert "eps_high" not in fv  # one flag per field: no flat aliases

  def test_typed_flag_beats_preset_and_script_default(self):
    cfg = _flag_config(
      ["--loss.eps_high=0.5"], {"algorithm": "dapo", "loss.eps_high": 0.3}
    )
    assert cfg.loss.eps_high == 0.5 and cfg.advantage.dynamic_sampling

  def test_script_defaults_become_the_flag_defaults(self):
    from absl import flags

    from rljax.train import flags as train_flags

    fv = flags.FlagValues()
    train_flags.define_train_flags(
      {"loss": {"eps_high": 0.3}}, flag_values=fv, algorithm="dapo"
    )
    assert fv["loss.eps_high"].default == 0.3
    assert fv["algorithm"].default == "dapo"

  def test_unknown_script_default_is_named(self):
    from absl import flags

    from rljax.train import flags as train_flags

    with pytest.raises(ValueError, match="loss.eps_hi"):
      train_flags.define_train_flags(
        {"loss.eps_hi": 0.3}, flag_values=flags.FlagValues()
      )

  def test_other_algorithm_than_the_scripts_gets_its_preset(self):
    cfg = _flag_config(
      ["--algorithm=grpo"],
      {
        "algorithm": "dapo",
        "loss.eps_high": 0.28,
        "advantage.dynamic_sampling": True,
        "run.steps": 9,
      },
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
      (["--optim.b1=2"], "optim.b1"),
      (["--optim.b2=1"], "optim.b2"),
      (["--optim.weight_decay=-1"], "optim.weight_decay"),
      (["--update.entropy_coef=-5"], "update.entropy_coef"),
      (["--critic.value_clip=-1"], "critic.value_clip"),
      (["--optim.warmup_steps=-5"], "optim.warmup_steps"),
      (["--advantage.max_resample_rounds=-1"], "advantage.max_resample_rounds"),
      (["--task.reward_workers=-1"], "task.reward_workers"),
      (["--kl.coef=-1"], "kl.coef"),
      (["--optim.max_grad_norm=-1"], "optim.max_grad_norm"),
      (["--mesh.fsdp=0"], "mesh.fsdp"),
      (["--run.checkpoint_every=0"], "run.checkpoint_every"),
      (["--update.logprob_chunk=-1"], "update.logprob_chunk"),
      (["--task.max_prompt_tokens=1"], "task.max_prompt_tokens"),
      (["--task.name=foo"], "task.name"),
      (["--run.keep_checkpoints=0"], "run.keep_checkpoints"),
      (["--run.eval_every=1", "--task.eval_size=0"], "task.eval_size"),
      (["--task.name=gsm8k"], "task.data_path"),
      (["--task.difficulty=impossible"], "task.difficulty"),
      (["--loss.tis_cap=0.5"], "loss.tis_cap"),
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
          "--optim.b1=2",
          "--kl.coef=-1",
          "--mesh.data=0",
          "--update.logprob_chunk=-1",
          "--run.eval_every=1",
          "--task.eval_size=0",
        ]
      )
    assert {p.field for p in e.value.problems} == {
      "optim.b1",
      "kl.coef",
      "mesh.data",
      "update.logprob_chunk",
      "task.eval_size",
    }
    assert "5 problems" in str(e.value)
    assert "chunk_size" not in str(e.value)


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
  """Issue 43 items 12, 13, 17, 22: settings that made a run silently not
  what it said are refused by field, value and range before anything loads;
  the legitimate research settings among them are accepted with a note."""

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


def test_messages_name_dotted_flags_not_the_old_flat_ones():
  """Issue 43 item 20: a message, docstring or help text of the library or
  of a training script tells users a flag the CLI accepts (`--run.resume`,
  never the flat `--resume` that the CLI rejects)."""
  import ast
  import glob
  import os
  import re

  root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  scripts = (
    "main ppo_gsm8k dapo_math grpo_deepscaler reward_model_grpo "
    "reward_vrcli reward_judge ablate"
  ).split()
  files = glob.glob(os.path.join(root, "rljax", "**", "*.py"), recursive=True)
  files += [os.path.join(root, "experiments", f"{n}.py") for n in scripts]
  old = set(config_lib.LEGACY_KEYS) | {"resume", "run_dir"}
  # vLLM's own command-line flag, in a docstring that describes its launch.
  foreign = {("vllm_sidecar.py", "--model")}
  found = []
  for path in files:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        continue
      if re.fullmatch(r"--[\w-]+", node.value):
        continue  # one argv item of another program
      for m in re.finditer(r"(?<![\w.-])--(\w+)(?![\w.])", node.value):
        if m.group(1) in old:
          if (os.path.basename(path), m.group(0)) not in foreign:
            found.append(f"{os.path.relpath(path, root)}:{node.lineno} {m[0]}")
  assert not found, found
