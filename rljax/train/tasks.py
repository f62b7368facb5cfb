"""What the trainer trains on: prompts, how they are rendered, how answers are
scored, and where the data iterator stands (saved in checkpoints).

A `Task` joins `rljax.data` (examples, templates, the resumable iterator) and
`rljax.rewards` (verifiers in a process pool with per-item timeouts) behind
the few calls the loop makes.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rljax import data as data_lib
from rljax import rewards as rewards_lib
from rljax.train.config import TrainConfig

GENERATED_TASKS = ("arithmetic", "countdown")
# Training examples drawn for a generated task; far more than any CPU run uses.
GENERATED_POOL = 20000
SHORT_ANSWER_INSTRUCTION = "Put the final answer within \\boxed{}."


class Task:
  """Training and held-out examples, rendered with a template and scored."""

  def __init__(self, train: Sequence[data_lib.Example],
               held_out: Sequence[data_lib.Example], tokenizer,
               render: Callable[[str], str], batch_size: int, seed: int,
               max_prompt_tokens: int, reward_workers: int = 1,
               reward_timeout_s: float = 10.0,
               last_number_fallback: bool = False):
    if not train:
      raise ValueError("the task has no training examples")
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
        num_workers=max(reward_workers, 1), timeout_s=reward_timeout_s)

  def prompt_text(self, example: data_lib.Example) -> str:
    return self.render(example.question)

  def prompt_ids(self, example: data_lib.Example) -> list[int]:
    text = self.prompt_text(example)
    ids = self.tokenizer.encode(text, add_special_tokens=False)
    if len(ids) > self.max_prompt_tokens:
      raise ValueError(
          f"example {example.uid}: prompt of {len(ids)} tokens exceeds "
          f"max_prompt_tokens={self.max_prompt_tokens}")
    return ids

  def next_train_batch(self, n: int) -> list[data_lib.Example]:
    if n != self._iter.batch_size:
      raise ValueError(f"batches are {self._iter.batch_size} prompts, asked {n}")
    return next(self._iter)

  def eval_examples(self) -> list[data_lib.Example]:
    return list(self._held_out)

  def score(self, completions: Sequence[str],
            examples: Sequence[data_lib.Example], n: int
            ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Rewards [len(completions)]; completion b answers examples[b // n].

    A verifier that crashes or times out scores 0 and is counted in the
    components `reward_errors` / `reward_timeouts`, never kills the run.
    """
    exs = [examples[b // n] for b in range(len(completions))]
    inputs = rewards_lib.make_inputs(
        [self.prompt_text(e) for e in exs], list(completions),
        [e.answer for e in exs], [dict(e.metadata) for e in exs])
    result = self._pool.score(inputs)
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


def build_task(cfg: TrainConfig, tokenizer) -> Task:
  """The task named by `cfg.task`: a generated one, or a dataset file."""
  generated = cfg.task in GENERATED_TASKS
  if generated:
    generate = (data_lib.generate_arithmetic if cfg.task == "arithmetic"
                else data_lib.generate_countdown)
    # Held-out examples come from a different seed stream than training.
    held_out = generate(cfg.eval_size, cfg.task_difficulty, seed=10_000 + cfg.seed)
    train = generate(GENERATED_POOL, cfg.task_difficulty, seed=cfg.seed)
    held_q = {e.question for e in held_out}
    train = [e for e in train if e.question not in held_q]
  else:
    if not cfg.data_path:
      raise ValueError(
          f"task={cfg.task!r} is not a generated task {GENERATED_TASKS}; "
          f"give its file with --data_path (datasets: "
          f"{sorted(data_lib.DATASET_SPECS)})")
    rows = list(data_lib.load_dataset(cfg.task, cfg.data_path))
    rows = data_lib.shuffled(rows, cfg.seed)
    held_out, train = rows[:cfg.eval_size], rows[cfg.eval_size:]
  if generated:
    # Short answers within a small token budget. A 135M model rarely writes an
    # answer format at all, so generated tasks grade the last number when
    # there is none (datasets keep the strict verifier).
    render = data_lib.ChatTemplate(tokenizer, user_template=data_lib.BoxedTemplate(
        instruction=SHORT_ANSWER_INSTRUCTION))
  else:
    render = data_lib.ChatTemplate(tokenizer)
  return Task(train, held_out, tokenizer, render, cfg.prompts_per_step,
              cfg.seed, cfg.max_prompt_tokens, cfg.reward_workers,
              last_number_fallback=generated)
