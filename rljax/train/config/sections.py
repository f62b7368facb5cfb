"""Training configuration: nested frozen sections and the algorithm presets.

A run is fully described by one `TrainConfig`, a composition of small frozen
sections. Each section groups the settings one part of the trainer reads:

  algorithm  the preset name (the only top-level value)
  model      PolicyModelConfig: which model is trained, and LoRA
  task       TaskConfig: prompts (generated task or dataset), held-out size
  reward     RewardConfig: verifier, or a learned / likelihood / judge reward
  rollout    RolloutConfig: engine, quantized actor, UAQ, sampling
  loss       core's `objectives.PolicyLossConfig` itself: the trainer passes
             `cfg.loss` straight to `rljax.core`
  kl         KLConfig: KL to the reference, as loss term or reward penalty
  advantage  AdvantageConfig: estimator, γ/λ, dynamic sampling, overlong
  critic     CriticConfig: PPO/VAPO value model (its λ, clip, rate)
  update     UpdateConfig: epochs, minibatches, entropy bonus, memory knobs
  optim      `optim.OptimConfig`: the policy's AdamW (the critic's is
             `cfg.optim_config(critic=True)`: same betas, its own rate)
  mesh       `models.sharding.MeshConfig`: the device mesh
  run        RunConfig: length, seed, run directory, checkpoints, logging

A setting is named by its dotted path, `loss.eps_high`; that is its flag
(`--loss.eps_high=0.28`, train/flags.py), its key in JSON configs and
`--grid` axes (nested objects or dotted keys), and its name in errors and in
`--run.allow_config_change`. Every algorithm of the seeds is a named preset
that only sets fields, so an ablation is a grid over field values.
`resolve` is the one way from presets, script defaults, JSON files, flags
and grid cells to a config (its docstring has the order), and `validate`
reports every bad value at once, before anything is loaded.

Run directories and JSON files written before the sections existed use flat
keys (`eps_high`); `LEGACY_KEYS` is the one mapping that reads them.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Callable, Mapping, Sequence

from rljax.core import aggregation as aggregation_lib
from rljax.core import objectives
from rljax.models.sharding import MeshConfig
from rljax.train.optim import OptimConfig

ALGORITHMS = (
  "reinforce",
  "ppo",
  "grpo",
  "drgrpo",
  "rloo",
  "reinforce_pp",
  "dapo",
  "cispo",
  "gspo",
  "vapo",
  "olmo3",
)
ADVANTAGE_ESTIMATORS = (
  "grpo",
  "drgrpo",
  "rloo",
  "reinforce_pp",
  "reinforce_pp_baseline",
  "reinforce",
  "gae",
)
ROLLOUT_QUANT = ("none", "bf16", "int8", "int8_wo", "fp8")
ENGINES = ("jax", "vllm")
REWARDS = ("verifier", "reward_model", "vrcli", "judge")

PolicyLossConfig = objectives.PolicyLossConfig


# ------------------------------------------------------------------ sections


@dataclasses.dataclass(frozen=True)
class PolicyModelConfig:
  """The model trained (name, HF dir, .gguf, or "tiny") and its LoRA.

  lora_rank 0 trains every weight (rljax/models/lora.py)."""

  name: str = "smollm2-135m-instruct"
  lora_rank: int = 0
  lora_alpha: float = 32.0
  lora_dropout: float = 0.0
  lora_targets: str = "all"  # all | attn | mlp | q_proj,v_proj,...
  lora_base_dtype: str = "float32"  # frozen base: float32|bfloat16|int8


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """The prompts: a generated task or a dataset, and the held-out split."""

  name: str = "arithmetic"  # generated task, or a dataset spec
  difficulty: str = "easy"
  data_path: str = ""  # JSONL/Parquet for dataset tasks
  eval_size: int = 64  # held-out prompts (never trained on)
  max_prompt_tokens: int = 128
  reward_workers: int = 1  # verifier processes; 0 = in-process


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """The training reward (`rljax.train.tasks.build_reward`): the task's
  verifier, or a learned, likelihood or judge reward in its place."""

  name: str = "verifier"  # verifier|reward_model|vrcli|judge
  model_path: str = ""  # train_reward_model.py output dir
  vrcli_reference: str = ""  # frozen reference; "" = model.name
  vrcli_separator: str = "\n"  # between reasoning and gold y
  judge_url: str = "http://127.0.0.1:8000"  # OpenAI-compatible server
  judge_model: str = ""  # "" = the server's first model
  judge_rubrics: str = ""  # rubric file; "" = correctness
  judge_api: str = "completions"  # completions|chat (chat template)
  judge_timeout_s: float = 30.0
  judge_allow_remote: bool = False  # else loopback only


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """The actor: engine, its (quantized) weights, and how it samples."""

  engine: str = "jax"
  vllm_urls: str = ""  # comma-separated; empty: start one
  quant: str = "int8"
  fake_quant: bool = False
  uaq_scale: float = 1.5  # 1.0 disables update-aware scaling
  prompts_per_step: int = 8
  group_size: int = 8
  max_new_tokens: int = 32
  temperature: float = 1.0
  top_p: float = 1.0


@dataclasses.dataclass(frozen=True)
class KLConfig:
  """KL to the reference policy: a loss term and/or a reward penalty."""

  coef: float = 0.0  # KL-to-reference as a loss term
  estimator: str = "k3"
  in_reward_coef: float = 0.0  # KL-to-reference as reward penalty


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  """From rewards to advantages, and which groups are kept."""

  estimator: str = "grpo"
  gamma: float = 1.0
  gae_lambda: float = 1.0  # policy λ (VC-PPO: actor)
  vapo_alpha: float = 0.0  # >0: λ = 1 - 1/(α·len) (VAPO)
  dynamic_sampling: bool = False
  max_resample_rounds: int = 2
  # DAPO soft overlong punishment (also on when a size is set).
  overlong_shaping: bool = False
  overlong_max_len: int = 0  # its L_max; 0 = rollout.max_new_tokens
  overlong_cache_len: int = 0  # its L_cache; 0 = L_max // 5
  overlong_filter: bool = False  # mask truncated responses


@dataclasses.dataclass(frozen=True)
class CriticConfig:
  """The value model of advantage.estimator='gae' (PPO, VAPO)."""

  learning_rate: float = 1e-5
  gae_lambda: float = 1.0  # VC-PPO: critic λ
  value_clip: float = 0.2
  value_coef: float = 0.5


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
  """How one RL step's batch becomes optimizer updates."""

  ppo_epochs: int = 1
  minibatches: int = 1
  micro_batches: int = 1
  entropy_coef: float = 0.0
  remat: bool = False
  logprob_chunk: int = 0


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """How long the run goes, where it writes, and what it records."""

  steps: int = 40
  seed: int = 0
  run_dir: str = "runs/default"
  checkpoint_every: int = 10
  keep_checkpoints: int = 2
  resume: bool = False
  # Comma-separated dotted fields a resume may change (train/rundir.py).
  allow_config_change: str = ""
  eval_every: int = 0
  export_hf: bool = True
  tensorboard: bool = True
  pipelined: bool = False
  max_staleness: int = 1


