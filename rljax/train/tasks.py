"""What the trainer trains on: prompts, how they are rendered, how answers are
scored, and where the data iterator stands (saved in checkpoints).

A `Task` joins `rljax.data` (examples, templates, the resumable iterator) and
`rljax.rewards` (verifiers in a process pool with per-item timeouts) behind
the few calls the loop makes. `--reward.name` swaps the training reward for a
learned reward model, VR-CLI or an LLM judge (`build_reward`); held-out
evaluation keeps the verifier (`Task.verify`), so runs with different rewards
are compared on the same accuracy.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np

from rljax import data as data_lib
from rljax import rewards as rewards_lib
from rljax.train.config import TrainConfig

# The judge server's bearer token (a vLLM sidecar's run key), if it needs one.
JUDGE_API_KEY_ENV = "RLJAX_JUDGE_API_KEY"

# Tasks whose rollouts are multi-turn tool episodes (tool_task.py).
TOOL_TASKS = ("tool_arithmetic", "tool_word_problems")
GENERATED_TASKS = ("arithmetic", "countdown") + TOOL_TASKS
# --task.difficulty of tool_arithmetic: (min, max) operations per problem on
# 4-6 digit operands. "easy" needs one tool call; "hard" is the generator's
# own default. tool_word_problems takes the same names (its sizes' scale). Plain tuples: the config's validation reads them without
# importing the environments.
TOOL_LEVELS = {"easy": (1, 1), "medium": (2, 2), "hard": (2, 4)}
# Training examples drawn for a generated task; far more than any CPU run uses.
GENERATED_POOL = 20000
SHORT_ANSWER_INSTRUCTION = "Put the final answer within \\boxed{}."


class Task:
  """Training and held-out examples, rendered with a template and scored."""

  def __init__(
    self,
    train: Sequence[data_lib.Example],
    held_out: Sequence[data_lib.Example],
    tokenizer,
    render: Callable[[str], str],
    batch_size: int,
    seed: int,
    max_prompt_tokens: int,
    reward_workers: int = 1,
    reward_timeout_s: float = 10.0,
    last_number_fallback: bool = False,
    reward: "rewards_lib.batched.BatchedReward | None" = None,
    prompts_filtered_long: int = 0,
  ):
    if not train:
      raise ValueError("the task has no training examples")
    # Examples dropped by `drop_long_prompts` (reported in the metrics).
    self.prompts_filtered_long = prompts_filtered_long
    self.tokenizer = tokenizer
    self.render = render
    self._held_out = list(held_out)
    self._iter = data_lib.BatchIterator(list(train), batch_size, seed=seed)
    self.max_prompt_tokens = max_prompt_tokens
    eos = getattr(tokenizer, "eos_token_id", None)
    self.stop_token_ids = (int(eos),) if eos is not None else ()
    self._pool = rewards_lib.RewardPool(
      rewards_lib.Correctness(last_number_fallback=last_number_fallback),
      mode="process" if reward_workers > 0 else "serial",
      num_workers=max(reward_workers, 1),
      timeout_s=reward_timeout_s,
    )
    # The training reward: the verifier pool, or a batched reward that runs
    # in this process (a model on the accelerator, a judge over HTTP).
    self._reward = reward if reward is not None else self._pool

  def prompt_text(self, example: data_lib.Example) -> str:
    return self.render(example.question)

  def prompt_ids(self, example: data_lib.Example) -> list[int]:
    text = self.prompt_text(example)
    ids = self.tokenizer.encode(text, add_special_tokens=False)
    if len(ids) > self.max_prompt_tokens:
      raise ValueError(
        f"example {example.uid}: prompt of {len(ids)} tokens exceeds "
        f"max_prompt_tokens={self.max_prompt_tokens}"
      )
    return ids

  def next_train_batch(self, n: int) -> list[data_lib.Example]:
    if n != self._iter.batch_size:
      raise ValueError(
        f"batches are {self._iter.batch_size} prompts, asked {n}"
      )
    return next(self._iter)

  def eval_examples(self) -> list[data_lib.Example]:
    return list(self._held_out)

  def score(
    self,
    completions: Sequence[str],
    examples: Sequence[data_lib.Example],
    n: int,
  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Training rewards [len(completions)]; completion b answers
    examples[b // n].

    A verifier that crashes or times out scores 0 and is counted in the
    components `reward_errors` / `reward_timeouts`, never kills the run.
    """
    return self._score(self._reward, completions, examples, n)

  def verify(
    self,
    completions: Sequence[str],
    examples: Sequence[data_lib.Example],
    n: int,
  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Like `score`, always with the task's verifier (for evaluation)."""
    return self._score(self._pool, completions, examples, n)

  def _score(self, scorer, completions, examples, n):
    exs = [examples[b // n] for b in range(len(completions))]
    inputs = rewards_lib.make_inputs(
      [self.prompt_text(e) for e in exs],
      list(completions),
      [e.answer for e in exs],
      [dict(e.metadata) for e in exs],
    )
    result = scorer.score(inputs)
    comps = dict(result.components)
    status = np.asarray(result.status)
    comps["errors"] = (status == "error").astype(np.float32)
    comps["timeouts"] = (status == "timeout").astype(np.float32)
    return np.asarray(result.scores, np.float32), comps

  def state_dict(self) -> dict:
    return self._iter.state_dict()

  def load_state_dict(self, state: dict) -> None:
    self._iter.load_state_dict(state)

  def close(self) -> None:
    self._pool.close()
    if self._reward is not self._pool:
      self._reward.close()


def build_task(cfg: TrainConfig, tokenizer) -> Task:
  """The task named by `cfg.task.name`: a generated one, or a dataset file."""
  if cfg.task.name in TOOL_TASKS:
    from rljax.train import tool_task  # it builds on Task

    return tool_task.build_tool_task(cfg, tokenizer)
  generated = cfg.task.name in GENERATED_TASKS
  if generated:
    generate = (
      data_lib.generate_arithmetic
      if cfg.task.name == "arithmetic"
      else data_lib.generate_countdown
    )
    # Held-out examples come from a different seed stream than training.
    held_out = generate(
      cfg.task.eval_size, cfg.task.difficulty, seed=10_000 + cfg.run.seed
    )
    train = generate(GENERATED_POOL, cfg.task.difficulty, seed=cfg.run.seed)
    held_q = {e.question for e in held_out}
    train = [e for e in train if e.question not in held_q]
  else:
    if not cfg.task.data_path:
      raise ValueError(
        f"task={cfg.task.name!r} is not a generated task {GENERATED_TASKS}; "
        f"give its file with --task.data_path (datasets: "
        f"{sorted(data_lib.DATASET_SPECS)})"
      )
    rows = list(data_lib.load_dataset(cfg.task.name, cfg.task.data_path))
    rows = data_lib.shuffled(rows, cfg.run.seed)
  if generated:
    # Short answers within a small token budget. A 135M model rarely writes an
    # answer format at all, so generated tasks grade the last number when
    # there is none (datasets keep the strict verifier).
    render = data_lib.ChatTemplate(
      tokenizer,
      user_template=data_lib.BoxedTemplate(
        instruction=SHORT_ANSWER_INSTRUCTION
      ),
    )
    held_out, n_held = drop_long_prompts(
      held_out, render, tokenizer, cfg.task.max_prompt_tokens
    )
    train, n_train = drop_long_prompts(
      train, render, tokenizer, cfg.task.max_prompt_tokens
    )
  else:
    render = data_lib.ChatTemplate(tokenizer)
    # Filtered before the split, so the held-out set keeps eval_size rows.
    rows, n_train = drop_long_prompts(
      rows, render, tokenizer, cfg.task.max_prompt_tokens
    )
    n_held = 0
    held_out, train = rows[: cfg.task.eval_size], rows[cfg.task.eval_size :]
  if n_train + n_held:
    print(
      f"[rljax] dropped {n_train + n_held} prompts longer than "
      f"max_prompt_tokens={cfg.task.max_prompt_tokens}",
      flush=True,
    )
  if not train:
    raise ValueError(
      f"task={cfg.task.name!r}: no training prompt left ({n_train} dropped as "
      f"longer than max_prompt_tokens={cfg.task.max_prompt_tokens}, "
      f"{len(held_out)} held out by eval_size)"
    )
  return Task(
    train,
    held_out,
    tokenizer,
    render,
    cfg.rollout.prompts_per_step,
    cfg.run.seed,
    cfg.task.max_prompt_tokens,
    cfg.task.reward_workers,
    last_number_fallback=generated,
    reward=build_reward(cfg, tokenizer),
    prompts_filtered_long=n_train + n_held,
  )


# More characters than any token of a BPE vocabulary covers (their merges
# reach a few dozen): a bound on a prompt's length before tokenizing it.
MAX_CHARS_PER_TOKEN = 64


def drop_long_prompts(
  examples: Sequence[data_lib.Example], render, tokenizer, max_tokens: int
) -> tuple[list[data_lib.Example], int]:
  """(examples whose rendered prompt fits in `max_tokens`, number dropped).

  A prompt the engine cannot hold would stop the run at the step that
  draws it; dropping it up front (the usual `filter_overlong_prompts` of
  RL recipes) keeps the run going, and the count is reported.

  A question longer than `max_tokens * MAX_CHARS_PER_TOKEN` characters is
  dropped without being tokenized: one 50 MB line of a data file would
  otherwise take ~13 GB to tokenize, only to be dropped.
  """
  limit = max_tokens * MAX_CHARS_PER_TOKEN

  def fits(e: data_lib.Example) -> bool:
    if len(e.question) > limit:
      return False
    text = render(e.question)
    return len(tokenizer.encode(text, add_special_tokens=False)) <= max_tokens

  kept = [e for e in examples if fits(e)]
  return kept, len(examples) - len(kept)


def build_reward(cfg: TrainConfig, tokenizer):
  """The batched training reward named by `cfg.reward.name`; None = verifier.

  reward_model: a Bradley–Terry reward model dir (`reward_model_path`);
  vrcli: VR-CLI with a frozen reference (`vrcli_reference`, default the
  initial policy, `--model.name`), y = the example's answer; judge: an
  OpenAI-compatible judge at `judge_url` with the rubrics of
  `judge_rubrics`.
  """
  if cfg.reward.name == "verifier":
    return None
  if cfg.reward.name == "reward_model":
    from rljax.rewards import reward_model as rm_lib  # jax: only when used

    model = rm_lib.load_reward_model(cfg.reward.model_path)
    return rm_lib.RewardModelReward(
      model, tokenizer=model.tokenizer or tokenizer
    )
  if cfg.reward.name == "vrcli":
    from rljax.rewards import likelihood  # pylint: disable=g-import-not-at-top
    from rljax.train.loop import load_policy  # loop imports this module

    ref_cfg = (
      cfg.replace({"model.name": cfg.reward.vrcli_reference})
      if cfg.reward.vrcli_reference
      else cfg
    )
    reference = load_policy(ref_cfg, cfg.run.seed)
    if len(tokenizer) > reference.config.vocab_size:
      raise ValueError(
        f"vrcli_reference={ref_cfg.model.name!r} has vocab_size="
        f"{reference.config.vocab_size}, fewer than the policy tokenizer's "
        f"{len(tokenizer)} tokens; the reference must share the tokenizer"
      )
    return likelihood.LikelihoodImprovementReward(
      reference.config,
      reference.params,
      tokenizer,
      separator=cfg.reward.vrcli_separator,
      max_reasoning_tokens=cfg.rollout.max_new_tokens,
    )
  if cfg.reward.name == "judge":
    from rljax.rewards import judge  # pylint: disable=g-import-not-at-top

    rubrics = (
      judge.load_rubrics(cfg.reward.judge_rubrics)
      if cfg.reward.judge_rubrics
      else judge.JudgeConfig.rubrics
    )
    return judge.JudgeReward(
      judge.JudgeConfig(
        url=cfg.reward.judge_url,
        model=cfg.reward.judge_model,
        rubrics=rubrics,
        api=cfg.reward.judge_api,
        timeout_s=cfg.reward.judge_timeout_s,
        allow_remote=cfg.reward.judge_allow_remote,
        # A secret: from the environment, never a flag (flags are recorded
        # in config.json).
        api_key=os.environ.get(JUDGE_API_KEY_ENV) or None,
      )
    )
  raise ValueError(
    f"reward={cfg.reward.name!r}; expected one of "
    "('verifier', 'reward_model', 'vrcli', 'judge')"
  )
