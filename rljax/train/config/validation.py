"""Every problem of a TrainConfig at once, before anything is loaded.

To add a field: declare it in its section (its dotted name is its flag) and
give it a rule in FIELD_RULES (tests/train/test_config.py checks that every
numeric field has one). A check that involves several fields goes in
CROSS_CHECKS. `validate` runs them all and reports every problem at once.

The rules and the wording of a problem are core's (`rljax.core._validation`):
`--{field}={value!r}; expected {what}`, as every config of rljax says it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import TYPE_CHECKING, Any, Callable, Collection, Sequence

from rljax.core import _validation as v
from rljax.core import aggregation as aggregation_lib
from rljax.core import objectives
from rljax.train.config import sections

if TYPE_CHECKING:
  from rljax.train.config.train_config import TrainConfig


@dataclasses.dataclass(frozen=True)
class Problem:
  """One bad setting: the field (its flag), its value, what was expected."""

  field: str
  value: Any
  expected: str

  def __str__(self) -> str:
    return v.field_message(f"--{self.field}", self.value, self.expected)


class ConfigError(ValueError):
  """Every problem of a config, one per line."""

  def __init__(self, problems: Sequence[Problem]):
    self.problems = tuple(problems)
    n = len(self.problems)
    super().__init__(
      f"{n} problem{'s' if n > 1 else ''} in the training config:\n"
      + "\n".join(f"  {p}" for p in self.problems)
    )


# ---------------------------------------------------------------- one field


def _mesh_size(value) -> str | None:
  ok = value == -1 or value >= 1
  return None if ok else "a positive size, or -1 for the devices left over"


def _task(value) -> str | None:
  from rljax.data import DATASET_SPECS  # no jax; imported only to validate
  from rljax.train.tasks import GENERATED_TASKS

  names = tuple(GENERATED_TASKS) + tuple(sorted(DATASET_SPECS))
  ok = value in names
  return None if ok else f"a generated task or dataset, one of {names}"


def _eps_low(value) -> str | None:
  # 1 − eps_low is the lower clip of the ratio; at eps_low = 1 it is 0 and
  # never binds (a ratio is > 0; CISPO's preset), above 1 it is negative.
  ok = 0 <= value <= 1 or value == math.inf
  return None if ok else "a value in [0, 1], or inf for no lower clip"


def _async_mode(value) -> str | None:
  return (
    None
    if value in sections.ASYNC_MODES
    else (f"one of {sections.ASYNC_MODES}")
  )


# A seed both jax.random.key and numpy take, as a 31-bit int.
_MAX_SEED = 2**31 - 1
# More verifier processes than this are interpreters idling on a CPU.
_MAX_REWARD_WORKERS = 64

_PROB = v.in_range(0.0, 1.0)
_NONNEG = v.at_least(0)
_POSITIVE = v.in_range(0.0, math.inf, lo_open=True)
_POSITIVE_INT = v.at_least(1)

FIELD_RULES: dict[str, v.Rule] = {
  "algorithm": v.one_of(*sections.ALGORITHMS),
  "model.lora_rank": v.at_least(0, "0 trains every weight"),
  "model.lora_alpha": _POSITIVE,
  "model.lora_dropout": v.in_range(0.0, 1.0, hi_open=True),
  "model.param_dtype": v.one_of("float32", "bfloat16"),
  "model.compute_dtype": v.one_of("auto", "float32", "bfloat16"),
  "task.name": _task,
  "task.eval_size": _NONNEG,
  "task.reward_workers": v.expect(
    v.in_range(0, _MAX_REWARD_WORKERS),
    f"a value in [0, {_MAX_REWARD_WORKERS}] (0 scores in-process)",
  ),
  # A chat prompt's fixed part alone is longer than this.
  "task.max_prompt_tokens": v.at_least(16, "the chat template alone is longer"),
  "task.tool": v.one_of(*sections.TOOLS),
  "task.tool_format": v.one_of(*sections.TOOL_FORMATS),
  "task.tool_prompt": v.one_of(*sections.TOOL_PROMPTS),
  "task.tool_choice": v.one_of(*sections.TOOL_CHOICES),
  "task.max_turns": _POSITIVE_INT,
  "task.max_turn_tokens": v.at_least(0, "0 = rollout.max_new_tokens"),
  "reward.name": v.one_of(*sections.REWARDS),
  "reward.judge_timeout_s": _POSITIVE,
  "rollout.engine": v.one_of(*sections.ENGINES),
  "rollout.quant": v.one_of(*sections.ROLLOUT_QUANT),
  # 1 turns UAQ off; s < 1 would shrink updates against the quantization
  # grid (the opposite of UAQ); QuRL §4.3 tests s = 1..3.
  "rollout.uaq_scale": v.in_range(1.0, 8.0),
  "rollout.prompts_per_step": _POSITIVE_INT,
  "rollout.group_size": _POSITIVE_INT,
  "rollout.max_new_tokens": _POSITIVE_INT,
  # Below 0.01 sampling is greedy in all but name and logits / T leave the
  # range where the behaviour log-probs mean anything.
  "rollout.temperature": v.expect(
    v.in_range(0.01, math.inf),
    ">= 0.01 (below, sampling is greedy in all but name)",
  ),
  "rollout.top_p": v.in_range(0.0, 1.0, lo_open=True),
  "rollout.batching": v.one_of("static", "continuous"),
  "rollout.inflight_kv": v.one_of("keep", "recompute"),
  "rollout.kv_page_size": v.at_least(0),
  "loss.surrogate": v.one_of(*objectives.SURROGATES),
  "loss.correction": v.one_of(*objectives.CORRECTIONS),
  "loss.aggregation": v.one_of(*aggregation_lib.AGGREGATION_MODES),
  "loss.eps_low": _eps_low,
  "loss.eps_high": _NONNEG,
  "loss.dual_clip": v.optional(v.in_range(1.0, math.inf, lo_open=True)),
  # C < 1 would down-weight even on-policy tokens (core's PolicyLossConfig).
  "loss.tis_cap": v.at_least(1.0),
  "loss.norm_const": v.optional(_POSITIVE),
  "loss.veto_threshold": v.optional(v.in_range(0.0, 1.0, lo_open=True)),
  "loss.positive_nll_coef": v.at_least(0, "0 turns the NLL term off"),
  "kl.coef": v.at_least(0, "0 turns the KL loss off"),
  "kl.estimator": v.one_of("k1", "k2", "k3"),
  "kl.in_reward_coef": v.at_least(0, "0 turns the KL penalty off"),
  "advantage.estimator": v.one_of(*sections.ADVANTAGE_ESTIMATORS),
  "advantage.gamma": _PROB,
  "advantage.gae_lambda": _PROB,
  "advantage.vapo_alpha": _NONNEG,
  "advantage.max_resample_rounds": _NONNEG,
  "advantage.overlong_max_len": v.at_least(0, "0 turns overlong shaping off"),
  "advantage.overlong_cache_len": _NONNEG,
  "critic.learning_rate": _PROB,
  "critic.gae_lambda": _PROB,
  "critic.value_clip": _POSITIVE,
  "critic.value_coef": _NONNEG,
  "critic.pretrain_steps": v.at_least(0, "0 = no value pretraining"),
  "update.ppo_epochs": _POSITIVE_INT,
  "update.minibatches": _POSITIVE_INT,
  "update.micro_batches": _POSITIVE_INT,
  "update.entropy_coef": _NONNEG,
  "update.logprob_chunk": v.at_least(0, "0 = the whole sequence at once"),
  "update.remat_policy": v.one_of("full", "dots"),
  # 0 is a legitimate control (the policy never moves): see `notes`.
  "optim.learning_rate": _PROB,
  "optim.steps": v.at_least(0, "0 = run.steps × ppo_epochs × minibatches"),
  "optim.warmup_steps": _NONNEG,
  "optim.schedule": v.one_of("constant", "cosine"),
  "optim.weight_decay": _NONNEG,
  "optim.max_grad_norm": v.at_least(0, "0 turns clipping off"),
  # b = 1 never forgets the first moment and divides by a zero bias
  # correction (NaN weights in the first step).
  "optim.b1": v.in_range(0.0, 1.0, hi_open=True),
  "optim.b2": v.in_range(0.0, 1.0, hi_open=True),
  "mesh.data": _mesh_size,
  "mesh.fsdp": _mesh_size,
  "mesh.tensor": _mesh_size,
  "run.steps": _POSITIVE_INT,
  "run.seed": v.in_range(0, _MAX_SEED),
  "run.run_dir": v.non_empty_str,
  "run.checkpoint_every": _POSITIVE_INT,
  "run.keep_checkpoints": _POSITIVE_INT,
  "run.eval_every": v.at_least(0, "0 = only before and after training"),
  "run.max_staleness": v.at_least(0, "0 only with async_mode=streaming"),
  "run.async_mode": _async_mode,
}

# The Python types a field's hint may name; a config holds only what its
# config.json can record.
_TYPED = (bool, int, float, str)


def _type_rule(name: str) -> v.Rule | None:
  """The rule of the field's type hint (`X | None` also takes None)."""
  hint = sections.field_type(name)
  args = typing.get_args(hint)
  union = typing.get_origin(hint) in (typing.Union, types.UnionType)
  if union and type(None) in args:
    base = next(a for a in args if a is not type(None))
    return v.optional(v.of_type(base)) if base in _TYPED else None
  return v.of_type(hint) if hint in _TYPED else None