SECTIONS: dict[str, type] = {
  "model": PolicyModelConfig,
  "task": TaskConfig,
  "reward": RewardConfig,
  "rollout": RolloutConfig,
  "loss": PolicyLossConfig,
  "kl": KLConfig,
  "advantage": AdvantageConfig,
  "critic": CriticConfig,
  "update": UpdateConfig,
  "optim": OptimConfig,
  "mesh": MeshConfig,
  "run": RunConfig,
}


def _section(name: str):
  return dataclasses.field(default_factory=SECTIONS[name])


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything one RL run needs (sections: see the module docstring)."""

  algorithm: str = "grpo"
  model: PolicyModelConfig = _section("model")
  task: TaskConfig = _section("task")
  reward: RewardConfig = _section("reward")
  rollout: RolloutConfig = _section("rollout")
  loss: PolicyLossConfig = _section("loss")
  kl: KLConfig = _section("kl")
  advantage: AdvantageConfig = _section("advantage")
  critic: CriticConfig = _section("critic")
  update: UpdateConfig = _section("update")
  optim: OptimConfig = _section("optim")
  mesh: MeshConfig = _section("mesh")
  run: RunConfig = _section("run")

  def __post_init__(self):
    loss = self.loss
    if (
      isinstance(loss, PolicyLossConfig)
      and isinstance(self.rollout, RolloutConfig)
      and loss.aggregation == "seq-mean-token-sum-norm"
      and loss.norm_const is None
      and _is_number(self.rollout.max_new_tokens)
    ):
      # Dr. GRPO divides by the generation budget. Resolved here, once, so
      # `cfg.loss` is exactly what core gets and what config.json records.
      object.__setattr__(
        self,
        "loss",
        dataclasses.replace(
          loss, norm_const=float(self.rollout.max_new_tokens)
        ),
      )
    check(self)  # every problem at once; see `validate`

  def replace(self, *layers: Mapping[str, Any], **values) -> TrainConfig:
    """This config with layers of values on top (nested or dotted keys, as
    `resolve` takes them; no preset is applied), validated again."""
    flat = to_flat(self)
    for layer in (*layers, values):
      flat.update(flatten(layer))
    return _build(flat)

  def to_dict(self) -> dict[str, Any]:
    """Nested {section: {field: value}}: what config.json holds."""
    return dataclasses.asdict(self)

  def lora_config(self):
    """The LoraConfig of the model.lora_* fields, None when lora_rank == 0."""
    m = self.model
    if m.lora_rank == 0:
      return None
    from rljax.models.lora import LoraConfig  # pylint: disable=g-import-not-at-top

    return LoraConfig(
      rank=m.lora_rank,
      alpha=m.lora_alpha,
      dropout=m.lora_dropout,
      targets=m.lora_targets,
      base_dtype=m.lora_base_dtype,
    )

  def optim_config(self, critic: bool = False) -> OptimConfig:
    """`optim` with its update count filled in (or the critic's: its own
    learning rate, no weight decay, the same betas and schedule). One
    optimizer update per minibatch and epoch, so the schedule spans
    run.steps × update.ppo_epochs × update.minibatches unless optim.steps
    is set."""
    o = self.optim
    u = self.update
    return dataclasses.replace(
      o,
      learning_rate=self.critic.learning_rate if critic else o.learning_rate,
      steps=o.steps or self.run.steps * u.ppo_epochs * u.minibatches,
      weight_decay=0.0 if critic else o.weight_decay,
    )

  def overlong_lengths(self) -> tuple[int, int] | None:
    """(L_max, L_cache) of DAPO's soft overlong punishment, None when off.

    On with `advantage.overlong_shaping` (the dapo preset) or when a size is
    set (the older spelling: a size alone never goes silently unused). By
    default L_max is the generation budget and L_cache a fifth of it, as in
    DAPO (Yu et al. 2025: 16384 expected + 4096 cache = 20480 tokens).
    """
    a = self.advantage
    if not (a.overlong_shaping or a.overlong_max_len or a.overlong_cache_len):
      return None
    l_max = a.overlong_max_len or self.rollout.max_new_tokens
    return l_max, a.overlong_cache_len or max(1, l_max // 5)

  @property
  def rollout_batch(self) -> int:
    return self.rollout.prompts_per_step * self.rollout.group_size

  @property
  def uses_critic(self) -> bool:
    return self.advantage.estimator == "gae"

  @property
  def uses_reference(self) -> bool:
    return self.kl.coef > 0 or self.kl.in_reward_coef > 0


# Each preset names only what differs from TrainConfig's defaults; the user's
# explicit values are applied on top (see `resolve`).
PRESETS: dict[str, dict[str, Any]] = {
  # Williams 1992 with a group-mean baseline, no clipping.
  "reinforce": {
    "advantage.estimator": "drgrpo",
    "loss.surrogate": "reinforce",
    "loss.correction": "tis",
    "loss.aggregation": "seq-mean-token-mean",
  },
  # Schulman et al. 2017 + Ouyang et al. 2022: critic, GAE, value clipping,
  # KL to the reference as a per-token reward penalty.
  "ppo": {
    "advantage.estimator": "gae",
    "loss.surrogate": "ppo",
    "advantage.gamma": 1.0,
    "advantage.gae_lambda": 0.95,
    "critic.gae_lambda": 0.95,
    "kl.in_reward_coef": 1e-3,
    "kl.estimator": "k1",
    "critic.value_clip": 0.2,
    "loss.aggregation": "token-mean",
  },
  # Shao et al. 2024 (DeepSeekMath): group z-score, KL loss with k3.
  "grpo": {
    "advantage.estimator": "grpo",
    "loss.surrogate": "ppo",
    "kl.coef": 1e-3,
    "kl.estimator": "k3",
    "loss.aggregation": "seq-mean-token-mean",
  },
  # Liu et al. 2025 (Dr. GRPO): no std, no length normalisation.
  "drgrpo": {
    "advantage.estimator": "drgrpo",
    "loss.surrogate": "ppo",
    "loss.aggregation": "seq-mean-token-sum-norm",
  },
  # Ahmadian et al. 2024: leave-one-out baseline.
  "rloo": {
    "advantage.estimator": "rloo",
    "loss.surrogate": "ppo",
    "loss.aggregation": "token-mean",
  },
  # Hu 2025: global batch whitening, KL in the reward.
  "reinforce_pp": {
    "advantage.estimator": "reinforce_pp",
    "loss.surrogate": "ppo",
    "kl.in_reward_coef": 1e-3,
    "kl.estimator": "k1",
    "loss.aggregation": "token-mean",
  },
  # Yu et al. 2025 (DAPO): clip-higher, token-mean, dynamic sampling,
  # overlong shaping, no KL.
  "dapo": {
    "advantage.estimator": "grpo",
    "loss.surrogate": "ppo",
    "loss.eps_low": 0.2,
    "loss.eps_high": 0.28,
    "loss.aggregation": "token-mean",
    "advantage.dynamic_sampling": True,
    "kl.coef": 0.0,
    "advantage.overlong_shaping": True,
    "advantage.overlong_filter": False,
  },
  # MiniMax 2025 (CISPO): clipped, stop-gradient IS weight on A·logp.
  "cispo": {
    "advantage.estimator": "grpo",
    "loss.surrogate": "cispo",
    "loss.eps_low": 1.0,
    "loss.eps_high": 0.28,
    "loss.aggregation": "token-mean",
  },
  # Zheng et al. 2025 (GSPO): sequence-level geometric-mean ratio.
  "gspo": {
    "advantage.estimator": "grpo",
    "loss.surrogate": "gspo",
    "loss.eps_low": 3e-4,
    "loss.eps_high": 4e-4,
    "loss.aggregation": "seq-mean-token-mean",
    "loss.correction": "tis",
  },
  # Yuan et al. 2025 (VC-PPO) / Yue et al. 2025 (VAPO): decoupled λ,
  # length-adaptive policy λ, clip-higher, token-mean.
  "vapo": {
    "advantage.estimator": "gae",
    "loss.surrogate": "ppo",
    "critic.gae_lambda": 1.0,
    "advantage.gae_lambda": 0.95,
    "advantage.vapo_alpha": 0.05,
    "loss.eps_low": 0.2,
    "loss.eps_high": 0.28,
    "loss.aggregation": "token-mean",
  },
  # Olmo 3 RL-Zero recipe: token-level loss, TIS, clip-higher, no std
  # normalisation, zero-gradient (zero-variance group) filtering, no KL.
  "olmo3": {
    "advantage.estimator": "drgrpo",
    "loss.surrogate": "ppo",
    "loss.correction": "tis",
    "loss.eps_low": 0.2,
    "loss.eps_high": 0.28,
    "loss.aggregation": "token-mean",
    "advantage.dynamic_sampling": True,
    "kl.coef": 0.0,
  },
}


# ------------------------------------------------------------ legacy keys
#
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
  return key in SECTIONS and (
    isinstance(value, Mapping) or isinstance(value, SECTIONS[key])
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
  if isinstance(layer, TrainConfig):
    return to_flat(layer)
  out, legacy = {}, []
  for key, value in layer.items():
    if _is_section_value(key, value):
      items = (
        value.items()
        if isinstance(value, Mapping)
        else ((f.name, getattr(value, f.name)) for f in _fields(type(value)))
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
  for name in SECTIONS:
    section = getattr(cfg, name)
    for f in _fields(SECTIONS[name]):
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


def _fields(cls: type) -> tuple[dataclasses.Field, ...]:
  return tuple(f for f in dataclasses.fields(cls) if f.init)


# ---------------------------------------------------------------- resolution
#
# One function turns every source of settings into a TrainConfig: the flags
# of a script, a JSON ablation file, a `--grid` cell, a test. Sources are
# layers of {field: value}; the order is documented once, here.


def field_names() -> tuple[str, ...]:
  """The settable fields (the flags), dotted, in declaration order."""
  return ("algorithm",) + tuple(
    f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in _fields(cls)
  )


def field_type(name: str) -> Any:
  """The type hint of dotted field `name`."""
  if name == "algorithm":
    return str
  section, _, field = name.partition(".")
  return typing.get_type_hints(SECTIONS[section])[field]


def field_default(name: str) -> Any:
  if name == "algorithm":
    return TrainConfig.algorithm
  section, _, field = name.partition(".")
  return SECTIONS[section].__dataclass_fields__[field].default


def resolve(preset: str, *overrides: Mapping[str, Any]) -> TrainConfig:
  """The TrainConfig of `preset` with layers of explicit values on top.

  A layer maps dotted fields ("loss.eps_high"), sections ({"loss":
  {"eps_high": ...}}) or legacy flat keys ("eps_high", `LEGACY_KEYS`) to
  values. Precedence, lowest first:

    1. TrainConfig's defaults;
    2. the preset `PRESETS[algorithm]`, where `algorithm` is the value of
       the last layer that sets `algorithm` (else `preset`);
    3. each layer of `overrides`, in order. The callers pass, in this order:
       the script's defaults (one paper setup), the shared "base" of a JSON
       ablation file, the flags the user typed, the grid cell or JSON run,
       and per-run control (run.seed, run.run_dir).

  A layer that names another algorithm than the resolved one was written
  for that algorithm: its values for the fields that define either
  algorithm (the keys of either preset) are dropped. So a grid cell
  `algorithm=dapo` over a GRPO script or base gets DAPO's dynamic sampling,
  ε_high and KL, and `--algorithm=grpo` on the DAPO script does not keep
  DAPO's dynamic sampling under a GRPO label. Its other values (sizes,
  model, data), and every value of a layer that names no algorithm (typed
  flags without --algorithm, a grid cell over other fields), apply as given.

  Raises `ConfigError` listing every unknown field or bad value.
  """
  layers = [flatten(layer) for layer in overrides]
  known = set(field_names())
  unknown = [
    Problem(k, v, "a TrainConfig field (section.field, e.g. loss.eps_high)")
    for layer in layers
    for k, v in layer.items()
    if k not in known
  ]
  if unknown:
    raise ConfigError(unknown)
  algorithm = preset
  for layer in layers:
    algorithm = layer.get("algorithm", algorithm)
  if algorithm not in PRESETS:
    raise ConfigError([Problem("algorithm", algorithm, f"one of {ALGORITHMS}")])
  values = dict(PRESETS[algorithm])
  for layer in layers:
    written_for = layer.get("algorithm", algorithm)
    if written_for not in PRESETS:
      continue  # the final algorithm is valid; this layer's name is moot
    defining = set(PRESETS[algorithm]) | set(PRESETS[written_for])
    values.update(
      {
        k: v
        for k, v in layer.items()
        if written_for == algorithm or k not in defining
      }
    )
  values["algorithm"] = algorithm
  return _build(values)


def apply_preset(
  algorithm: str, *layers: Mapping[str, Any], **overrides
) -> TrainConfig:
  """`TrainConfig` of a named algorithm, with explicit overrides on top
  (layers of dotted/nested keys, then keyword sections or fields)."""
  return resolve(algorithm, *layers, overrides)


def from_dict(saved: Mapping[str, Any], source: str = "") -> TrainConfig:
  """The TrainConfig recorded in a run directory (config.json, checkpoint
  metadata): nested, or flat as written by an older rljax. Fields it does
  not name take their defaults, as when it was written (no preset); keys
  this rljax no longer knows are ignored."""
  flat = flatten(saved, source)
  known = set(field_names())
  return _build({k: v for k, v in flat.items() if k in known})


def _build(values: Mapping[str, Any]) -> TrainConfig:
  """TrainConfig of {dotted: value} over the defaults. Every problem is
  reported at once: unknown fields, types and ranges (found before a
  section is built, so core's own checks never pre-empt the list), then
  the cross-field checks that can still run."""
  known = set(field_names())
  problems = [
    Problem(k, v, "a TrainConfig field")
    for k, v in values.items()
    if k not in known
  ]
  problems += [
    p for k, v in values.items() if k in known for p in _field_problems(k, v)
  ]
  nested = unflatten({k: v for k, v in values.items() if k in known})
  kwargs: dict[str, Any] = {}
  if "algorithm" in nested:
    kwargs["algorithm"] = nested.pop("algorithm")
  for name, fields in nested.items():
    try:
      kwargs[name] = SECTIONS[name](**fields)
    except (TypeError, ValueError) as e:  # a section's own checks
      if not problems:  # name the field the message starts with
        msg = str(e)
        field = min(fields, key=lambda f: (msg.find(f) % (len(msg) + 1), f))
        problems.append(Problem(f"{name}.{field}", fields[field], msg))
  if not problems:
    return TrainConfig(**kwargs)
  unchecked = object.__new__(TrainConfig)  # for the cross checks only
  for f in dataclasses.fields(TrainConfig):
    default = f.default_factory() if f.name in SECTIONS else f.default
    object.__setattr__(unchecked, f.name, kwargs.get(f.name, default))
  reported = {p.field for p in problems}
  for cross in CROSS_CHECKS:
    try:
      problems.extend(p for p in cross(unchecked) if p.field not in reported)
    except (ArithmeticError, TypeError, ValueError):
      pass  # a cross check over a field already reported
  raise ConfigError(problems)


# ---------------------------------------------------------------- validation
#
# To add a field: declare it in its section (its dotted name is its flag)
# and give it a rule in FIELD_RULES (tests/train/test_config.py checks that
# every numeric field has one). A check that involves several fields goes
# in CROSS_CHECKS. `validate` runs them all and reports every problem at
# once.


@dataclasses.dataclass(frozen=True)
class Problem:
  """One bad setting: the field (its flag), its value, what was expected."""

  field: str
  value: Any
  expected: str

  def __str__(self) -> str:
    return f"--{self.field}={self.value!r}: expected {self.expected}"


class ConfigError(ValueError):
  """Every problem of a config, one per line."""

  def __init__(self, problems: Sequence[Problem]):
    self.problems = tuple(problems)
    n = len(self.problems)
    super().__init__(
      f"{n} problem{'s' if n > 1 else ''} in the training config:\n"
      + "\n".join(f"  {p}" for p in self.problems)
    )


Rule = Callable[[Any], "str | None"]  # value -> what was expected, or None


def one_of(*choices) -> Rule:
  return lambda v: None if v in choices else f"one of {choices}"


def in_range(
  lo: float = -math.inf,
  hi: float = math.inf,
  *,
  lo_open: bool = False,
  hi_open: bool = False,
) -> Rule:
  lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
  text = f"a value in {lb}{lo}, {hi}{rb}"

  def rule(v):
    ok_lo = v > lo if lo_open else v >= lo
    ok_hi = v < hi if hi_open else v <= hi
    return None if ok_lo and ok_hi else text

  return rule


def at_least(lo: float, why: str = "") -> Rule:
  base = in_range(lo)
  return lambda v: base(v) and (f">= {lo}" + (f" ({why})" if why else ""))


def optional(rule: Rule) -> Rule:
  return lambda v: None if v is None else rule(v)


def _mesh_size(v) -> str | None:
  ok = v == -1 or v >= 1
  return None if ok else "a positive size, or -1 for the devices left over"


def _task(v) -> str | None:
  from rljax.data import DATASET_SPECS  # no jax; imported only to validate
  from rljax.train.tasks import GENERATED_TASKS

  names = tuple(GENERATED_TASKS) + tuple(sorted(DATASET_SPECS))
  return None if v in names else f"a generated task or dataset, one of {names}"


_PROB = in_range(0.0, 1.0)
_NONNEG = at_least(0)
_POSITIVE_INT = at_least(1)

FIELD_RULES: dict[str, Rule] = {
  "algorithm": one_of(*ALGORITHMS),
  "model.lora_rank": at_least(0, "0 trains every weight"),
  "model.lora_alpha": in_range(0.0, math.inf, lo_open=True),
  "model.lora_dropout": in_range(0.0, 1.0, hi_open=True),
  "task.name": _task,
  "task.eval_size": _NONNEG,
  "task.reward_workers": at_least(0, "0 scores in-process"),
  # A chat prompt's fixed part alone is longer than this.
  "task.max_prompt_tokens": at_least(16, "the chat template alone is longer"),
  "reward.name": one_of(*REWARDS),
  "reward.judge_timeout_s": in_range(0.0, math.inf, lo_open=True),
  "rollout.engine": one_of(*ENGINES),
  "rollout.quant": one_of(*ROLLOUT_QUANT),
  "rollout.uaq_scale": in_range(0.0, math.inf, lo_open=True),
  "rollout.prompts_per_step": _POSITIVE_INT,
  "rollout.group_size": _POSITIVE_INT,
  "rollout.max_new_tokens": _POSITIVE_INT,
  "rollout.temperature": in_range(0.0, math.inf, lo_open=True),
  "rollout.top_p": in_range(0.0, 1.0, lo_open=True),
  "loss.surrogate": one_of(*objectives.SURROGATES),
  "loss.correction": one_of(*objectives.CORRECTIONS),
  "loss.aggregation": one_of(*aggregation_lib.AGGREGATION_MODES),
  "loss.eps_low": _NONNEG,
  "loss.eps_high": _NONNEG,
  "loss.dual_clip": optional(in_range(1.0, math.inf, lo_open=True)),
  # C < 1 would down-weight even on-policy tokens (core's PolicyLossConfig).
  "loss.tis_cap": at_least(1.0),
  "loss.norm_const": optional(in_range(0.0, math.inf, lo_open=True)),
  "loss.veto_threshold": optional(in_range(0.0, 1.0, lo_open=True)),
  "kl.coef": at_least(0, "0 turns the KL loss off"),
  "kl.estimator": one_of("k1", "k2", "k3"),
  "kl.in_reward_coef": at_least(0, "0 turns the KL penalty off"),
  "advantage.estimator": one_of(*ADVANTAGE_ESTIMATORS),
  "advantage.gamma": _PROB,
  "advantage.gae_lambda": _PROB,
  "advantage.vapo_alpha": _NONNEG,
  "advantage.max_resample_rounds": _NONNEG,
  "advantage.overlong_max_len": at_least(0, "0 turns overlong shaping off"),
  "advantage.overlong_cache_len": _NONNEG,
  "critic.learning_rate": _PROB,
  "critic.gae_lambda": _PROB,
  "critic.value_clip": in_range(0.0, math.inf, lo_open=True),
  "critic.value_coef": _NONNEG,
  "update.ppo_epochs": _POSITIVE_INT,
  "update.minibatches": _POSITIVE_INT,
  "update.micro_batches": _POSITIVE_INT,
  "update.entropy_coef": _NONNEG,
  "update.logprob_chunk": at_least(0, "0 = the whole sequence at once"),
  "optim.learning_rate": _PROB,
  "optim.steps": at_least(0, "0 = run.steps × ppo_epochs × minibatches"),
  "optim.warmup_steps": _NONNEG,
  "optim.schedule": one_of("constant", "cosine"),
  "optim.weight_decay": _NONNEG,
  "optim.max_grad_norm": at_least(0, "0 turns clipping off"),
  # b = 1 never forgets the first moment and divides by a zero bias
  # correction (NaN weights in the first step).
  "optim.b1": in_range(0.0, 1.0, hi_open=True),
  "optim.b2": in_range(0.0, 1.0, hi_open=True),
  "mesh.data": _mesh_size,
  "mesh.fsdp": _mesh_size,
  "mesh.tensor": _mesh_size,
  "run.steps": _POSITIVE_INT,
  "run.seed": _NONNEG,
  "run.checkpoint_every": _POSITIVE_INT,
  "run.keep_checkpoints": _POSITIVE_INT,
  "run.eval_every": at_least(0, "0 = only before and after training"),
  "run.max_staleness": _POSITIVE_INT,
}


def _is_number(v: Any) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_problem(name: str, value: Any) -> Problem | None:
  hint = field_type(name)
  allowed = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
  optional_ = typing.get_origin(hint) in (
    typing.Union,
    types.UnionType,
  ) and type(None) in typing.get_args(hint)
  base = (
    [a for a in typing.get_args(hint) if a is not type(None)][0]
    if optional_
    else hint
  )
  if optional_ and value is None:
    return None
  ok = isinstance(value, allowed.get(base, (object,)))
  if ok and base is not bool and isinstance(value, bool):
    ok = False  # True is an int in Python, not a count
  return None if ok else Problem(name, value, f"a {base.__name__}")


def _field_problems(name: str, value: Any) -> list[Problem]:
  bad_type = _type_problem(name, value)
  if bad_type:
    return [bad_type]
  rule = FIELD_RULES.get(name)
  expected = rule(value) if rule else None
  return [Problem(name, value, expected)] if expected else []


def _cross_checks(cfg: TrainConfig) -> list[Problem]:
  out = []
  r, a, u = cfg.rollout, cfg.advantage, cfg.update
  batch = r.prompts_per_step * r.group_size
  if batch % u.minibatches:
    out.append(
      Problem(
        "update.minibatches",
        u.minibatches,
        f"a divisor of rollout.prompts_per_step*group_size={batch}",
      )
    )
  elif (batch // u.minibatches) % u.micro_batches:
    out.append(
      Problem(
        "update.micro_batches",
        u.micro_batches,
        f"a divisor of the minibatch size {batch // u.minibatches}",
      )
    )
  group_methods = ("grpo", "drgrpo", "rloo", "reinforce_pp_baseline")
  if a.estimator in group_methods and r.group_size < 2:
    out.append(
      Problem(
        "rollout.group_size",
        r.group_size,
        f"group_size >= 2: advantage.estimator={a.estimator!r} "
        "compares samples within a group",
      )
    )
  if a.dynamic_sampling and r.group_size < 2:
    out.append(
      Problem(
        "rollout.group_size",
        r.group_size,
        "group_size >= 2: advantage.dynamic_sampling drops zero-variance "
        "groups",
      )
    )
  lengths = cfg.overlong_lengths()
  if a.overlong_max_len and a.overlong_cache_len >= a.overlong_max_len:
    out.append(
      Problem(
        "advantage.overlong_cache_len",
        a.overlong_cache_len,
        f"< advantage.overlong_max_len={a.overlong_max_len}",
      )
    )
  elif lengths is not None and lengths[1] > lengths[0]:
    out.append(
      Problem(
        "advantage.overlong_cache_len",
        lengths[1],
        f"<= overlong_max_len={lengths[0]} (0 means rollout.max_new_tokens)",
      )
    )
  loss = cfg.loss
  if loss.surrogate in ("gspo", "gspo_token") and loss.correction == "naive":
    out.append(
      Problem(
        "loss.correction",
        loss.correction,
        "'ignore_behavior', 'tis' or 'acr' with surrogate='gspo' (naive "
        "would clip a sequence ratio against the quantized actor)",
      )
    )
  if sum(s == -1 for s in (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)) > 1:
    out.append(
      Problem("mesh", cfg.mesh, "at most one size -1 (the devices left over)")
    )
  out += _task_checks(cfg)
  if cfg.reward.name == "reward_model" and not cfg.reward.model_path:
    out.append(
      Problem(
        "reward.model_path",
        cfg.reward.model_path,
        "the directory written by "
        "experiments/train_reward_model.py when "
        "reward.name='reward_model'",
      )
    )
  if cfg.reward.name == "judge":
    from rljax.rewards.judge import check_address  # only when judging

    try:
      check_address(cfg.reward.judge_url, cfg.reward.judge_allow_remote)
    except ValueError as e:
      out.append(Problem("reward.judge_url", cfg.reward.judge_url, str(e)))
  try:
    cfg.lora_config()  # lora_targets / lora_base_dtype by name
  except ValueError as e:
    m = cfg.model
    out.append(
      Problem("model.lora_*", (m.lora_targets, m.lora_base_dtype), str(e))
    )
  return out


def _task_checks(cfg: TrainConfig) -> list[Problem]:
  out = []
  t = cfg.task
  if cfg.run.eval_every > 0 and t.eval_size < 1:
    out.append(
      Problem(
        "task.eval_size",
        t.eval_size,
        f">= 1 when run.eval_every={cfg.run.eval_every} evaluates during "
        "training",
      )
    )
  from rljax import data as data_lib  # no jax

  levels = {
    "arithmetic": data_lib.ARITHMETIC_LEVELS,
    "countdown": data_lib.COUNTDOWN_LEVELS,
  }.get(t.name)
  if t.name == "arithmetic":  # a level or a knob spec (issue 17)
    try:
      data_lib.parse_difficulty(t.difficulty)
    except ValueError as e:
      out.append(
        Problem(
          "task.difficulty",
          t.difficulty,
          f"a level of task.name='arithmetic' {tuple(levels)} or a "
          f"spec such as 'steps=2_digits=2' ({e})",
        )
      )
  elif levels is not None and t.difficulty not in levels:
    out.append(
      Problem(
        "task.difficulty",
        t.difficulty,
        f"a level of task.name={t.name!r}: one of {tuple(levels)}",
      )
    )
  if t.name in data_lib.DATASET_SPECS and not t.data_path:
    out.append(
      Problem(
        "task.data_path",
        t.data_path,
        f"the file of dataset task.name={t.name!r}",
      )
    )
  return out


CROSS_CHECKS: list[Callable[[TrainConfig], list[Problem]]] = [_cross_checks]


def validate(cfg: TrainConfig) -> list[Problem]:
  """Every problem of `cfg`: section types, per-field types and ranges,
  then cross-field checks (a cross check that cannot run because one of
  its fields is already reported adds nothing)."""
  problems = []
  if not isinstance(cfg.algorithm, str) or cfg.algorithm not in ALGORITHMS:
    problems.append(Problem("algorithm", cfg.algorithm, f"one of {ALGORITHMS}"))
  for name, cls in SECTIONS.items():
    section = getattr(cfg, name)
    if not isinstance(section, cls):
      problems.append(Problem(name, section, f"a {cls.__name__}"))
      continue
    for f in _fields(cls):
      problems += _field_problems(f"{name}.{f.name}", getattr(section, f.name))
  if any(p.field in SECTIONS for p in problems):
    return problems  # a section of the wrong type: nothing more to check
  reported = {p.field for p in problems}
  for cross in CROSS_CHECKS:
    try:
      problems.extend(p for p in cross(cfg) if p.field not in reported)
    except (ArithmeticError, TypeError, ValueError):
      if not problems:
        raise
  return problems


def check(cfg: TrainConfig) -> None:
  """Raises `ConfigError` listing every problem of `cfg`."""
  problems = validate(cfg)
  if problems:
    raise ConfigError(problems)
