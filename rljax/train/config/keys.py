"""The key styles of a layer of settings: nested, dotted, and legacy flat.

A layer (flags, a JSON file, a grid cell, a saved config.json) may name a
field by its section ({"loss": {"eps_high": 0.28}}), by its dotted path
("loss.eps_high") or, as written before the sections existed, by a flat key
("eps_high"). `flatten` reads every style into {dotted field: value};
`LEGACY_KEYS` is the one table that reads the flat keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from rljax.train.config import sections

if TYPE_CHECKING:
  from rljax.train.config.train_config import TrainConfig

# Before the sections, every field was a top-level key (and a flag) of its
# own. Run directories (config.json, checkpoint metadata) and JSON configs
# written then still load: this table is the one place their keys are read.
LEGACY_KEYS: dict[str, str] = {
  "model": "model.name",
  "lora_rank": "model.lora_rank",
  "lora_alpha": "model.lora_alpha",
  "lora_dropout": "model.lora_dropout",
  "lora_targets": "model.lora_targets",
  "lora_base_dtype": "model.lora_base_dtype",
  "task": "task.name",
  "task_difficulty": "task.difficulty",
  "data_path": "task.data_path",
  "eval_size": "task.eval_size",
  "max_prompt_tokens": "task.max_prompt_tokens",
  "reward_workers": "task.reward_workers",
  "reward": "reward.name",
  "reward_model_path": "reward.model_path",
  "vrcli_reference": "reward.vrcli_reference",
  "vrcli_separator": "reward.vrcli_separator",
  "judge_url": "reward.judge_url",
  "judge_model": "reward.judge_model",
  "judge_rubrics": "reward.judge_rubrics",
  "judge_api": "reward.judge_api",
  "judge_timeout_s": "reward.judge_timeout_s",
  "judge_allow_remote": "reward.judge_allow_remote",
  "engine": "rollout.engine",
  "vllm_urls": "rollout.vllm_urls",
  "rollout_quant": "rollout.quant",
  "fake_quant": "rollout.fake_quant",
  "uaq_scale": "rollout.uaq_scale",
  "prompts_per_step": "rollout.prompts_per_step",
  "group_size": "rollout.group_size",
  "max_new_tokens": "rollout.max_new_tokens",
  "temperature": "rollout.temperature",
  "top_p": "rollout.top_p",
  "surrogate": "loss.surrogate",
  "correction": "loss.correction",
  "eps_low": "loss.eps_low",
  "eps_high": "loss.eps_high",
  "dual_clip": "loss.dual_clip",
  "tis_cap": "loss.tis_cap",
  "aggregation": "loss.aggregation",
  "norm_const": "loss.norm_const",
  "veto_threshold": "loss.veto_threshold",
  "kl_coef": "kl.coef",
  "kl_estimator": "kl.estimator",
  "kl_in_reward_coef": "kl.in_reward_coef",
  "advantage": "advantage.estimator",
  "gamma": "advantage.gamma",
  "gae_lambda": "advantage.gae_lambda",
  "vapo_alpha": "advantage.vapo_alpha",
  "dynamic_sampling": "advantage.dynamic_sampling",
  "max_resample_rounds": "advantage.max_resample_rounds",
  "overlong_shaping": "advantage.overlong_shaping",
  "overlong_max_len": "advantage.overlong_max_len",
  "overlong_cache_len": "advantage.overlong_cache_len",
  "overlong_filter": "advantage.overlong_filter",
  "critic_learning_rate": "critic.learning_rate",
  "critic_lambda": "critic.gae_lambda",
  "value_clip": "critic.value_clip",
  "value_coef": "critic.value_coef",
  "ppo_epochs": "update.ppo_epochs",
  "minibatches": "update.minibatches",
  "micro_batches": "update.micro_batches",
  "entropy_coef": "update.entropy_coef",
  "remat": "update.remat",
  "logprob_chunk": "update.logprob_chunk",
  "learning_rate": "optim.learning_rate",
  "warmup_steps": "optim.warmup_steps",
  "lr_schedule": "optim.schedule",
  "weight_decay": "optim.weight_decay",
  "max_grad_norm": "optim.max_grad_norm",
  "adam_b1": "optim.b1",
  "adam_b2": "optim.b2",
  "mesh_shape": "mesh",  # "data,fsdp,tensor" -> mesh.data/fsdp/tensor
  "steps": "run.steps",
  "seed": "run.seed",
  "run_dir": "run.run_dir",
  "checkpoint_every": "run.checkpoint_every",
  "keep_checkpoints": "run.keep_checkpoints",
  "resume": "run.resume",
  "allow_config_change": "run.allow_config_change",
  "eval_every": "run.eval_every",
  "export_hf": "run.export_hf",
  "tensorboard": "run.tensorboard",
  "pipelined": "run.pipelined",
  "max_staleness": "run.max_staleness",
}


def align_async_mode(layer: Mapping[str, Any]) -> dict[str, Any]:
  """A dotted layer in which `run.pipelined` (the older flag) and
  `run.async_mode` agree: a layer naming one of them sets both
  (pipelined=True <-> async_mode="one_step"), so the later of two layers
  wins whichever spelling each used. A layer naming both is returned as it
  is: when they disagree, validation reports it. A value of the wrong type
  is left for the field's rule to report."""
  out = dict(layer)
  has_flag, has_mode = "run.pipelined" in out, "run.async_mode" in out
  if has_flag and not has_mode and isinstance(out["run.pipelined"], bool):
    out["run.async_mode"] = "one_step" if out["run.pipelined"] else "off"
  elif has_mode and not has_flag and isinstance(out["run.async_mode"], str):
    out["run.pipelined"] = out["run.async_mode"] == "one_step"
  return out


