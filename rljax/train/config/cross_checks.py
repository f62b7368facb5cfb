"""The checks that involve several fields of a TrainConfig (CROSS_CHECKS):
batch divisibility, group sizes, task and tool-task settings, rewards,
LoRA, settings another field would make a silent no-op (a data file of a
generated task, tool fields without tools, critic fields without a
critic), the KV page size, streaming's engines and the vLLM addresses. A
check that involves several fields goes here; `cross_problems` runs them
all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Collection

from rljax.train.config import sections
from rljax.train.config.problems import Problem

if TYPE_CHECKING:
  from rljax.train.config.train_config import TrainConfig


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
  # Arithmetic takes a named level or a spec of its knobs (parse_difficulty).
  if t.name == "arithmetic":
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
  return out + _generated_task_checks(cfg) + _tool_task_checks(cfg)


def _generated_task_checks(cfg: TrainConfig) -> list[Problem]:
  """A generated task draws its problems: a data file would be read by
  nothing, and its held-out split is drawn by the same generator as its
  training pool (tasks.GENERATED_POOL problems), then removed from it."""
  from rljax import data as data_lib  # no jax
  from rljax.train.tasks import GENERATED_POOL, GENERATED_TASKS  # no jax

  t, out = cfg.task, []
  if t.name not in GENERATED_TASKS:
    return out
  if t.data_path:
    expected = (
      f"'' with task.name={t.name!r}: the task generates its problems; "
      "data_path is read only by dataset tasks "
      f"{tuple(sorted(data_lib.DATASET_SPECS))}"
    )
    out.append(Problem("task.data_path", t.data_path, expected))
  # Every held-out prompt is drawn and tokenized at start, then sampled at
  # each evaluation (before and after training, every run.eval_every
  # steps). A held-out set larger than the pool it is held out of is no
  # split, and a million of them take minutes to prepare, in silence,
  # before the first evaluation.
  if t.eval_size > GENERATED_POOL:
    expected = (
      f"<= {GENERATED_POOL} with generated task.name={t.name!r}: the "
      f"held-out split is drawn by the generator that draws the "
      f"{GENERATED_POOL} training problems and is removed from them (and "
      "each evaluation samples every held-out prompt)"
    )
    out.append(Problem("task.eval_size", t.eval_size, expected))
  return out


def _tool_task_checks(cfg: TrainConfig) -> list[Problem]:
  """A tool task's episodes (rljax.train.tasks.ToolTask): what the
  multi-turn rollout supports, and room for a whole trajectory."""
  from rljax.train.tasks import TOOL_LEVELS, TOOL_TASKS  # no jax

  t, out = cfg.task, []
  if t.name not in TOOL_TASKS:
    return _tool_fields_unused(cfg, TOOL_TASKS)
  if t.difficulty not in TOOL_LEVELS:
    expected = f"a level of task.name={t.name!r}: one of {tuple(TOOL_LEVELS)}"
    out.append(Problem("task.difficulty", t.difficulty, expected))
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
  if t.env_url:
    out += _remote_env_checks(cfg)
  if t.tool_kv_reuse:
    out += _kv_reuse_checks(cfg)
  return out


def _kv_reuse_checks(cfg: TrainConfig) -> list[Problem]:
  """Kept-KV episodes run in the continuous JAX engine, take no weights
  between turns, and step in-process environments only."""
  r, why = cfg.rollout, []
  if r.engine != "jax" or r.batching != "continuous":
    why.append(
      f"rollout.engine='jax' and rollout.batching='continuous' (not "
      f"{r.engine!r}, {r.batching!r}): the pages that keep an episode's KV "
      "are the continuous JAX engine's"
    )
  if cfg.run.async_mode == "streaming":
    why.append(
      "run.async_mode other than 'streaming': a streaming worker takes new "
      "weights between turns, and a kept-KV run takes none"
    )
  if cfg.task.env_url:
    why.append("task.env_url='': kept-KV episodes step in-process tools")
  if not why:
    return []
  return [Problem("task.tool_kv_reuse", True, "; ".join(why))]


# What the environment server decides when task.env_url names one.
_SERVER_FIELDS = (
  "tool",
  "tool_format",
  "tool_prompt",
  "python_sandbox",
  "max_turns",
  "max_calls_per_turn",
)


def _remote_env_checks(cfg: TrainConfig) -> list[Problem]:
  """With an environment server, the tool, its format and the prompt are
  the server's: setting them here would change nothing."""
  out = []
  for name in _SERVER_FIELDS:
    value = getattr(cfg.task, name)
    default = sections.field_default(f"task.{name}")
    if value != default:
      expected = (
        f"{default!r} with task.env_url={cfg.task.env_url!r}: the "
        "environment server chooses the tool, its format, the prompt and the "
        "turns"
      )
      out.append(Problem(f"task.{name}", value, expected))
  if cfg.task.tool_choice != "auto":
    expected = (
      f"'auto' with task.env_url={cfg.task.env_url!r}: a forced call's "
      "opening is written in the server's format, which the trainer does not "
      "know"
    )
    out.append(Problem("task.tool_choice", cfg.task.tool_choice, expected))
  return out