# The float fields whose infinity means something (core's PolicyLossConfig:
# no clip, no cap). Every other float field must be finite: an infinite
# hyper-parameter is a config error, not a run that the non-finite guard
# stops after its first step.
INF_ALLOWED = frozenset(
  {"loss.eps_low", "loss.eps_high", "loss.tis_cap", "loss.dual_clip"}
)


def _finite(value) -> str | None:
  # Only floats: the type rule has already refused what is not a number.
  if isinstance(value, float) and not math.isfinite(value):
    return "a finite number"
  return None


def field_problems(name: str, value: Any) -> list[Problem]:
  """The problem of one dotted field's value: its type, then finiteness
  (floats outside INF_ALLOWED), then its rule (the rule only sees values of
  the right type)."""
  finite = None if name in INF_ALLOWED else _finite
  rule = v.all_of(
    *(
      r
      for r in (_type_rule(name), finite, FIELD_RULES.get(name))
      if r is not None
    )
  )
  expected = rule(value)
  return [Problem(name, value, expected)] if expected else []


# ------------------------------------------------------------ several fields


def _batch_checks(cfg: TrainConfig) -> list[Problem]:
  r, u = cfg.rollout, cfg.update
  batch = r.prompts_per_step * r.group_size
  if batch % u.minibatches:
    expected = f"a divisor of rollout.prompts_per_step*group_size={batch}"
    return [Problem("update.minibatches", u.minibatches, expected)]
  minibatch = batch // u.minibatches
  if minibatch % u.micro_batches:
    expected = f"a divisor of the minibatch size {minibatch}"
    return [Problem("update.micro_batches", u.micro_batches, expected)]
  return []


_GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce_pp_baseline")


def _group_checks(cfg: TrainConfig) -> list[Problem]:
  r, a = cfg.rollout, cfg.advantage
  out = []
  if a.estimator in _GROUP_ESTIMATORS and r.group_size < 2:
    why = f"advantage.estimator={a.estimator!r} compares samples within a group"
    out.append(
      Problem("rollout.group_size", r.group_size, f"group_size >= 2: {why}")
    )
  if a.dynamic_sampling and r.group_size < 2:
    why = "advantage.dynamic_sampling drops zero-variance groups"
    out.append(
      Problem("rollout.group_size", r.group_size, f"group_size >= 2: {why}")
    )
  return out


def _overlong_checks(cfg: TrainConfig) -> list[Problem]:
  a = cfg.advantage
  lengths = cfg.overlong_lengths()
  if a.overlong_max_len and a.overlong_cache_len >= a.overlong_max_len:
    expected = f"< advantage.overlong_max_len={a.overlong_max_len}"
    return [
      Problem("advantage.overlong_cache_len", a.overlong_cache_len, expected)
    ]
  if lengths is not None and lengths[1] > lengths[0]:
    expected = (
      f"<= overlong_max_len={lengths[0]} (0 means rollout.max_new_tokens)"
    )
    return [Problem("advantage.overlong_cache_len", lengths[1], expected)]
  return []