def _legacy_item(key: str, value: Any) -> dict[str, Any]:
  if key == "mesh_shape":
    parts = str(value).split(",")
    if len(parts) == 3 and all(p.strip().lstrip("-").isdigit() for p in parts):
      return dict(
        zip(("mesh.data", "mesh.fsdp", "mesh.tensor"), map(int, parts))
      )
    return {"mesh_shape": value}  # reported: not a field
  if key == "allow_config_change" and isinstance(value, str):
    value = ",".join(legacy_name(n.strip()) for n in value.split(",") if n)
  return {LEGACY_KEYS[key]: value}


def legacy_name(name: str) -> str:
  """The dotted name of a field named the old flat way (else `name`)."""
  if name in LEGACY_KEYS and LEGACY_KEYS[name] != "mesh":
    return LEGACY_KEYS[name]
  return name


def _is_section_value(key: str, value: Any) -> bool:
  return key in sections.SECTIONS and (
    isinstance(value, Mapping) or isinstance(value, sections.SECTIONS[key])
  )


def flatten(
  layer: Mapping[str, Any] | TrainConfig, source: str = ""
) -> dict[str, Any]:
  """{dotted field: value} of a layer with nested, dotted or legacy keys.

  A section may be given as a mapping or as its dataclass; a flat legacy
  key (`eps_high`, `model="tiny"`) is read through `LEGACY_KEYS`, and when
  `source` names a file, a note says which keys were translated. Unknown
  keys are kept as they are, for `resolve` to report.
  """
  if not isinstance(layer, Mapping):  # a TrainConfig
    return to_flat(layer)
  out, legacy = {}, []
  for key, value in layer.items():
    if _is_section_value(key, value):
      items = (
        value.items()
        if isinstance(value, Mapping)
        else (
          (f.name, getattr(value, f.name)) for f in sections.fields(type(value))
        )
      )
      for sub, v in items:
        out[f"{key}.{sub}"] = v
    elif key in LEGACY_KEYS and "." not in key:
      legacy.append(key)
      out.update(_legacy_item(key, value))
    else:
      out[key] = value
  if legacy and source:
    print(
      f"[rljax] {source}: read the flat keys of an older rljax as "
      + ", ".join(f"{k} -> {LEGACY_KEYS[k]}" for k in legacy),
      flush=True,
    )
  return out


def to_flat(cfg: TrainConfig) -> dict[str, Any]:
  """{dotted field: value} of a config (`field_names()` order)."""
  out = {"algorithm": cfg.algorithm}
  for name in sections.SECTIONS:
    section = getattr(cfg, name)
    for f in sections.fields(sections.SECTIONS[name]):
      out[f"{name}.{f.name}"] = getattr(section, f.name)
  return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  """{dotted: value} -> {section: {field: value}} (JSON files, errors)."""
  out: dict[str, Any] = {}
  for key, value in flat.items():
    head, _, tail = key.partition(".")
    if tail:
      out.setdefault(head, {})[tail] = value
    else:
      out[key] = value
  return out


def lookup(layer: Mapping[str, Any], name: str, default: Any = None) -> Any:
  """The value of dotted field `name` in a layer of any key style."""
  return flatten(layer).get(name, default)
