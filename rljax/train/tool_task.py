"""Tool tasks: the trainer's prompts are multi-turn episodes with a tool.

`--task.name=tool_arithmetic` trains on `rljax.envs.generate_tool_arithmetic`
(4-6 digit operands, exact answers a 135M model does not know by heart),
`--task.name=tool_word_problems` on `rljax.envs.generate_tool_word_problems`
(multi-step word problems a short program answers; `--task.tool=python`):
each rollout row is an episode of `rljax.rollout.multiturn.rollout_multiturn`
in a fresh `ToolEnv` (`--task.tool=calculator|python`,
`--task.tool_format=tags|qwen|chat_qwen|chat_llama3|chat_smollm2`,
`--task.max_calls_per_turn`), its reward the environment's verdict on the
final answer (`rljax.envs.score_answer`), its `action_mask` the model's ids.
The collector (`collect.py`) runs the episodes instead of one generation
when a task says `multi_turn`; held-out evaluation (`heldout.py`) runs them
greedily. A turn ends by stop string (`MultiTurnConfig(stop_by="string")`):
the engine decodes on past a '>' and the driver cuts the turn after the
closing tag. A chat format reads the calls in the model's own syntax, the
turn ended by its end-of-turn id; where the tokenizer's chat template takes
`tools=`, the tools are rendered by it (`ToolsChatTemplate`).

Budgets: `rollout.max_new_tokens` bounds a whole trajectory (model and tool
ids: the width the update step packs responses to), `task.max_turn_tokens`
one model turn, `task.max_turns` the turns. Every engine call's prompt is
the first prompt plus the trajectory so far, so the engine's prompt capacity
(`task.max_prompt_tokens`) must hold both: first prompts are kept up to
`max_prompt_tokens - max_new_tokens` ids.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from rljax import data as data_lib
from rljax import envs
from rljax.envs import sandbox, tool_parsers
from rljax.rollout.base import SamplingConfig
from rljax.rollout.multiturn import (
  MultiTurnConfig,
  MultiTurnRollout,
  rollout_multiturn,
)
from rljax.train import tasks as tasks_lib
from rljax.train.config import ConfigError, Problem, sections

TOOL_TASKS = tasks_lib.TOOL_TASKS
TOOL_CHOICES = sections.TOOL_CHOICES
# Problems drawn for training: far more than a CPU run's steps × prompts,
# and each is rendered and tokenized once at start (the length filter).
TOOL_POOL = 4096
# Held-out problems are generated with this seed + run.seed (disjoint
# streams: training's seed is run.seed).
HELD_OUT_SEED = 10_000
# The worked example of `--task.tool_prompt=example`.
_EXAMPLE_QUESTION = "What is 1234 \u00d7 5678?"
_EXAMPLE_EXPRESSION = "1234 * 5678"
_EXAMPLE_ANSWER = "7006652"


def _identity(text: str) -> str:
  return text


def make_tool(name: str, python_sandbox: str = "strong") -> envs.Tool:
  """The tool `--task.tool` names; the python tool in the sandbox mode
  `--task.python_sandbox` names, or a `SandboxUnavailable` error saying why
  that mode cannot run here (the run never falls back to a weaker one)."""
  if name == "calculator":
    return envs.CalculatorTool()
  if name == "python":
    if python_sandbox not in sandbox.SANDBOX_MODES:
      raise ValueError(
        f"task.python_sandbox={python_sandbox!r}; expected one of "
        f"{sandbox.SANDBOX_MODES}"
      )
    sandbox.require(python_sandbox)
    return envs.PythonTool(sandbox.SandboxConfig(mode=python_sandbox))
  raise ValueError(f"task.tool={name!r}; expected 'calculator' or 'python'")


def sandbox_problems(task) -> list[Problem]:
  """`--task.python_sandbox`'s problems: a mode that does not exist, one
  named where no python tool runs (it would do nothing), or the strong mode
  where it cannot run (with the reason and how to name the weaker one)."""
  mode, field = task.python_sandbox, "task.python_sandbox"
  if mode not in sandbox.SANDBOX_MODES:
    return [Problem(field, mode, f"one of {sandbox.SANDBOX_MODES}")]
  if task.name not in TOOL_TASKS or task.tool != "python":
    if mode == "strong":
      return []
    expected = (
      f"'strong' (the default) unless task.tool='python' with a tool task "
      f"(here task.name={task.name!r}, task.tool={task.tool!r})"
    )
    return [Problem(field, mode, expected)]
  try:
    sandbox.require(mode)
  except sandbox.SandboxUnavailable as error:
    return [Problem(field, mode, f"a mode that can run here: {error}")]
  return []


def worked_example(tool: envs.Tool, format_name: str) -> str:
  """One call of `tool` in `format_name` and its answer, as the model should
  write them (the observation is the format's own text)."""
  argument = (
    _EXAMPLE_EXPRESSION
    if tool.argument == "expression"
    else f"print({_EXAMPLE_EXPRESSION})"
  )
  arguments = {tool.argument: argument}
  family = envs.CHAT_FORMATS.get(format_name, format_name)
  if family == "tags":
    call = f"<{tool.name}>{argument}</{tool.name}>"
  elif family == "llama3":
    call = json.dumps({"name": tool.name, "parameters": arguments})
  elif family == "smollm2":
    body = json.dumps([{"name": tool.name, "arguments": arguments}])
    call = f"<tool_call>{body}</tool_call>"
  else:
    body = json.dumps({"name": tool.name, "arguments": arguments})
    call = f"<tool_call>\n{body}\n</tool_call>"
  fmt = envs.make_format(format_name)
  output = fmt.observation([envs.ToolResult(_EXAMPLE_ANSWER)])
  return (
    f"Example:\n{_EXAMPLE_QUESTION}\n{call}{output}"
    f"The answer is \\boxed{{{_EXAMPLE_ANSWER}}}."
  )


@dataclasses.dataclass(frozen=True)
class ToolPrompt:
  """The first observation: instructions, [a worked example,] question."""

  example: str = ""

  def __call__(self, example: data_lib.Example, instructions: str) -> str:
    shown = f"\n\n{self.example}" if self.example else ""
    return (
      f"{instructions}{shown}\n\n{example.question}\n"
      "Put the final answer in \\boxed{}."
    )


def call_prefix(tool: envs.Tool, format_name: str) -> str:
  """The opening of a call of `tool` in `format_name`, up to where the
  model's own text starts: the tool's argument (`--task.tool_choice=
  required` puts it at the end of the first prompt)."""
  family = envs.CHAT_FORMATS.get(format_name, format_name)
  if family == "tags":
    return f"<{tool.name}>"
  key = "parameters" if family == "llama3" else "arguments"
  head = json.dumps({"name": tool.name, key: {tool.argument: ""}})
  head = head[: -len('""}}')] + '"'
  if family == "llama3":
    return head
  if family == "smollm2":
    return "<tool_call>[" + head
  return "<tool_call>\n" + head


def template_takes_tools(tokenizer) -> bool:
  """The tokenizer's chat template renders a `tools` list (its Jinja text
  reads the variable), so `apply_chat_template(..., tools=...)` shows the
  model its tools as it was trained to see them."""
  template = getattr(tokenizer, "chat_template", None)
  return isinstance(template, str) and "tools" in template


def template_mismatch(tokenizer, format_name: str) -> str:
  """A line saying that the tokenizer's chat template teaches another call
  syntax than the chat format chosen ("" if it does not, or names none)."""
  template = getattr(tokenizer, "chat_template", None)
  parser = tool_parsers.parser_for_template(
    template if isinstance(template, str) else None
  )
  family = envs.CHAT_FORMATS.get(format_name)
  if family is None or parser is None or parser == family:
    return ""
  return (
    f"[rljax] task.tool_format={format_name!r}, but the tokenizer's chat "
    f"template writes calls as {parser!r} (chat_{parser})"
  )


class ToolsChatTemplate:
  """The chat template around the first observation, the tools passed as
  `apply_chat_template(..., tools=schemas)` (the template lists them in
  its own words, so the observation holds no tool instructions)."""

  def __init__(self, tokenizer, schemas: Sequence[dict]):
    self.tokenizer, self.schemas = tokenizer, list(schemas)

  def __call__(self, text: str) -> str:
    return self.tokenizer.apply_chat_template(
      [{"role": "user", "content": text}],
      tools=self.schemas,
      tokenize=False,
      add_generation_prompt=True,
    )


class FirstCallPrefilled:
  """`tool_choice="required"`: the episode's first model turn begins with
  `prefix` (a call's opening, `call_prefix`), which the prompt's ids end
  with, so the model only writes the call's argument and what follows.
  The environment reads the turn with the prefix put back; the prefix is
  prompt (never trained on), the rest the model's. Why: SmolLM2-135M-
  Instruct calls the calculator in <1 % of its episodes at temperature 1.0
  (README, "Multi-turn and tools"), too rarely for GRPO to learn from."""

  def __init__(self, env: envs.Environment, prefix: str):
    self.env, self.prefix = env, prefix
    self.stop_sequences = tuple(env.stop_sequences)
    self.eos_ends_turn = bool(getattr(env, "eos_ends_turn", False))
    self._first = True

  def reset(self, example: data_lib.Example) -> str:
    self._first = True
    return self.env.reset(example)

  def step(self, turn: str) -> envs.StepResult:
    if self._first:
      self._first, turn = False, self.prefix + turn
    return self.env.step(turn)


def make_tool_env(
  tool: envs.Tool,
  env_config: envs.ToolEnvConfig,
  prompt: ToolPrompt,
  tokenizer,
  tool_choice: str = "auto",
) -> envs.Environment:
  """One episode's environment as the trainer makes it (`experiments/
  tool_eval.py` evaluates with the same): `tool`, the limits, the first
  observation `prompt`, token counts by `tokenizer`, and `tool_choice`
  ("auto", or "required": `FirstCallPrefilled`)."""
  if tool_choice not in TOOL_CHOICES:
    raise ValueError(
      f"task.tool_choice={tool_choice!r}; expected one of {TOOL_CHOICES}"
    )

  def count_tokens(text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))

  env = envs.ToolEnv(
    [tool], env_config, count_tokens=count_tokens, prompt_fn=prompt
  )
  if tool_choice == "required":
    return FirstCallPrefilled(env, call_prefix(tool, env_config.format))
  return env


