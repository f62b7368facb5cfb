"""The sections of a TrainConfig, their vocabularies and dotted field names.

Each section is a small frozen dataclass grouping the settings one part of
the trainer reads (see the package docstring for the list). A setting is
named by its dotted path, `loss.eps_high`: `field_names`, `field_type` and
`field_default` answer for every one of them.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from rljax import quant
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
  "orz",
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
# quant's rollout weight formats; "f32" is its synonym of "none".
ROLLOUT_QUANT = tuple(m for m in quant.ROLLOUT_MODES if m != "f32")
ENGINES = ("jax", "vllm")
REWARDS = ("verifier", "reward_model", "vrcli", "judge")
# rljax.envs' tools and tool-call formats a tool task can name (spelled out:
# the config imports no environment code; a test checks they agree).
TOOLS = ("calculator", "python")
# tags|qwen stop a turn at a call's closing tag (rljax.envs.formats); the
# chat formats read every call of a turn in the model's own syntax
# (rljax.envs.chat_formats).
TOOL_FORMATS = ("tags", "qwen", "chat_qwen", "chat_llama3", "chat_smollm2")
TOOL_PROMPTS = ("plain", "example")
TOOL_CHOICES = ("auto", "required")
# rljax.envs.sandbox.SANDBOX_MODES: how the python tool confines the code.
PYTHON_SANDBOXES = ("strong", "unsafe_rlimits_only")
DEFAULT_ALGORITHM = "grpo"

PolicyLossConfig = objectives.PolicyLossConfig


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
  # Mixed precision (docs/precision.md): the master weights and the optimizer
  # state are held in param_dtype; the policy, reference, proximal and critic
  # forward passes run in compute_dtype, log-softmax and loss in float32.
  # "auto": bfloat16 on GPU/TPU, float32 on CPU (`placement.compute_dtype`).
  param_dtype: str = "float32"  # float32|bfloat16
  compute_dtype: str = "auto"  # auto|float32|bfloat16


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """The prompts: a generated task or a dataset, and the held-out split."""

  name: str = "arithmetic"  # generated task, or a dataset spec
  difficulty: str = "easy"
  data_path: str = ""  # JSONL/Parquet for dataset tasks
  eval_size: int = 64  # held-out prompts (never trained on)
  max_prompt_tokens: int = 128
  reward_workers: int = 1  # verifier processes; 0 = in-process
  # Tool tasks (multi-turn episodes, `rljax.train.tasks.ToolTask`) only.
  tool: str = "calculator"  # calculator|python
  tool_format: str = "tags"  # tags|qwen|chat_qwen|chat_llama3|chat_smollm2
  tool_prompt: str = "plain"  # plain|example (a worked call in the prompt)
  tool_choice: str = "auto"  # auto|required (first turn opens with a call)
  max_turns: int = 4  # model turns per episode
  max_calls_per_turn: int = 2  # tool calls run per turn (concurrently)
  max_turn_tokens: int = 0  # ids of one model turn; 0 = rollout.max_new_tokens
  # Each episode's KV kept across its turns in one run of the continuous
  # JAX engine, tools run off the decode batch (rljax/rollout/multiturn_kv.py)
  # instead of one engine call per turn that prefills the history again.
  tool_kv_reuse: bool = False
  # The python tool's sandbox: "strong", or the weaker mode only by name
  # (never chosen for the run; docs/sandbox.md).
  python_sandbox: str = "strong"  # strong|unsafe_rlimits_only
  # An environment server's URL (rljax/envs/env_server.py): its episodes
  # replace the in-process environment; "" = in-process.
  env_url: str = ""


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
  # Engine URLs get the run's bearer key: loopback only unless allowed.
  vllm_allow_remote: bool = False
  quant: str = "int8"
  fake_quant: bool = False
  # UAQ's s (QuRL §4.3), folded into θ on every run that sets it, quantized
  # or not (fp32 + fold is UAQ's exact learning-rate control); 1.0 = off.
  # The QuRL scripts (experiments/main.py, ...) set 1.5 themselves.
  uaq_scale: float = 1.0
  prompts_per_step: int = 8
  group_size: int = 8
  max_new_tokens: int = 32
  temperature: float = 1.0
  top_p: float = 1.0
  # The JAX sampler: "static" batches (a chunk of prompts decodes until its
  # longest row ends) or "continuous" (slots refilled between chunks of
  # decode steps). Static stays the default until continuous is measured
  # faster on the default job (docs/performance.md).
  batching: str = "static"
  # run.async_mode=streaming: what a weight update that lands while rows
  # decode does to their KV cache: "keep" it (stale KV, PipelineRL) or
  # "recompute" it with the new weights (AReaL). rljax/rollout/inflight.py.
  inflight_kv: str = "keep"
  # batching=continuous: token slots a page of the KV pool (every prompt's
  # and row's keys and values, rljax/rollout/kv_pages.py); 0: the default.
  kv_page_size: int = 0
  # batching=continuous: most decode steps between two scheduling points,
  # where finished rows leave, waiting prompts join and a streaming run
  # takes new weights. Shorter chunks let a weight update land inside
  # shorter responses, at one host round trip per chunk.
  chunk_steps: int = 32
  # batching=continuous: "suffix" verifies drafts from suffix matches over
  # the row, its siblings and earlier responses to the prompt where that
  # pays (rljax/rollout/spec_control.py); samples are plain decoding's.
  speculative: str = "off"


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
  # VC-PPO value pretraining: steps that fit only the critic, on rollouts of
  # the initial (frozen) policy, before run.steps RL steps
  # (train/critic_pretrain.py).
  pretrain_steps: int = 0


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
  """How one RL step's batch becomes optimizer updates."""

  ppo_epochs: int = 1
  minibatches: int = 1
  micro_batches: int = 1
  entropy_coef: float = 0.0
  remat: bool = False
  # With remat: "full" re-runs each decoder layer's forward in the backward
  # pass (least memory); "dots" keeps every projection's output and the
  # attention output and recomputes only elementwise work (H200, 16x1024:
  # 1.07x faster at 0.5B, 1.14x at 1.5B, for 1.25-1.5x the memory;
  # docs/performance.md, "GPU").
  remat_policy: str = "full"
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
  # An alias of async_mode="one_step" (resolved into agreement with it by
  # keys.align_async_mode wherever a config is built).
  pipelined: bool = False
  max_staleness: int = 1
  # off: rollout, then update (synchronous). one_step: the next rollout is
  # generated while this step updates (train/collect.py's worker), so its
  # tokens are max_staleness versions behind θ_old. streaming: the worker
  # generates up to max_staleness + 1 steps ahead and takes each new θ in
  # flight, between decode chunks (rollout.inflight_kv); no token is more
  # than max_staleness versions behind θ_old (0: synchronous, bit for bit).
  async_mode: str = "off"


# run.async_mode's values.
ASYNC_MODES = ("off", "one_step", "streaming")

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


def fields(cls: type) -> tuple[dataclasses.Field, ...]:
  """The settable fields of a section (those its constructor takes)."""
  return tuple(f for f in dataclasses.fields(cls) if f.init)


def field_names() -> tuple[str, ...]:
  """The settable fields (the flags), dotted, in declaration order."""
  return ("algorithm",) + tuple(
    f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in fields(cls)
  )


def field_type(name: str) -> Any:
  """The type hint of dotted field `name`."""
  if name == "algorithm":
    return str
  section, _, field = name.partition(".")
  return typing.get_type_hints(SECTIONS[section])[field]


def field_default(name: str) -> Any:
  """The default of dotted field `name` (what TrainConfig() holds)."""
  if name == "algorithm":
    return DEFAULT_ALGORITHM
  section, _, field = name.partition(".")
  return SECTIONS[section].__dataclass_fields__[field].default