def _loss_and_mesh_checks(cfg: TrainConfig) -> list[Problem]:
  out = []
  loss = cfg.loss
  if loss.surrogate in ("gspo", "gspo_token") and loss.correction == "naive":
    expected = (
      "'ignore_behavior', 'tis' or 'acr' with surrogate='gspo' (naive "
      "would clip a sequence ratio against the quantized actor)"
    )
    out.append(Problem("loss.correction", loss.correction, expected))
  m = cfg.mesh
  if sum(s == -1 for s in (m.data, m.fsdp, m.tensor)) > 1:
    expected = "at most one size -1 (the devices left over)"
    out.append(Problem("mesh", m, expected))
  return out


def _task_checks(cfg: TrainConfig) -> list[Problem]:
  out = []
  t = cfg.task
  if cfg.run.eval_every > 0 and t.eval_size < 1:
    expected = (
      f">= 1 when run.eval_every={cfg.run.eval_every} evaluates during training"
    )
    out.append(Problem("task.eval_size", t.eval_size, expected))
  from rljax import data as data_lib  # no jax

  levels = {
    "arithmetic": data_lib.ARITHMETIC_LEVELS,
    "countdown": data_lib.COUNTDOWN_LEVELS,
  }.get(t.name)
  if t.name == "arithmetic":  # a level or a knob spec (issue 17)
    try:
      data_lib.parse_difficulty(t.difficulty)
    except ValueError as e:
      expected = (
        f"a level of task.name='arithmetic' {tuple(levels)} or a "
        f"spec such as 'steps=2_digits=2' ({e})"
      )
      out.append(Problem("task.difficulty", t.difficulty, expected))
  elif levels is not None and t.difficulty not in levels:
    expected = f"a level of task.name={t.name!r}: one of {tuple(levels)}"
    out.append(Problem("task.difficulty", t.difficulty, expected))
  if t.name in data_lib.DATASET_SPECS and not t.data_path:
    expected = f"the file of dataset task.name={t.name!r}"
    out.append(Problem("task.data_path", t.data_path, expected))
  return out + _tool_task_checks(cfg)


