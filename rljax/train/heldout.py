"""Greedy accuracy of the full-precision policy on the task's held-out set
(the trainer's `--run.eval_every` and the driver's before/after evaluation)."""

from __future__ import annotations

import time
from typing import Any

from rljax.rollout import factory as rollout_factory
from rljax.rollout.base import SamplingConfig
from rljax.train import batch as batch_lib
from rljax.train.config import TrainConfig


class HeldOut:
  """The held-out evaluation of a run, on a JAX sampler of its own (started
  at the first call)."""

  def __init__(
    self, cfg: TrainConfig, model_config: Any, tokenizer: Any, task: Any
  ):
    self.cfg = cfg
    self.model_config = model_config
    self.tokenizer = tokenizer
    self.task = task
    self._engine = None

  def evaluate(self, params: Any) -> dict[str, float]:
    """{eval_accuracy, eval_reward, time_eval} of θ = `params` (greedy)."""
    t0 = time.perf_counter()
    if self._engine is None:
      self._engine = rollout_factory.make_engine(
        "jax",
        self.model_config,
        None,
        quant="none",
        max_prompt_len=batch_lib.bucket(self.cfg.task.max_prompt_tokens),
        max_new_tokens=self.cfg.rollout.max_new_tokens,
        pad_id=batch_lib.pad_id(self.tokenizer),
      )
    self._engine.update_weights(params)
    examples = self.task.eval_examples()
    sampling = SamplingConfig(
      n=1,
      greedy=True,
      max_new_tokens=self.cfg.rollout.max_new_tokens,
      stop_token_ids=self.task.stop_token_ids,
      seed=0,
    )
    if getattr(self.task, "multi_turn", False):  # tool episodes, scored
      out = self.task.episodes(self._engine, examples, sampling)
      return {
        "eval_accuracy": float((out.rewards >= 1.0).mean()),
        "eval_reward": float(out.rewards.mean()),
        "eval_tool_call_rate": out.metrics["tool_call_rate"],
        "time_eval": time.perf_counter() - t0,
      }
    prompts = [self.task.prompt_ids(e) for e in examples]
    rb = self._engine.generate(prompts, sampling)
    completions = [
      self.tokenizer.decode(r, skip_special_tokens=True)
      for r in rb.response_ids
    ]
    # The task's verifier even when --reward.name trains on another signal.
    scores, _ = self.task.verify(completions, examples, 1)
    return {
      "eval_accuracy": float((scores >= 1.0).mean()),
      "eval_reward": float(scores.mean()),
      "time_eval": time.perf_counter() - t0,
    }

  def close(self) -> None:
    if self._engine is not None:
      self._engine.close()
      self._engine = None
