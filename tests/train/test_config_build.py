"""How a TrainConfig is built and read back: `resolve`'s layers (presets,
script defaults, JSON, flags, grid cells), legacy flat keys, the run
directory's config.json, the command-line flags, and the flag names the
messages tell users (no compute)."""

import dataclasses

import pytest

from rljax.train import config as config_lib


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
    # PPO: a critic reads critic.gae_lambda (GRPO would refuse it unused).
    assert config_lib.resolve("ppo", legacy) == config_lib.resolve("ppo", new)

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

  # Each bad flag is named in the error, with its value and range.
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


def test_messages_name_dotted_flags_not_the_old_flat_ones():
  """A message, docstring or help text of the library or of a training
  script tells users a flag the CLI accepts (`--run.resume`, never the flat
  `--resume` that the CLI rejects)."""
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