# The task fields only a tool task reads (task.python_sandbox too: its
# own check, tool_task.sandbox_problems, says more than this one would).
_TOOL_FIELDS = (
  "tool",
  "tool_format",
  "tool_prompt",
  "tool_choice",
  "max_turns",
  "max_calls_per_turn",
  "max_turn_tokens",
  "env_url",
  "tool_kv_reuse",
)


def _tool_fields_unused(cfg: TrainConfig, tool_tasks) -> list[Problem]:
  """A tool field set on a task without tools would change nothing."""
  out = []
  for name in _TOOL_FIELDS:
    value = getattr(cfg.task, name)
    default = sections.field_default(f"task.{name}")
    if value != default:
      expected = (
        f"{default!r} with task.name={cfg.task.name!r}: only tool tasks "
        f"({', '.join(tool_tasks)}) call tools and run multi-turn episodes"
      )
      out.append(Problem(f"task.{name}", value, expected))
  return out


def _critic_checks(cfg: TrainConfig) -> list[Problem]:
  """critic.* set where no critic runs (advantage.estimator != 'gae')
  would change nothing. A value is compared with what the algorithm's
  preset leaves there (a critic preset's estimator overridden keeps its
  critic values: they were not typed)."""
  if cfg.uses_critic:
    return []
  from rljax.train.config.presets import PRESETS  # imports this module

  preset = PRESETS.get(cfg.algorithm, {})
  with_critic = tuple(
    name for name, p in PRESETS.items() if p.get("advantage.estimator") == "gae"
  )
  out = []
  for f in sections.fields(sections.CriticConfig):
    name = f"critic.{f.name}"
    value = getattr(cfg.critic, f.name)
    baseline = preset.get(name, sections.field_default(name))
    if value != baseline:
      expected = (
        f"{baseline!r} without a critic: algorithm={cfg.algorithm!r} with "
        f"advantage.estimator={cfg.advantage.estimator!r} trains none; an "
        f"algorithm with a critic ({', '.join(with_critic)}) or "
        "--advantage.estimator=gae trains one"
      )
      out.append(Problem(name, value, expected))
  return out


def _kv_page_checks(cfg: TrainConfig) -> list[Problem]:
  """A KV page no longer than the longest sequence a row holds: its
  prompt (task.max_prompt_tokens) and its response
  (rollout.max_new_tokens). A longer page holds slots no token is ever
  written to, and every live row takes at least one page, so a huge page
  sizes the pool past any memory (an anonymous RESOURCE_EXHAUSTED in the
  first rollout, where this names the field)."""
  r = cfg.rollout
  if not r.kv_page_size or r.batching != "continuous":
    return []  # 0 is off; with static batching _silent_no_op_checks says so
  longest = cfg.task.max_prompt_tokens + r.max_new_tokens
  if r.kv_page_size <= longest:
    return []
  expected = (
    f"<= {longest}, the longest sequence a row holds (task.max_prompt_tokens"
    f"={cfg.task.max_prompt_tokens} + rollout.max_new_tokens="
    f"{r.max_new_tokens}): a longer page holds slots no token is written "
    "to, and every live row takes one"
  )
  return [Problem("rollout.kv_page_size", r.kv_page_size, expected)]


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
  default_chunk = sections.field_default("rollout.chunk_steps")
  if r.chunk_steps != default_chunk and r.batching != "continuous":
    expected = (
      f"{default_chunk} (the default) with rollout.batching="
      f"{r.batching!r} (chunks are the continuous engine's; add "
      "--rollout.batching=continuous)"
    )
    out.append(Problem("rollout.chunk_steps", r.chunk_steps, expected))
  if r.speculative != "off" and (
    r.engine != "jax" or r.batching != "continuous"
  ):
    expected = (
      f"'off' with rollout.engine={r.engine!r}, rollout.batching="
      f"{r.batching!r} (speculation runs in the continuous JAX engine; add "
      "--rollout.batching=continuous)"
    )
    out.append(Problem("rollout.speculative", r.speculative, expected))
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
  _critic_checks,
  _kv_page_checks,
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
