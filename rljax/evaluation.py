"""Evaluation of a policy on verifiable datasets: Avg@1 (greedy), Avg@k and
unbiased pass@k (Chen et al. 2021), with per-sample records.

A policy is an HF directory, a GGUF file, the embedded default name, or a
training run directory (its latest checkpoint, with UAQ unfolded).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Sequence

import numpy as np

from rljax import data as data_lib
from rljax import models
from rljax import rewards as rewards_lib
from rljax.rollout.base import SamplingConfig


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """One dataset to evaluate: a generated task level or a file."""
  name: str
  path: str = ""          # file for datasets; level for generated tasks
  limit: int = 0          # 0 = all rows


def parse_datasets(text: str) -> list[EvalSpec]:
  """'gsm8k:path.jsonl,math500:path.jsonl:100,arithmetic:easy' -> specs."""
  specs = []
  for item in [t for t in text.split(",") if t.strip()]:
    parts = item.strip().split(":")
    if len(parts) > 3:
      raise ValueError(f"dataset {item!r}: expected NAME[:PATH_OR_LEVEL[:LIMIT]]")
    name = parts[0]
    path = parts[1] if len(parts) > 1 else ""
    limit = int(parts[2]) if len(parts) > 2 else 0
    specs.append(EvalSpec(name, path, limit))
  if not specs:
    raise ValueError("no dataset given")
  return specs


def load_examples(spec: EvalSpec, seed: int = 0) -> list[data_lib.Example]:
  if spec.name in ("arithmetic", "countdown"):
    gen = (data_lib.generate_arithmetic if spec.name == "arithmetic"
           else data_lib.generate_countdown)
    # The trainer's held-out stream (seed 10_000 + run seed).
    return gen(spec.limit or 200, spec.path or "easy", seed=10_000 + seed)
  if not spec.path:
    raise ValueError(f"dataset {spec.name!r} needs a path (NAME:PATH)")
  rows = list(data_lib.load_dataset(spec.name, spec.path))
  return rows[:spec.limit] if spec.limit else rows


def load_policy(path: str) -> models.Model:
  """HF dir, .gguf, default name, or an rljax run directory."""
  config_json = os.path.join(path, "config.json")
  ckpt_dir = os.path.join(path, "checkpoints")
  if os.path.isdir(ckpt_dir) and os.path.exists(config_json):
    with open(config_json) as f:
      run_cfg = json.load(f)
    if "algorithm" in run_cfg:
      return _load_run(path, run_cfg)
  return models.load_pretrained(path)


def _load_run(run_dir: str, run_cfg: dict) -> models.Model:
  from rljax import quant
  from rljax.train.checkpoint import RunCheckpointer
  from rljax.train.config import TrainConfig
  from rljax.train.loop import Trainer
  cfg = TrainConfig(**{**run_cfg, "resume": True, "tensorboard": False,
                       "reward_workers": 0})
  ckpt = RunCheckpointer(os.path.join(run_dir, "checkpoints"), 1, 100)
  step = ckpt.latest_step()
  ckpt.close()
  if step is None:
    raise FileNotFoundError(f"run directory {run_dir!r} has no checkpoint")
  trainer = Trainer(cfg, show_progress=False)
  params = trainer.state.params
  if trainer.uaq_scale != 1.0:
    params = quant.unfold_uaq(trainer.model_config, params,
                              scale=trainer.uaq_scale)
  model = models.Model(config=trainer.model_config, params=params,
                       tokenizer=trainer.tokenizer)
  trainer.close()
  return model


def evaluate_dataset(model: models.Model, engine, examples: Sequence,
                     sampling: SamplingConfig, k: int,
                     render=None) -> tuple[dict, list[dict]]:
  """Scores k samples per example; returns (summary, per-sample records)."""
  tok = model.tokenizer
  render = render or data_lib.ChatTemplate(tok)
  prompts = [tok.encode(render(e.question), add_special_tokens=False)
             for e in examples]
  t0 = time.perf_counter()
  rb = engine.generate(prompts, sampling)
  gen_s = time.perf_counter() - t0
  completions = [tok.decode(r, skip_special_tokens=True) for r in rb.response_ids]
  n = rb.n
  def scores(verifier) -> np.ndarray:
    return np.array([
        verifier("", completions[b], examples[b // n].answer,
                 dict(examples[b // n].metadata)).score
        for b in range(len(completions))], np.float32).reshape(len(examples), n)
  correct = scores(rewards_lib.correctness_reward)
  # Small models often give a right number in no answer format; the lenient
  # score (last number of the completion) shows how much the format costs.
  lenient = scores(rewards_lib.Correctness(last_number_fallback=True))
  records = []
  for i, e in enumerate(examples):
    for j in range(n):
      b = i * n + j
      records.append({"uid": e.uid, "sample": j, "answer": e.answer,
                      "completion": completions[b],
                      "correct": bool(correct[i, j] >= 1.0),
                      "correct_last_number": bool(lenient[i, j] >= 1.0),
                      "finish_reason": rb.finish_reason[b],
                      "response_tokens": len(rb.response_ids[b])})
  hits = (correct >= 1.0).sum(axis=1)
  summary = {
      "examples": len(examples), "samples_per_example": n,
      f"avg@{n}": float(correct.mean()),
      f"avg@{n}_last_number": float(lenient.mean()),
      f"pass@{k}": float(np.mean([rewards_lib.pass_at_k(n, int(c), k)
                                  for c in hits])) if k <= n else None,
      "mean_response_tokens": float(np.mean(rb.response_lengths)),
      "truncated_fraction": float(np.mean([f == "length"
                                           for f in rb.finish_reason])),
      "generation_s": gen_s,
      "tokens_per_s": float(rb.response_lengths.sum()) / max(gen_s, 1e-9),
  }
  return summary, records
