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
from rljax.train.restore import restore_policy

__all__ = [
  "EvalSpec",
  "evaluate_dataset",
  "is_run_dir",
  "load_examples",
  "load_policy",
  "parse_datasets",
  "restore_policy",
]


_LABEL_CHARS = frozenset(
  "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"
)


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """One dataset to evaluate: a generated task level or a file.

  `label` keys its result (the summary row and `<label>.jsonl` records);
  unset, it is the dataset name.
  """

  name: str
  path: str = ""  # file for datasets; level for generated tasks
  limit: int = 0  # 0 = all rows
  label: str = ""

  def __post_init__(self):
    if not self.label:
      object.__setattr__(self, "label", self.name)


def parse_datasets(text: str) -> list[EvalSpec]:
  """'[LABEL=]NAME[:PATH_OR_LEVEL[:LIMIT]],...' -> specs with unique labels.

  'gsm8k:path.jsonl,math500:path.jsonl:100,arithmetic:easy' gives labels
  gsm8k, math500, arithmetic. Two specs of one name (two files read by one
  loader) need explicit labels, 'a=math500:a.jsonl,b=math500:b.jsonl':
  a duplicate label is refused, since its results would overwrite the
  other's.
  """
  specs = []
  for item in [t.strip() for t in text.split(",") if t.strip()]:
    label = ""
    head = item.split(":", 1)[0]
    if "=" in head:
      label, item = item.split("=", 1)
      if not label or not set(label) <= _LABEL_CHARS:
        raise ValueError(
          f"dataset label {label!r}: expected letters, digits, '_', '.' "
          "or '-' (it names the records file)"
        )
    parts = item.split(":")
    if len(parts) > 3 or not parts[0]:
      raise ValueError(
        f"dataset {item!r}: expected [LABEL=]NAME[:PATH_OR_LEVEL[:LIMIT]]"
      )
    name = parts[0]
    path = parts[1] if len(parts) > 1 else ""
    try:
      limit = int(parts[2]) if len(parts) > 2 else 0
    except ValueError:
      raise ValueError(
        f"dataset {item!r}: LIMIT {parts[2]!r} is not an integer"
      ) from None
    specs.append(EvalSpec(name, path, limit, label))
  if not specs:
    raise ValueError("no dataset given")
  seen: dict[str, EvalSpec] = {}
  dupes = []
  for spec in specs:
    if spec.label in seen:
      dupes.append(
        f"{spec.label!r} ({seen[spec.label].path or '-'} and "
        f"{spec.path or '-'})"
      )
    seen.setdefault(spec.label, spec)
  if dupes:
    raise ValueError(
      "duplicate dataset labels: " + ", ".join(dupes) + "; one result "
      "would overwrite the other. Give each a label: "
      "LABEL=NAME[:PATH[:LIMIT]], e.g. a=math500:a.jsonl,b=math500:b.jsonl"
    )
  return specs


def load_examples(spec: EvalSpec, seed: int = 0) -> list[data_lib.Example]:
  if spec.name in ("arithmetic", "countdown"):
    gen = (
      data_lib.generate_arithmetic
      if spec.name == "arithmetic"
      else data_lib.generate_countdown
    )
    # The trainer's held-out stream (seed 10_000 + run seed).
    return gen(spec.limit or 200, spec.path or "easy", seed=10_000 + seed)
  if not spec.path:
    raise ValueError(f"dataset {spec.name!r} needs a path (NAME:PATH)")
  rows = list(data_lib.load_dataset(spec.name, spec.path))
  return rows[: spec.limit] if spec.limit else rows


def is_run_dir(path: str) -> bool:
  """True for an rljax training run directory (config.json + checkpoints)."""
  config_json = os.path.join(path, "config.json")
  if not (
    os.path.isdir(os.path.join(path, "checkpoints"))
    and os.path.exists(config_json)
  ):
    return False
  with open(config_json) as f:
    return "algorithm" in json.load(f)


def load_policy(path: str) -> models.Model:
  """HF dir, .gguf, default name, or an rljax run directory (read-only)."""
  if os.path.isdir(path) and is_run_dir(path):
    return restore_policy(path)
  return models.load_pretrained(path)


def evaluate_dataset(
  model: models.Model,
  engine,
  examples: Sequence,
  sampling: SamplingConfig,
  k: int,
  render=None,
) -> tuple[dict, list[dict]]:
  """Scores k samples per example; returns (summary, per-sample records)."""
  tok = model.tokenizer
  render = render or data_lib.ChatTemplate(tok)
  prompts = [
    tok.encode(render(e.question), add_special_tokens=False) for e in examples
  ]
  t0 = time.perf_counter()
  rb = engine.generate(prompts, sampling)
  gen_s = time.perf_counter() - t0
  completions = [
    tok.decode(r, skip_special_tokens=True) for r in rb.response_ids
  ]
  n = rb.n

  def scores(verifier) -> np.ndarray:
    return np.array(
      [
        verifier(
          "",
          completions[b],
          examples[b // n].answer,
          dict(examples[b // n].metadata),
        ).score
        for b in range(len(completions))
      ],
      np.float32,
    ).reshape(len(examples), n)

  correct = scores(rewards_lib.correctness_reward)
  # Small models often give a right number in no answer format; the lenient
  # score (last number of the completion) shows how much the format costs.
  lenient = scores(rewards_lib.Correctness(last_number_fallback=True))
  records = []
  for i, e in enumerate(examples):
    for j in range(n):
      b = i * n + j
      records.append(
        {
          "uid": e.uid,
          "sample": j,
          "answer": e.answer,
          "completion": completions[b],
          "correct": bool(correct[i, j] >= 1.0),
          "correct_last_number": bool(lenient[i, j] >= 1.0),
          "finish_reason": rb.finish_reason[b],
          "response_tokens": len(rb.response_ids[b]),
        }
      )
  hits = (correct >= 1.0).sum(axis=1)
  summary = {
    "examples": len(examples),
    "samples_per_example": n,
    f"avg@{n}": float(correct.mean()),
    f"avg@{n}_last_number": float(lenient.mean()),
    f"pass@{k}": float(
      np.mean([rewards_lib.pass_at_k(n, int(c), k) for c in hits])
    )
    if k <= n
    else None,
    "mean_response_tokens": float(np.mean(rb.response_lengths)),
    "truncated_fraction": float(
      np.mean([f == "length" for f in rb.finish_reason])
    ),
    "generation_s": gen_s,
    "tokens_per_s": float(rb.response_lengths.sum()) / max(gen_s, 1e-9),
  }
  return summary, records
