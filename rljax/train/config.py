"""Training configuration: small frozen dataclasses and the algorithm presets.

A run is fully described by one `TrainConfig`. The experiment scripts map
their absl flags one to one onto these fields, and every algorithm of the
seeds is a named preset that only sets fields, so an ablation is a grid over
field values. `resolve` is the one way from presets, script defaults, JSON
files, flags and grid cells to a config (its docstring has the order), and
`validate` reports every bad value at once, before anything is loaded.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Callable, Mapping, Sequence

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


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything one RL run needs. Field names are the experiment flags."""

  # What to train.
  model: str = "smollm2-135m-instruct"  # name, HF dir, .gguf, or "tiny"
  task: str = "arithmetic"  # generated task, or a dataset spec
  task_difficulty: str = "easy"
  data_path: str = ""  # JSONL/Parquet for dataset tasks
  eval_size: int = 64  # held-out prompts (never trained on)
  reward_workers: int = 1  # verifier processes; 0 = in-process
  max_prompt_tokens: int = 128
  # Reward (`rljax.train.tasks.build_reward`): the task's verifier, or a
  # learned, likelihood or judge reward in its place.
  reward: str = "verifier"  # verifier|reward_model|vrcli|judge
  reward_model_path: str = ""  # train_reward_model.py output dir
  vrcli_reference: str = ""  # frozen reference; "" = --model
  vrcli_separator: str = "\n"  # between reasoning and gold y
  judge_url: str = "http://127.0.0.1:8000"  # OpenAI-compatible server
  judge_model: str = ""  # "" = the server's first model
  judge_rubrics: str = ""  # rubric file; "" = correctness
  judge_api: str = "completions"  # completions|chat (chat template)
  judge_timeout_s: float = 30.0
  judge_allow_remote: bool = False  # else loopback only
  # Algorithm.
  algorithm: str = "grpo"
  advantage: str = "grpo"
  surrogate: str = "ppo"
  correction: str = "acr"  # + seq_tis | seq_mis | geo_rs
  veto_threshold: float | None = None  # reject sequences with a ρ_t below it
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: float | None = None
  tis_cap: float = 2.0
  aggregation: str = "token-mean"
  norm_const: float | None = None
  kl_coef: float = 0.0  # KL-to-reference as a loss term
  kl_estimator: str = "k3"
  kl_in_reward_coef: float = 0.0  # KL-to-reference as reward penalty
  entropy_coef: float = 0.0
  gamma: float = 1.0
  gae_lambda: float = 1.0  # policy λ (VC-PPO: actor)
  critic_lambda: float = 1.0  # VC-PPO: critic λ
  vapo_alpha: float = 0.0  # >0: λ = 1 - 1/(α·len) (VAPO)
  value_clip: float = 0.2
  value_coef: float = 0.5
  dynamic_sampling: bool = False
  max_resample_rounds: int = 2
  overlong_shaping: bool = False  # DAPO soft overlong punishment
  #                                           (also on when a size is set)
  overlong_max_len: int = 0  # its L_max; 0 = max_new_tokens
  overlong_cache_len: int = 0  # its L_cache; 0 = L_max // 5
  overlong_filter: bool = False  # mask truncated responses
  # Rollout.
  engine: str = "jax"
  vllm_urls: str = ""  # comma-separated; empty: start one
  rollout_quant: str = "int8"
  fake_quant: bool = False
  uaq_scale: float = 1.5  # 1.0 disables update-aware scaling
  prompts_per_step: int = 8
  group_size: int = 8
  max_new_tokens: int = 32
  temperature: float = 1.0
  top_p: float = 1.0
  # Optimisation.
  steps: int = 40
  ppo_epochs: int = 1
  minibatches: int = 1
  micro_batches: int = 1
  learning_rate: float = 1e-5
  critic_learning_rate: float = 1e-5
  warmup_steps: int = 0
  lr_schedule: str = "constant"  # constant | cosine
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0
  adam_b1: float = 0.9
  adam_b2: float = 0.999
  # LoRA (rljax/models/lora.py); lora_rank 0 trains every weight.
  lora_rank: int = 0
  lora_alpha: float = 32.0
  lora_dropout: float = 0.0
  lora_targets: str = "all"  # all | attn | mlp | q_proj,v_proj,...
  lora_base_dtype: str = "float32"  # frozen base: float32|bfloat16|int8
  # Systems.
  pipelined: bool = False
  max_staleness: int = 1
  mesh_shape: str = "1,1,1"  # data,fsdp,tensor
  remat: bool = False
  logprob_chunk: int = 0
  seed: int = 0
  run_dir: str = "runs/default"
  checkpoint_every: int = 10
  keep_checkpoints: int = 2
  resume: bool = False
  # Comma-separated fields a resume may change (see train/rundir.py).
  allow_config_change: str = ""
  eval_every: int = 0
  export_hf: bool = True
  tensorboard: bool = True

  def __post_init__(self):
    check(self)  # every problem at once; see `validate`

  def lora_config(self):
    """The LoraConfig of the lora_* fields, or None when lora_rank == 0."""
    if self.lora_rank == 0:
      return None
    from rljax.models.lora import LoraConfig  # pylint: disable=g-import-not-at-top

    return LoraConfig(
      rank=self.lora_rank,
      alpha=self.lora_alpha,
      dropout=self.lora_dropout,
      targets=self.lora_targets,
      base_dtype=self.lora_base_dtype,
    )

  def optim_config(self, critic: bool = False):
    """The `rljax.train.optim.OptimConfig` of the policy (or the critic: its
    own learning rate, no weight decay). One optimizer update per minibatch
    and epoch, so the schedule spans steps × ppo_epochs × minibatches."""
    from rljax.train import optim  # jax import only when needed

    return optim.OptimConfig(
      learning_rate=(
        self.critic_learning_rate if critic else self.learning_rate
      ),
      steps=self.steps * self.ppo_epochs * self.minibatches,
      warmup_steps=self.warmup_steps,
      schedule=self.lr_schedule,
      weight_decay=0.0 if critic else self.weight_decay,
      max_grad_norm=self.max_grad_norm,
      b1=self.adam_b1,
      b2=self.adam_b2,
    )

  def policy_loss_config(self):
    """The `rljax.core.objectives.PolicyLossConfig` of this run."""
    from rljax.core import objectives  # jax import only when needed

    norm_const = self.norm_const
    if self.aggregation == "seq-mean-token-sum-norm" and norm_const is None:
      norm_const = float(self.max_new_tokens)  # Dr. GRPO: generation budget
    return objectives.PolicyLossConfig(
      surrogate=self.surrogate,
      correction=self.correction,
      eps_low=self.eps_low,
      eps_high=self.eps_high,
      dual_clip=self.dual_clip,
      tis_cap=self.tis_cap,
      aggregation=self.aggregation,
      norm_const=norm_const,
      veto_threshold=self.veto_threshold,
    )

  def overlong_lengths(self) -> tuple[int, int] | None:
    """(L_max, L_cache) of DAPO's soft overlong punishment, None when off.

    On with `overlong_shaping` (the dapo preset) or when a size is set (the
    older spelling: a size alone never goes silently unused). By default
    L_max is the generation budget and L_cache a fifth of it, as in DAPO
    (Yu et al. 2025: 16384 expected + 4096 cache = 20480 tokens).
    """
    if not (
      self.overlong_shaping or self.overlong_max_len or self.overlong_cache_len
    ):
      return None
    l_max = self.overlong_max_len or self.max_new_tokens
    return l_max, self.overlong_cache_len or max(1, l_max // 5)

  @property
  def rollout_batch(self) -> int:
    return self.prompts_per_step * self.group_size

  @property
  def uses_critic(self) -> bool:
    return self.advantage == "gae"

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0 or self.kl_in_reward_coef > 0


# Each preset names only what differs from TrainConfig's defaults; the user's
# explicit flags are applied on top (see `apply_preset`).
PRESETS: dict[str, dict[str, Any]] = {
  # Williams 1992 with a group-mean baseline, no clipping.
  "reinforce": dict(
    advantage="drgrpo",
    surrogate="reinforce",
    correction="tis",
    aggregation="seq-mean-token-mean",
  ),
  # Schulman et al. 2017 + Ouyang et al. 2022: critic, GAE, value clipping,
  # KL to the reference as a per-token reward penalty.
  "ppo": dict(
    advantage="gae",
    surrogate="ppo",
    gamma=1.0,
    gae_lambda=0.95,
    critic_lambda=0.95,
    kl_in_reward_coef=1e-3,
    kl_estimator="k1",
    value_clip=0.2,
    aggregation="token-mean",
  ),
  # Shao et al. 2024 (DeepSeekMath): group z-score, KL loss with k3.
  "grpo": dict(
    advantage="grpo",
    surrogate="ppo",
    kl_coef=1e-3,
    kl_estimator="k3",
    aggregation="seq-mean-token-mean",
  ),
  # Liu et al. 2025 (Dr. GRPO): no std, no length normalisation.
  "drgrpo": dict(
    advantage="drgrpo", surrogate="ppo", aggregation="seq-mean-token-sum-norm"
  ),
  # Ahmadian et al. 2024: leave-one-out baseline.
  "rloo": dict(advantage="rloo", surrogate="ppo", aggregation="token-mean"),
  # Hu 2025: global batch whitening, KL in the reward.
  "reinforce_pp": dict(
    advantage="reinforce_pp",
    surrogate="ppo",
    kl_in_reward_coef=1e-3,
    kl_estimator="k1",
    aggregation="token-mean",
  ),
  # Yu et al. 2025 (DAPO): clip-higher, token-mean, dynamic sampling,
  # overlong shaping, no KL.
  "dapo": dict(
    advantage="grpo",
    surrogate="ppo",
    eps_low=0.2,
    eps_high=0.28,
    aggregation="token-mean",
    dynamic_sampling=True,
    kl_coef=0.0,
    overlong_shaping=True,
    overlong_filter=False,
  ),
  # MiniMax 2025 (CISPO): clipped, stop-gradient IS weight on A·logp.
  "cispo": dict(
    advantage="grpo",
    surrogate="cispo",
    eps_low=1.0,
    eps_high=0.28,
    aggregation="token-mean",
  ),
  # Zheng et al. 2025 (GSPO): sequence-level geometric-mean ratio.
  "gspo": dict(
    advantage="grpo",
    surrogate="gspo",
    eps_low=3e-4,
    eps_high=4e-4,
    aggregation="seq-mean-token-mean",
    correction="tis",
  ),
  # Yuan et al. 2025 (VC-PPO) / Yue et al. 2025 (VAPO): decoupled λ,
  # length-adaptive policy λ, clip-higher, token-mean.
  "vapo": dict(
    advantage="gae",
    surrogate="ppo",
    critic_lambda=1.0,
    gae_lambda=0.95,
    vapo_alpha=0.05,
    eps_low=0.2,
    eps_high=0.28,
    aggregation="token-mean",
  ),
  # Olmo 3 RL-Zero recipe: token-level loss, TIS, clip-higher, no std
  # normalisation, zero-gradient (zero-variance group) filtering, no KL.
  "olmo3": dict(
    advantage="drgrpo",
    surrogate="ppo",
    correction="tis",
    eps_low=0.2,
    eps_high=0.28,
    aggregation="token-mean",
    dynamic_sampling=True,
    kl_coef=0.0,
  ),
}


# ---------------------------------------------------------------- resolution
#
# One function turns every source of settings into a TrainConfig: the flags
# of a script, a JSON ablation file, a `--grid` cell, a test. Sources are
# layers of {field: value}; the order is documented once, here.


def field_names() -> tuple[str, ...]:
  """The settable fields (the flags), in declaration order."""
  return tuple(f.name for f in dataclasses.fields(TrainConfig))


def resolve(preset: str, *overrides: Mapping[str, Any]) -> TrainConfig:
  """The TrainConfig of `preset` with layers of explicit values on top.

  Precedence, lowest first:

    1. TrainConfig's defaults;
    2. the preset `PRESETS[algorithm]`, where `algorithm` is the value of
       the last layer that sets `algorithm` (else `preset`);
    3. each layer of `overrides`, in order. The callers pass, in this order:
       the script's defaults (one paper setup), the shared "base" of a JSON
       ablation file, the flags the user typed, the grid cell or JSON run,
       and per-run control (seed, run_dir).

  A layer that names another algorithm than the resolved one was written
  for that algorithm: its values for the fields that define either
  algorithm (the keys of either preset) are dropped. So a grid cell
  `algorithm=dapo` over a GRPO script or base gets DAPO's dynamic sampling,
  ε_high and KL, and `--algorithm=grpo` on the DAPO script does not keep
  DAPO's dynamic sampling under a GRPO label. Its other values (sizes,
  model, data), and every value of a layer that names no algorithm (typed
  flags without --algorithm, a grid cell over other fields), apply as given.

  Keys are field names; when the config grows sections, a layer stays a
  flat mapping of (dotted) field paths and only this function learns to
  place them. Raises `ConfigError` listing every unknown field or bad value.
  """
  known = set(field_names())
  unknown = [
    Problem(k, v, "a TrainConfig field")
    for layer in overrides
    for k, v in layer.items()
    if k not in known
  ]
  if unknown:
    raise ConfigError(unknown)
  algorithm = preset
  for layer in overrides:
    algorithm = layer.get("algorithm", algorithm)
  if algorithm not in PRESETS:
    raise ConfigError([Problem("algorithm", algorithm, f"one of {ALGORITHMS}")])
  values = dict(PRESETS[algorithm])
  for layer in overrides:
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
  return TrainConfig(**values)


def apply_preset(algorithm: str, **overrides) -> TrainConfig:
  """`TrainConfig` of a named algorithm, with explicit overrides on top."""
  return resolve(algorithm, overrides)


# ---------------------------------------------------------------- validation
#
# To add a field: declare it in TrainConfig (its name is its flag) and give
# it a rule in FIELD_RULES (tests/train/test_config.py checks that every
# numeric field has one). A check that involves several fields goes in
# CROSS_CHECKS. `validate` runs them all and reports every problem at once.


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


def _mesh_shape(v) -> str | None:
  parts = str(v).split(",")
  ok = len(parts) == 3 and all(
    p.strip().isdigit() and int(p) >= 1 for p in parts
  )
  return None if ok else "three positive ints 'data,fsdp,tensor', e.g. '1,1,1'"


def _task(v) -> str | None:
  from rljax.data import DATASET_SPECS  # no jax; imported only to validate
  from rljax.train.tasks import GENERATED_TASKS

  names = tuple(GENERATED_TASKS) + tuple(sorted(DATASET_SPECS))
  return None if v in names else f"a generated task or dataset, one of {names}"


_PROB = in_range(0.0, 1.0)
_NONNEG = at_least(0)
_POSITIVE_INT = at_least(1)

FIELD_RULES: dict[str, Rule] = {
  "task": _task,
  "eval_size": _NONNEG,
  "reward_workers": at_least(0, "0 scores in-process"),
  # A chat prompt's fixed part alone is longer than this.
  "max_prompt_tokens": at_least(16, "the chat template alone is longer"),
  "algorithm": one_of(*ALGORITHMS),
  "advantage": one_of(*ADVANTAGE_ESTIMATORS),
  "eps_low": _NONNEG,
  "eps_high": _NONNEG,
  "dual_clip": optional(in_range(1.0, math.inf, lo_open=True)),
  "tis_cap": in_range(0.0, math.inf, lo_open=True),
  "norm_const": optional(in_range(0.0, math.inf, lo_open=True)),
  "kl_coef": at_least(0, "0 turns the KL loss off"),
  "kl_estimator": one_of("k1", "k2", "k3"),
  "kl_in_reward_coef": at_least(0, "0 turns the KL penalty off"),
  "entropy_coef": _NONNEG,
  "gamma": _PROB,
  "gae_lambda": _PROB,
  "critic_lambda": _PROB,
  "vapo_alpha": _NONNEG,
  "value_clip": in_range(0.0, math.inf, lo_open=True),
  "value_coef": _NONNEG,
  "max_resample_rounds": _NONNEG,
  "overlong_max_len": at_least(0, "0 turns overlong shaping off"),
  "overlong_cache_len": _NONNEG,
  "engine": one_of(*ENGINES),
  "rollout_quant": one_of(*ROLLOUT_QUANT),
  "uaq_scale": in_range(0.0, math.inf, lo_open=True),
  "prompts_per_step": _POSITIVE_INT,
  "group_size": _POSITIVE_INT,
  "max_new_tokens": _POSITIVE_INT,
  "temperature": in_range(0.0, math.inf, lo_open=True),
  "top_p": in_range(0.0, 1.0, lo_open=True),
  "steps": _POSITIVE_INT,
  "ppo_epochs": _POSITIVE_INT,
  "minibatches": _POSITIVE_INT,
  "micro_batches": _POSITIVE_INT,
  "learning_rate": _PROB,
  "critic_learning_rate": _PROB,
  "warmup_steps": _NONNEG,
  "lr_schedule": one_of("constant", "cosine"),
  "weight_decay": _NONNEG,
  "max_grad_norm": at_least(0, "0 turns clipping off"),
  # b = 1 never forgets the first moment and divides by a zero bias
  # correction (NaN weights in the first step).
  "adam_b1": in_range(0.0, 1.0, hi_open=True),
  "adam_b2": in_range(0.0, 1.0, hi_open=True),
  "max_staleness": _POSITIVE_INT,
  "mesh_shape": _mesh_shape,
  "logprob_chunk": at_least(0, "0 = the whole sequence at once"),
  "seed": _NONNEG,
  "checkpoint_every": _POSITIVE_INT,
  "keep_checkpoints": _POSITIVE_INT,
  "eval_every": at_least(0, "0 = only before and after training"),
  "reward": one_of(*REWARDS),
  "judge_timeout_s": in_range(0.0, math.inf, lo_open=True),
  "veto_threshold": optional(in_range(0.0, 1.0, lo_open=True)),
  "lora_rank": at_least(0, "0 trains every weight"),
  "lora_alpha": in_range(0.0, math.inf, lo_open=True),
  "lora_dropout": in_range(0.0, 1.0, hi_open=True),
}


def _type_problem(name: str, value: Any) -> Problem | None:
  hint = typing.get_type_hints(TrainConfig)[name]
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


def _cross_checks(cfg: TrainConfig) -> list[Problem]:
  out = []
  batch = cfg.prompts_per_step * cfg.group_size
  if batch % cfg.minibatches:
    out.append(
      Problem(
        "minibatches",
        cfg.minibatches,
        f"a divisor of prompts_per_step*group_size={batch}",
      )
    )
  elif (batch // cfg.minibatches) % cfg.micro_batches:
    out.append(
      Problem(
        "micro_batches",
        cfg.micro_batches,
        f"a divisor of the minibatch size {batch // cfg.minibatches}",
      )
    )
  group_methods = ("grpo", "drgrpo", "rloo", "reinforce_pp_baseline")
  if cfg.advantage in group_methods and cfg.group_size < 2:
    out.append(
      Problem(
        "group_size",
        cfg.group_size,
        f"group_size >= 2: advantage={cfg.advantage!r} "
        "compares samples within a group",
      )
    )
  if cfg.dynamic_sampling and cfg.group_size < 2:
    out.append(
      Problem(
        "group_size",
        cfg.group_size,
        "group_size >= 2: dynamic_sampling drops zero-variance groups",
      )
    )
  lengths = cfg.overlong_lengths()
  if cfg.overlong_max_len and cfg.overlong_cache_len >= cfg.overlong_max_len:
    out.append(
      Problem(
        "overlong_cache_len",
        cfg.overlong_cache_len,
        f"< overlong_max_len={cfg.overlong_max_len}",
      )
    )
  elif lengths is not None and lengths[1] > lengths[0]:
    out.append(
      Problem(
        "overlong_cache_len",
        lengths[1],
        f"<= overlong_max_len={lengths[0]} (0 means max_new_tokens)",
      )
    )
  if cfg.surrogate in ("gspo", "gspo_token") and cfg.correction == "naive":
    out.append(
      Problem(
        "correction",
        cfg.correction,
        "'ignore_behavior', 'tis' or 'acr' with surrogate='gspo' (naive "
        "would clip a sequence ratio against the quantized actor)",
      )
    )
  if cfg.eval_every > 0 and cfg.eval_size < 1:
    out.append(
      Problem(
        "eval_size",
        cfg.eval_size,
        f">= 1 when eval_every={cfg.eval_every} evaluates during training",
      )
    )
  from rljax import data as data_lib  # no jax

  levels = {
    "arithmetic": data_lib.ARITHMETIC_LEVELS,
    "countdown": data_lib.COUNTDOWN_LEVELS,
  }.get(cfg.task)
  if cfg.task == "arithmetic":  # a level or a knob spec (issue 17)
    try:
      data_lib.parse_difficulty(cfg.task_difficulty)
    except ValueError as e:
      out.append(
        Problem(
          "task_difficulty",
          cfg.task_difficulty,
          f"a level of task='arithmetic' {tuple(levels)} or a "
          f"spec such as 'steps=2_digits=2' ({e})",
        )
      )
  elif levels is not None and cfg.task_difficulty not in levels:
    out.append(
      Problem(
        "task_difficulty",
        cfg.task_difficulty,
        f"a level of task={cfg.task!r}: one of {tuple(levels)}",
      )
    )
  if cfg.task in data_lib.DATASET_SPECS and not cfg.data_path:
    out.append(
      Problem(
        "data_path", cfg.data_path, f"the file of dataset task={cfg.task!r}"
      )
    )
  if cfg.reward == "reward_model" and not cfg.reward_model_path:
    out.append(
      Problem(
        "reward_model_path",
        cfg.reward_model_path,
        "the directory written by "
        "experiments/train_reward_model.py when "
        "reward='reward_model'",
      )
    )
  if cfg.reward == "judge":
    from rljax.rewards.judge import check_address  # only when judging

    try:
      check_address(cfg.judge_url, cfg.judge_allow_remote)
    except ValueError as e:
      out.append(Problem("judge_url", cfg.judge_url, str(e)))
  try:
    cfg.lora_config()  # lora_targets / lora_base_dtype by name
  except ValueError as e:
    out.append(
      Problem("lora_*", (cfg.lora_targets, cfg.lora_base_dtype), str(e))
    )
  try:
    cfg.policy_loss_config()  # surrogate/correction/aggregation/ε/C by name
  except ValueError as e:
    out.append(
      Problem(
        "surrogate/correction/aggregation",
        (cfg.surrogate, cfg.correction, cfg.aggregation),
        str(e),
      )
    )
  return out


CROSS_CHECKS: list[Callable[[TrainConfig], list[Problem]]] = [_cross_checks]


def validate(cfg: TrainConfig) -> list[Problem]:
  """Every problem of `cfg`: per-field types and ranges, then cross-field
  checks (a cross check that cannot run because one of its fields is
  already reported adds nothing)."""
  problems = []
  for name in field_names():
    value = getattr(cfg, name)
    bad_type = _type_problem(name, value)
    if bad_type:
      problems.append(bad_type)
      continue
    rule = FIELD_RULES.get(name)
    expected = rule(value) if rule else None
    if expected:
      problems.append(Problem(name, value, expected))
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