def render_prompt_ids(
  tokenizer, render, first_observation: str, prefill: str = ""
) -> list[int]:
  """An episode's first prompt: the chat template around the first
  observation, then `prefill` (a forced call's opening) encoded on its own,
  so that the template's ids are the same with and without it."""
  ids = tokenizer.encode(render(first_observation), add_special_tokens=False)
  if prefill:
    ids += tokenizer.encode(prefill, add_special_tokens=False)
  return ids


class ToolTask(tasks_lib.Task):
  """A task whose rollouts are tool episodes (`multi_turn`): `episodes`
  runs them on an engine; `prompt_ids` is an episode's first prompt."""

  multi_turn = True

  def __init__(
    self,
    train: Sequence[data_lib.Example],
    held_out: Sequence[data_lib.Example],
    tokenizer,
    batch_size: int,
    seed: int,
    max_prompt_tokens: int,
    env_config: envs.ToolEnvConfig,
    tool: envs.Tool,
    response_tokens: int,
    turn_tokens: int,
    prompt: ToolPrompt = ToolPrompt(),
    prompts_filtered_long: int = 0,
    tool_choice: str = "auto",
    remote: envs.RemoteEnvFactory | None = None,
    kv_reuse: bool = False,
  ):
    # The chat template around the environment's first observation (and
    # the tools, where a chat format's template lists them).
    render = (
      ToolsChatTemplate(tokenizer, envs.tool_schemas([tool]))
      if env_config.tools_in_template
      else data_lib.ChatTemplate(tokenizer, user_template=_identity)
    )
    super().__init__(
      train,
      held_out,
      tokenizer,
      render,
      batch_size,
      seed,
      max_prompt_tokens,
      reward_workers=0,
      prompts_filtered_long=prompts_filtered_long,
    )
    self.env_config = env_config
    self.tool = tool
    self.prompt = prompt
    # Turns end by stop string: no engine call ends on a '>' that closes
    # nothing (rljax.rollout.multiturn).
    self.multiturn_config = MultiTurnConfig(
      max_response_tokens=response_tokens, stop_by="string"
    )
    self.turn_tokens = turn_tokens
    self.tool_choice = tool_choice
    self.kv_reuse = kv_reuse
    # An environment server's episodes replace the in-process environment.
    self.remote = remote
    # The prompt ends with a call's opening where the first call is forced.
    self.prefill = (
      call_prefix(tool, env_config.format) if tool_choice == "required" else ""
    )

  def make_env(self) -> envs.Environment:
    """A fresh environment (one per episode: it holds the episode)."""
    if self.remote is not None:
      return self.remote()
    return make_tool_env(
      self.tool, self.env_config, self.prompt, self.tokenizer, self.tool_choice
    )

  def render_ids(self, first_observation: str) -> list[int]:
    return render_prompt_ids(
      self.tokenizer, self.render, first_observation, self.prefill
    )

  def first_observation(self, example: data_lib.Example) -> str:
    """The text an episode of `example` starts with (opens no episode on
    an environment server)."""
    if self.remote is not None:
      return self.remote.first_observation(example)
    return self.make_env().reset(example)

  def prompt_text(self, example: data_lib.Example) -> str:
    return self.render(self.first_observation(example)) + self.prefill

  def prompt_ids(self, example: data_lib.Example) -> list[int]:
    ids = self.render_ids(self.first_observation(example))
    if len(ids) > self.max_prompt_tokens:
      raise ValueError(
        f"example {example.uid}: prompt of {len(ids)} tokens exceeds "
        f"max_prompt_tokens={self.max_prompt_tokens}"
      )
    return ids

  def episodes(
    self,
    engine,
    examples: Sequence[data_lib.Example],
    sampling: SamplingConfig,
    between_turns=None,
  ) -> MultiTurnRollout:
    """`sampling.n` episodes per example on `engine`; `sampling`'s
    max_new_tokens is replaced by the task's per-turn cap;
    `between_turns` as `rollout_multiturn` takes it (streaming mode's
    weight updates between turns, each turn's ids stamped)."""
    for e in examples:
      self.prompt_ids(e)  # the capacity check, with the example named
    return rollout_multiturn(
      engine,
      list(examples),
      self.make_env,
      self.tokenizer,
      dataclasses.replace(sampling, max_new_tokens=self.turn_tokens),
      self.multiturn_config,
      render_prompt=self.render_ids,
      kv_reuse=self.kv_reuse,
      between_turns=between_turns,
    )

  def score(self, completions, examples, n):
    raise NotImplementedError(
      "a tool task's rewards are its episodes' (ToolTask.episodes), not "
      "scores of single completions"
    )