def _tool_task_checks(cfg: TrainConfig) -> list[Problem]:
  """A tool task's episodes (rljax.train.tasks.ToolTask): what the
  multi-turn rollout supports, and room for a whole trajectory."""
  from rljax.train.tasks import TOOL_LEVELS, TOOL_TASKS  # no jax

  t, out = cfg.task, []
  if t.name not in TOOL_TASKS:
    return out
  if t.difficulty not in TOOL_LEVELS:
    expected = f"a level of task.name={t.name!r}: one of {tuple(TOOL_LEVELS)}"
    out.append(Problem("task.difficulty", t.difficulty, expected))
  why = (
    f"with task.name={t.name!r} (an episode's rewards and tool metrics do "
    "not travel through the pipelined queue and its checkpoint)"
  )
  if cfg.run.pipelined:
    out.append(Problem("run.pipelined", cfg.run.pipelined, f"False {why}"))
  elif getattr(cfg.run, "async_mode", "off") != "off":  # pipelined's twin
    out.append(Problem("run.async_mode", cfg.run.async_mode, f"'off' {why}"))
  if cfg.reward.name != "verifier":
    expected = (
      f"'verifier' with task.name={t.name!r} (the environment scores each "
      "episode's final answer)"
    )
    out.append(Problem("reward.name", cfg.reward.name, expected))
  new = cfg.rollout.max_new_tokens
  if t.max_prompt_tokens - new < 16:
    expected = (
      f">= rollout.max_new_tokens + 16 = {new + 16} with task.name="
      f"{t.name!r}: every turn's engine call holds the first prompt and the "
      f"trajectory so far (up to max_new_tokens={new} ids)"
    )
    out.append(Problem("task.max_prompt_tokens", t.max_prompt_tokens, expected))
  if t.max_turn_tokens > new:
    expected = f"<= rollout.max_new_tokens={new}, the whole trajectory's ids"
    out.append(Problem("task.max_turn_tokens", t.max_turn_tokens, expected))
  return out


def _reward_checks(cfg: TrainConfig) -> list[Problem]:
  rw = cfg.reward
  if rw.name == "reward_model" and not rw.model_path:
    expected = (
      "the directory written by experiments/train_reward_model.py when "
      "reward.name='reward_model'"
    )
    return [Problem("reward.model_path", rw.model_path, expected)]
  if rw.name == "judge":
    from rljax.rewards.judge import check_address  # only when judging

    try:
      check_address(rw.judge_url, rw.judge_allow_remote)
    except ValueError as e:
      return [Problem("reward.judge_url", rw.judge_url, str(e))]
  return []


_QUANTIZED = ("int8", "int8_wo", "fp8")


def _silent_no_op_checks(cfg: TrainConfig) -> list[Problem]:
  """Settings that another field turns into a no-op: refused, so a run is
  never recorded as doing what it did not do."""
  r, out = cfg.rollout, []
  if r.fake_quant and r.quant not in _QUANTIZED:
    expected = (
      f"False with rollout.quant={r.quant!r}: fake_quant emulates the "
      f"integer/fp8 matmuls of rollout.quant in {_QUANTIZED}"
    )
    out.append(Problem("rollout.fake_quant", r.fake_quant, expected))
  if r.vllm_urls and r.engine != "vllm":
    expected = (
      f"'' with rollout.engine={r.engine!r} (only the vllm engine reads "
      "the URLs)"
    )
    out.append(Problem("rollout.vllm_urls", r.vllm_urls, expected))
  if r.batching != "static" and r.engine != "jax":
    expected = (
      f"'static' with rollout.engine={r.engine!r} (the setting is the JAX "
      "sampler's; vLLM always batches continuously)"
    )
    out.append(Problem("rollout.batching", r.batching, expected))
  if r.kv_page_size and r.batching != "continuous":
    expected = (
      f"0 with rollout.batching={r.batching!r} (pages hold the continuous "
      "engine's slot KV; add --rollout.batching=continuous)"
    )
    out.append(Problem("rollout.kv_page_size", r.kv_page_size, expected))
  run = cfg.run
  if run.max_staleness != 1 and run.async_mode == "off":
    expected = (
      "1 without --run.async_mode=one_step or streaming (a synchronous run "
      "is never stale; add --run.async_mode=one_step, or its alias "
      "--run.pipelined, or --run.async_mode=streaming)"
    )
    out.append(Problem("run.max_staleness", run.max_staleness, expected))
  if run.max_staleness == 0 and run.async_mode == "one_step":
    expected = (
      ">= 1 with async_mode=one_step (the rollout of step k + s is made "
      "while step k updates; 0 is --run.async_mode=streaming's synchronous "
      "pace)"
    )
    out.append(Problem("run.max_staleness", run.max_staleness, expected))
  if r.inflight_kv != "keep" and run.async_mode != "streaming":
    expected = (
      f"'keep' with run.async_mode={run.async_mode!r} (only streaming "
      "rollouts take weights in flight)"
    )
    out.append(Problem("rollout.inflight_kv", r.inflight_kv, expected))
  if run.async_mode in sections.ASYNC_MODES and run.pipelined != (
    run.async_mode == "one_step"
  ):
    expected = (
      f"{'one_step' if run.pipelined else 'off'} with run.pipelined="
      f"{run.pipelined} (--run.pipelined is an alias of "
      "--run.async_mode=one_step: set one of them, or both alike)"
    )
    out.append(Problem("run.async_mode", run.async_mode, expected))
  if cfg.uses_critic and cfg.critic.value_coef == 0:
    expected = (
      "> 0 with advantage.estimator='gae': a critic that never learns would "
      "feed GAE its initial values"
    )
    out.append(Problem("critic.value_coef", cfg.critic.value_coef, expected))
  return out


