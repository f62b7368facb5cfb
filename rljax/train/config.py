"""Training configuration: small frozen dataclasses and the algorithm presets.

A run is fully described by one `TrainConfig`. The experiment scripts map
their absl flags one to one onto these fields, and every algorithm of the
seeds is a named preset that only sets fields (`apply_preset`), so an ablation
is a grid over field values.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

ALGORITHMS = ("reinforce", "ppo", "grpo", "drgrpo", "rloo", "reinforce_pp",
              "dapo", "cispo", "gspo", "vapo", "olmo3")
ADVANTAGE_ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce_pp",
                        "reinforce_pp_baseline", "reinforce", "gae")
ROLLOUT_QUANT = ("none", "bf16", "int8", "int8_wo", "fp8")
ENGINES = ("jax", "vllm")
REWARDS = ("verifier", "reward_model", "vrcli", "judge")


def _check_choice(field: str, value: Any, choices) -> None:
  if value not in choices:
    raise ValueError(f"{field}={value!r} is not one of {tuple(choices)}")


def _check_range(field: str, value: float, lo: float, hi: float,
                 lo_open: bool = False, hi_open: bool = False) -> None:
  ok_lo = value > lo if lo_open else value >= lo
  ok_hi = value < hi if hi_open else value <= hi
  if not (ok_lo and ok_hi):
    lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
    raise ValueError(f"{field}={value!r} is outside {lb}{lo}, {hi}{rb}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything one RL run needs. Field names are the experiment flags."""
  # What to train.
  model: str = "smollm2-135m-instruct"     # name, HF dir, .gguf, or "tiny"
  task: str = "arithmetic"                 # generated task, or a dataset spec
  task_difficulty: str = "easy"
  data_path: str = ""                      # JSONL/Parquet for dataset tasks
  eval_size: int = 64                      # held-out prompts (never trained on)
  reward_workers: int = 1                  # verifier processes; 0 = in-process
  max_prompt_tokens: int = 128
  # Reward (`rljax.train.tasks.build_reward`): the task's verifier, or a
  # learned, likelihood or judge reward in its place.
  reward: str = "verifier"                  # verifier|reward_model|vrcli|judge
  reward_model_path: str = ""               # train_reward_model.py output dir
  vrcli_reference: str = ""                 # frozen reference; "" = --model
  vrcli_separator: str = "\n"               # between reasoning and gold y
  judge_url: str = "http://127.0.0.1:8000"  # OpenAI-compatible server
  judge_model: str = ""                     # "" = the server's first model
  judge_rubrics: str = ""                   # rubric file; "" = correctness
  judge_api: str = "completions"            # completions|chat (chat template)
  judge_timeout_s: float = 30.0
  judge_allow_remote: bool = False          # else loopback only
  # Algorithm.
  algorithm: str = "grpo"
  advantage: str = "grpo"
  surrogate: str = "ppo"
  correction: str = "acr"                  # + seq_tis | seq_mis | geo_rs
  veto_threshold: float | None = None       # reject sequences with a ρ_t below it
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: float | None = None
  tis_cap: float = 2.0
  aggregation: str = "token-mean"
  norm_const: float | None = None
  kl_coef: float = 0.0                      # KL-to-reference as a loss term
  kl_estimator: str = "k3"
  kl_in_reward_coef: float = 0.0            # KL-to-reference as reward penalty
  entropy_coef: float = 0.0
  gamma: float = 1.0
  gae_lambda: float = 1.0                   # policy λ (VC-PPO: actor)
  critic_lambda: float = 1.0                # VC-PPO: critic λ
  vapo_alpha: float = 0.0                   # >0: λ = 1 - 1/(α·len) (VAPO)
  value_clip: float = 0.2
  value_coef: float = 0.5
  dynamic_sampling: bool = False
  max_resample_rounds: int = 2
  overlong_shaping: bool = False            # DAPO soft overlong punishment
  #                                           (also on when a size is set)
  overlong_max_len: int = 0                 # its L_max; 0 = max_new_tokens
  overlong_cache_len: int = 0               # its L_cache; 0 = L_max // 5
  overlong_filter: bool = False             # mask truncated responses
  # Rollout.
  engine: str = "jax"
  vllm_urls: str = ""                       # comma-separated; empty: start one
  rollout_quant: str = "int8"
  fake_quant: bool = False
  uaq_scale: float = 1.5                    # 1.0 disables update-aware scaling
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
  lr_schedule: str = "constant"             # constant | cosine
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0
  adam_b1: float = 0.9
  adam_b2: float = 0.999
  # LoRA (rljax/models/lora.py); lora_rank 0 trains every weight.
  lora_rank: int = 0
  lora_alpha: float = 32.0
  lora_dropout: float = 0.0
  lora_targets: str = "all"                 # all | attn | mlp | q_proj,v_proj,...
  lora_base_dtype: str = "float32"          # frozen base: float32|bfloat16|int8
  # Systems.
  pipelined: bool = False
  max_staleness: int = 1
  mesh_shape: str = "1,1,1"                 # data,fsdp,tensor
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
    _check_choice("algorithm", self.algorithm, ALGORITHMS)
    _check_choice("advantage", self.advantage, ADVANTAGE_ESTIMATORS)
    _check_choice("rollout_quant", self.rollout_quant, ROLLOUT_QUANT)
    _check_choice("engine", self.engine, ENGINES)
    _check_choice("lr_schedule", self.lr_schedule, ("constant", "cosine"))
    _check_choice("kl_estimator", self.kl_estimator, ("k1", "k2", "k3"))
    _check_choice("reward", self.reward, REWARDS)
    if self.reward == "reward_model" and not self.reward_model_path:
      raise ValueError("reward='reward_model' needs reward_model_path (a "
                       "directory written by experiments/train_reward_model.py)")
    if self.reward == "judge":
      _check_range("judge_timeout_s", self.judge_timeout_s, 0.0, math.inf,
                   lo_open=True)
      from rljax.rewards.judge import check_address  # only when judging
      check_address(self.judge_url, self.judge_allow_remote)
    for name in ("prompts_per_step", "group_size", "max_new_tokens", "steps",
                 "ppo_epochs", "minibatches", "micro_batches",
                 "max_prompt_tokens", "max_staleness"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
    _check_range("temperature", self.temperature, 0.0, math.inf, lo_open=True)
    _check_range("top_p", self.top_p, 0.0, 1.0, lo_open=True)
    _check_range("uaq_scale", self.uaq_scale, 0.0, math.inf, lo_open=True)
    _check_range("learning_rate", self.learning_rate, 0.0, 1.0)
    _check_range("gamma", self.gamma, 0.0, 1.0)
    _check_range("gae_lambda", self.gae_lambda, 0.0, 1.0)
    _check_range("critic_lambda", self.critic_lambda, 0.0, 1.0)
    if self.lora_rank < 0:
      raise ValueError(f"lora_rank={self.lora_rank!r}; expected >= 0 (0 = off)")
    self.lora_config()  # validates the other lora_* fields
    batch = self.prompts_per_step * self.group_size
    if batch % self.minibatches:
      raise ValueError(
          f"minibatches={self.minibatches} must divide prompts_per_step*"
          f"group_size={batch}")
    if (batch // self.minibatches) % self.micro_batches:
      raise ValueError(
          f"micro_batches={self.micro_batches} must divide the minibatch size "
          f"{batch // self.minibatches}")
    group_methods = ("grpo", "drgrpo", "rloo", "reinforce_pp_baseline")
    if self.advantage in group_methods and self.group_size < 2:
      raise ValueError(
          f"advantage={self.advantage!r} compares samples within a group and "
          f"needs group_size >= 2, got group_size={self.group_size}")
    if self.dynamic_sampling and self.group_size < 2:
      raise ValueError("dynamic_sampling drops zero-variance groups and needs "
                       f"group_size >= 2, got {self.group_size}")
    if self.overlong_max_len and self.overlong_cache_len >= self.overlong_max_len:
      raise ValueError(
          f"overlong_cache_len={self.overlong_cache_len} must be smaller than "
          f"overlong_max_len={self.overlong_max_len}")
    if self.overlong_lengths() is not None:
      l_max, l_cache = self.overlong_lengths()
      if l_cache > l_max:
        raise ValueError(
            f"overlong_cache_len={l_cache} must be <= overlong_max_len={l_max} "
            "(0 means max_new_tokens)")
    if self.surrogate in ("gspo", "gspo_token") and self.correction == "naive":
      raise ValueError(
          "surrogate='gspo' with correction='naive' would clip a sequence "
          "ratio against the quantized actor; use 'ignore_behavior', 'tis' "
          "or 'acr'")

    self.policy_loss_config()  # validates surrogate/correction/ε/C by name

  def lora_config(self):
    """The LoraConfig of the lora_* fields, or None when lora_rank == 0."""
    if self.lora_rank == 0:
      return None
    from rljax.models.lora import LoraConfig  # pylint: disable=g-import-not-at-top
    return LoraConfig(rank=self.lora_rank, alpha=self.lora_alpha,
                      dropout=self.lora_dropout, targets=self.lora_targets,
                      base_dtype=self.lora_base_dtype)

  def policy_loss_config(self):
    """The `rljax.core.objectives.PolicyLossConfig` of this run."""
    from rljax.core import objectives  # jax import only when needed
    norm_const = self.norm_const
    if self.aggregation == "seq-mean-token-sum-norm" and norm_const is None:
      norm_const = float(self.max_new_tokens)  # Dr. GRPO: generation budget
    return objectives.PolicyLossConfig(
        surrogate=self.surrogate, correction=self.correction,
        eps_low=self.eps_low, eps_high=self.eps_high,
        dual_clip=self.dual_clip, tis_cap=self.tis_cap,
        aggregation=self.aggregation, norm_const=norm_const,
        veto_threshold=self.veto_threshold)

  def overlong_lengths(self) -> tuple[int, int] | None:
    """(L_max, L_cache) of DAPO's soft overlong punishment, None when off.

    On with `overlong_shaping` (the dapo preset) or when a size is set (the
    older spelling: a size alone never goes silently unused). By default
    L_max is the generation budget and L_cache a fifth of it, as in DAPO
    (Yu et al. 2025: 16384 expected + 4096 cache = 20480 tokens).
    """
    if not (self.overlong_shaping or self.overlong_max_len
            or self.overlong_cache_len):
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
    "reinforce": dict(advantage="drgrpo", surrogate="reinforce",
                      correction="tis", aggregation="seq-mean-token-mean"),
    # Schulman et al. 2017 + Ouyang et al. 2022: critic, GAE, value clipping,
    # KL to the reference as a per-token reward penalty.
    "ppo": dict(advantage="gae", surrogate="ppo", gamma=1.0, gae_lambda=0.95,
                critic_lambda=0.95, kl_in_reward_coef=1e-3, kl_estimator="k1",
                value_clip=0.2,
                aggregation="token-mean"),
    # Shao et al. 2024 (DeepSeekMath): group z-score, KL loss with k3.
    "grpo": dict(advantage="grpo", surrogate="ppo", kl_coef=1e-3,
                 kl_estimator="k3", aggregation="seq-mean-token-mean"),
    # Liu et al. 2025 (Dr. GRPO): no std, no length normalisation.
    "drgrpo": dict(advantage="drgrpo", surrogate="ppo",
                   aggregation="seq-mean-token-sum-norm"),
    # Ahmadian et al. 2024: leave-one-out baseline.
    "rloo": dict(advantage="rloo", surrogate="ppo", aggregation="token-mean"),
    # Hu 2025: global batch whitening, KL in the reward.
    "reinforce_pp": dict(advantage="reinforce_pp", surrogate="ppo",
                         kl_in_reward_coef=1e-3, kl_estimator="k1",
                         aggregation="token-mean"),
    # Yu et al. 2025 (DAPO): clip-higher, token-mean, dynamic sampling,
    # overlong shaping, no KL.
    "dapo": dict(advantage="grpo", surrogate="ppo", eps_low=0.2, eps_high=0.28,
                 aggregation="token-mean", dynamic_sampling=True, kl_coef=0.0,
                 overlong_shaping=True, overlong_filter=False),
    # MiniMax 2025 (CISPO): clipped, stop-gradient IS weight on A·logp.
    "cispo": dict(advantage="grpo", surrogate="cispo", eps_low=1.0,
                  eps_high=0.28, aggregation="token-mean"),
    # Zheng et al. 2025 (GSPO): sequence-level geometric-mean ratio.
    "gspo": dict(advantage="grpo", surrogate="gspo", eps_low=3e-4,
                 eps_high=4e-4, aggregation="seq-mean-token-mean",
                 correction="tis"),
    # Yuan et al. 2025 (VC-PPO) / Yue et al. 2025 (VAPO): decoupled λ,
    # length-adaptive policy λ, clip-higher, token-mean.
    "vapo": dict(advantage="gae", surrogate="ppo", critic_lambda=1.0,
                 gae_lambda=0.95, vapo_alpha=0.05, eps_low=0.2, eps_high=0.28,
                 aggregation="token-mean"),
    # Olmo 3 RL-Zero recipe: token-level loss, TIS, clip-higher, no std
    # normalisation, zero-gradient (zero-variance group) filtering, no KL.
    "olmo3": dict(advantage="drgrpo", surrogate="ppo", correction="tis",
                  eps_low=0.2, eps_high=0.28, aggregation="token-mean",
                  dynamic_sampling=True, kl_coef=0.0),
}


def apply_preset(algorithm: str, **overrides) -> TrainConfig:
  """`TrainConfig` of a named algorithm, with explicit overrides on top."""
  _check_choice("algorithm", algorithm, ALGORITHMS)
  fields = {f.name for f in dataclasses.fields(TrainConfig)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(f"unknown TrainConfig fields {unknown}")
  values = dict(PRESETS[algorithm])
  values.update(overrides)
  values["algorithm"] = algorithm
  return TrainConfig(**values)