def arithmetic_level(difficulty: str) -> envs.ToolArithmeticConfig:
  """The generator's config of `--task.difficulty`."""
  if difficulty not in tasks_lib.TOOL_LEVELS:
    raise ValueError(
      f"task.difficulty={difficulty!r}; expected one of "
      f"{sorted(tasks_lib.TOOL_LEVELS)}"
    )
  low, high = tasks_lib.TOOL_LEVELS[difficulty]
  return envs.ToolArithmeticConfig(min_steps=low, max_steps=high)


def generate_problems(name: str, n: int, seed: int, difficulty: str):
  """`n` problems of the tool task `name` (tool_arithmetic: long
  arithmetic for the calculator; tool_word_problems: word problems that
  take a program) at `--task.difficulty`."""
  if name == "tool_word_problems":
    return envs.generate_tool_word_problems(n, seed=seed, level=difficulty)
  if name != "tool_arithmetic":
    raise ValueError(f"task.name={name!r}; expected one of {TOOL_TASKS}")
  return envs.generate_tool_arithmetic(
    n, seed=seed, config=arithmetic_level(difficulty)
  )


def held_out_problems(
  n: int, run_seed: int, difficulty: str, name: str = "tool_arithmetic"
):
  """The held-out problems of a run with `--run.seed=run_seed`: generated
  with seed HELD_OUT_SEED + run_seed (training draws with run_seed itself,
  and drops any question that is also held out). The first `eval_size` are
  the trainer's own held-out split; more extend it with the same stream."""
  return generate_problems(name, n, HELD_OUT_SEED + run_seed, difficulty)