def _engine_url_checks(cfg: TrainConfig) -> list[Problem]:
  r = cfg.rollout
  if r.engine != "vllm" or not r.vllm_urls:
    return []
  from rljax.rollout.vllm.config import check_engine_urls  # no jax

  try:
    check_engine_urls(r.vllm_urls, r.vllm_allow_remote)
  except ValueError as e:
    expected = f"loopback servers, or --rollout.vllm_allow_remote ({e})"
    return [Problem("rollout.vllm_urls", r.vllm_urls, expected)]
  return []


def _streaming_checks(cfg: TrainConfig) -> list[Problem]:
  """What --run.async_mode=streaming runs on: the continuous JAX engine
  (its in-flight weight updates, rljax/rollout/inflight.py) or one vLLM
  server (rljax/rollout/vllm/inflight.py), single-turn tasks (multi-turn
  ones: `_tool_task_checks`); dynamic sampling filters the groups as they
  arrive and refills through the stream (train/group_stream.py)."""
  if cfg.run.async_mode != "streaming":
    return []
  r, out = cfg.rollout, []
  if r.engine == "vllm" and len([u for u in r.vllm_urls.split(",") if u]) > 1:
    expected = (
      "one server (or none: one is started) with run.async_mode='streaming' "
      "(in-flight weight updates pause and resume one vLLM server, "
      "VLLMSidecar.generate_inflight; a pool of several has none; fall back "
      "to --run.async_mode=one_step)"
    )
    out.append(Problem("rollout.vllm_urls", r.vllm_urls, expected))
  elif r.engine == "jax" and r.batching != "continuous":
    expected = (
      "'continuous' with run.async_mode='streaming' (new weights are taken "
      "between decode chunks; the static engine decodes a chunk of prompts "
      "to its end in one program)"
    )
    out.append(Problem("rollout.batching", r.batching, expected))
  return out


def _lora_checks(cfg: TrainConfig) -> list[Problem]:
  try:
    cfg.lora_config()  # lora_targets / lora_base_dtype by name
  except ValueError as e:
    m = cfg.model
    return [
      Problem("model.lora_*", (m.lora_targets, m.lora_base_dtype), str(e))
    ]
  return []


# In the order their problems are listed.
CROSS_CHECKS: list[Callable[[TrainConfig], list[Problem]]] = [
  _batch_checks,
  _group_checks,
  _overlong_checks,
  _loss_and_mesh_checks,
  _task_checks,
  _reward_checks,
  _lora_checks,
  _silent_no_op_checks,
  _streaming_checks,
  _engine_url_checks,
]