def build_tool_task(cfg, tokenizer) -> ToolTask:
  """The tool task `cfg.task` names (`tasks.build_task` dispatches here)."""
  t, new = cfg.task, cfg.rollout.max_new_tokens
  held_out = held_out_problems(t.eval_size, cfg.run.seed, t.difficulty, t.name)
  train = generate_problems(t.name, TOOL_POOL, cfg.run.seed, t.difficulty)
  held_q = {e.question for e in held_out}
  train = [e for e in train if e.question not in held_q]
  format_name = t.tool_format
  problems = sandbox_problems(t)
  if problems:
    raise ConfigError(problems)
  if template_mismatch(tokenizer, format_name):
    print(template_mismatch(tokenizer, format_name), flush=True)
  remote = envs.connect(t.env_url) if t.env_url else None
  tool = make_tool(t.tool, t.python_sandbox)
  if t.tool == "python":
    # config.json records task.python_sandbox, the mode that runs (there
    # is no fallback); this line adds what bounds a call on this machine.
    print(
      "[rljax] python tool sandbox: " + json.dumps(sandbox.limits(tool.config)),
      flush=True,
    )
  example = (
    worked_example(tool, t.tool_format) if t.tool_prompt == "example" else ""
  )
  env_config = envs.ToolEnvConfig(
    format=format_name,
    tools_in_template=(
      format_name in envs.CHAT_FORMATS and template_takes_tools(tokenizer)
    ),
    max_turns=t.max_turns,
    max_calls_per_turn=t.max_calls_per_turn,
    max_total_tokens=new,  # the driver's budget, in ids, cuts first
  )

  def make(train_examples, held, dropped=0):
    return ToolTask(
      train_examples,
      held,
      tokenizer,
      cfg.rollout.prompts_per_step,
      cfg.run.seed,
      t.max_prompt_tokens - new,
      env_config,
      tool,
      new,
      t.max_turn_tokens or new,
      ToolPrompt(example),
      prompts_filtered_long=dropped,
      tool_choice=t.tool_choice,
      remote=remote,
      kv_reuse=t.tool_kv_reuse,
    )

  probe = make(train, held_out)  # renders first prompts for the filter
  limit = probe.max_prompt_tokens

  def fits(e):
    return len(probe.render_ids(probe.first_observation(e))) <= limit

  kept_train = [e for e in train if fits(e)]
  kept_held = [e for e in held_out if fits(e)]
  dropped = len(train) + len(held_out) - len(kept_train) - len(kept_held)
  probe.close()
  if not kept_train:
    raise ValueError(
      f"task={t.name!r}: every first prompt is longer than "
      f"task.max_prompt_tokens={t.max_prompt_tokens} - rollout.max_new_tokens"
      f"={new} = {limit} ids; expected a larger max_prompt_tokens"
    )
  if dropped:
    print(
      f"[rljax] dropped {dropped} tool prompts longer than {limit} ids",
      flush=True,
    )
  return make(kept_train, kept_held, dropped)