def cross_problems(
  cfg: TrainConfig, reported: Collection[str]
) -> list[Problem]:
  """The problems of CROSS_CHECKS over fields not in `reported`.

  A cross check that fails to run (it reads a field of the wrong type) adds
  nothing when a problem is already known: it is that problem's echo.
  Otherwise its error propagates: it is a bug of the check.
  """
  out: list[Problem] = []
  for cross in CROSS_CHECKS:
    try:
      out.extend(p for p in cross(cfg) if p.field not in reported)
    except (ArithmeticError, TypeError, ValueError):
      if not (reported or out):
        raise
  return out


def validate(cfg: TrainConfig) -> list[Problem]:
  """Every problem of `cfg`: section types, per-field types and ranges,
  then cross-field checks (a cross check that cannot run because one of
  its fields is already reported adds nothing)."""
  problems = field_problems("algorithm", cfg.algorithm)
  for name, cls in sections.SECTIONS.items():
    section = getattr(cfg, name)
    if not isinstance(section, cls):
      problems.append(Problem(name, section, f"a {cls.__name__}"))
      continue
    for f in sections.fields(cls):
      problems += field_problems(f"{name}.{f.name}", getattr(section, f.name))
  if any(p.field in sections.SECTIONS for p in problems):
    return problems  # a section of the wrong type: nothing more to check
  return problems + cross_problems(cfg, {p.field for p in problems})


# The random "tiny" decoder of the tests has a nominal context (128): it was
# trained on no length, and its prompts alone may fill it.
_NOMINAL_CONTEXT_MODELS = ("tiny",)


def model_problems(cfg: TrainConfig, model_config: Any) -> list[Problem]:
  """The problems of `cfg` against the model it loaded (its `ModelConfig`):
  checked as soon as the model's shape is known, before any buffer is
  sized from these fields.

  * model.lora_rank <= hidden_size: every adapted projection has the
    residual width on one side; a larger rank is not low-rank any more.
  * rollout.max_new_tokens, and task.max_prompt_tokens + max_new_tokens,
    within max_position_embeddings (the context the checkpoint was trained
    for; the KV cache and the trainer's logits grow with it).
  """
  out = []
  width = model_config.hidden_size
  if cfg.model.lora_rank > width:
    expected = f"<= the model's hidden_size {width} (or 0: no LoRA)"
    out.append(Problem("model.lora_rank", cfg.model.lora_rank, expected))
  ctx = model_config.max_position_embeddings
  new, prompt = cfg.rollout.max_new_tokens, cfg.task.max_prompt_tokens
  if new >= ctx:
    expected = f"< the model's context max_position_embeddings={ctx}"
    out.append(Problem("rollout.max_new_tokens", new, expected))
  elif prompt + new > ctx and cfg.model.name not in _NOMINAL_CONTEXT_MODELS:
    expected = (
      f"<= {ctx - prompt}: task.max_prompt_tokens={prompt} + max_new_tokens "
      f"must fit the model's context max_position_embeddings={ctx}"
    )
    out.append(Problem("rollout.max_new_tokens", new, expected))
  return out


def notes(cfg: TrainConfig) -> list[str]:
  """One line for each legitimate but unusual setting of `cfg`, saying what
  it means (the scripts print them at start): research settings are
  accepted, never silently."""
  out = []
  loss = cfg.loss
  for name in ("eps_low", "eps_high"):
    if getattr(loss, name) == math.inf:
      side = "below" if name == "eps_low" else "above"
      out.append(
        f"--loss.{name}=inf: the ratio is not clipped {side} (an unclipped "
        "policy gradient on that side)"
      )
  if cfg.optim.learning_rate == 0:
    out.append(
      "--optim.learning_rate=0: a control run, the policy never moves (only "
      "the rollout/trainer mismatch and the sampling noise are measured)"
    )
  return out


def check(cfg: TrainConfig) -> None:
  """Raises `ConfigError` listing every problem of `cfg`."""
  problems = validate(cfg)
  if problems:
    raise ConfigError(problems)
