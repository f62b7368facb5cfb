"""Preference pairs for a reward model: the JSONL file format, a synthetic
set with a known rule, a prompt-grouped held-out split, and the tokenization
of (prompt, response) texts into padded batches.

Files are JSONL rows `{"prompt": str, "chosen": str, "rejected": str}`
(`load_preference_pairs`, `write_preference_pairs`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Sequence

import numpy as np

PAIR_FIELDS = ("prompt", "chosen", "rejected")


@dataclasses.dataclass(frozen=True)
class PreferencePair:
  prompt: str
  chosen: str
  rejected: str


class PreferenceDataError(ValueError):
  """A preference file row that is not a valid pair; names file:line."""


def load_preference_pairs(path: str | os.PathLike) -> list[PreferencePair]:
  """Reads JSONL rows {"prompt", "chosen", "rejected"} (strings; chosen and
  rejected non-empty and different). Blank lines are skipped; other keys are
  ignored.

  Raises:
    FileNotFoundError: no such file.
    PreferenceDataError: "<path>:<line>: ..." naming the field and the value.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"preference pairs file {path!r} does not exist")
  pairs = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f"{path}:{lineno}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise PreferenceDataError(
          f"{where}: not valid JSON ({e.msg} at column {e.colno})"
        ) from None
      if not isinstance(row, dict):
        raise PreferenceDataError(
          f"{where}: a {type(row).__name__}; expected "
          f"an object with fields {PAIR_FIELDS}"
        )
      for field in PAIR_FIELDS:
        if field not in row:
          raise PreferenceDataError(
            f"{where}: field {field!r} is missing (has {sorted(row)})"
          )
        value = row[field]
        if not isinstance(value, str):
          raise PreferenceDataError(
            f"{where}: field {field!r} is {type(value).__name__} "
            f"{value!r:.60}; expected a string"
          )
        if field != "prompt" and not value:
          raise PreferenceDataError(f"{where}: field {field!r} is empty")
      if row["chosen"] == row["rejected"]:
        raise PreferenceDataError(
          f"{where}: fields 'chosen' and 'rejected' "
          "are the same text; a pair needs two "
          "different responses"
        )
      pairs.append(
        PreferencePair(row["prompt"], row["chosen"], row["rejected"])
      )
  if not pairs:
    raise PreferenceDataError(f"{path}: no preference pairs in the file")
  return pairs


def write_preference_pairs(
  path: str | os.PathLike, pairs: Iterable[PreferencePair]
) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for p in pairs:
      f.write(json.dumps(dataclasses.asdict(p)) + "\n")


def _bucket(n: int, minimum: int = 16) -> int:
  """Next power of two >= n: few distinct shapes, few compilations."""
  size = minimum
  while size < n:
    size *= 2
  return size


def encode_texts(
  tokenizer,
  prompts: Sequence[str],
  responses: Sequence[str],
  max_len: int,
  pad_id: int,
  rows: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded (tokens, attention_mask) int32 [rows, T] of prompt +
  response, tokenized separately as the policy produced them.

  A sequence over `max_len` loses tokens from its start: the reward is read
  at the last token, which must stay. T is a power of two (few compiles);
  `rows` pads the batch with empty rows (mask 0 but for token 0).
  """
  if len(prompts) != len(responses):
    raise ValueError(
      f"encode_texts: {len(prompts)} prompts, {len(responses)} responses"
    )
  seqs = []
  for prompt, response in zip(prompts, responses):
    ids = tokenizer.encode(prompt, add_special_tokens=False) + tokenizer.encode(
      response, add_special_tokens=False
    )
    seqs.append(ids[-max_len:] or [pad_id])
  return _pack(seqs, pad_id, rows)


def _pack(
  seqs: Sequence[Sequence[int]], pad_id: int, rows: int | None
) -> tuple[np.ndarray, np.ndarray]:
  rows = len(seqs) if rows is None else rows
  t = _bucket(max((len(s) for s in seqs), default=1))
  tokens = np.full((rows, t), pad_id, np.int32)
  mask = np.zeros((rows, t), np.int32)
  mask[:, 0] = 1  # padding rows: one real token, so the last index exists
  for i, s in enumerate(seqs):
    tokens[i, : len(s)] = s
    mask[i, : len(s)] = 1
  return tokens, mask


def encode_pairs(
  tokenizer, pairs: Sequence[PreferencePair], max_len: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
  """[2B, T] tokens and mask: the B chosen rows, then the B rejected rows."""
  prompts = [p.prompt for p in pairs] * 2
  responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
  return encode_texts(tokenizer, prompts, responses, max_len, pad_id)


def synthetic_arithmetic_pairs(
  num_pairs: int, render, *, seed: int = 0, difficulty: str = "easy"
) -> list[tuple[PreferencePair, str]]:
  """Preference pairs with a known rule, for a demo or a test.

  Each pair is one generated arithmetic problem (`rljax.data`), rendered by
  `render(question)` (the trainer's prompt template); the chosen response
  states the correct answer in \\boxed{}; the rejected one either states a
  wrong number (kind "wrong_answer") or gives no answer ("no_answer"),
  alternately.

  Returns:
    [(pair, kind)] of `num_pairs` items.
  """
  from rljax import data as data_lib  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  examples = data_lib.generate_arithmetic(num_pairs, difficulty, seed=seed)
  forms = (
    "The answer is \\boxed{{{}}}.",
    "{} = \\boxed{{{}}}",
    "Let me compute: {} = {}. So the answer is \\boxed{{{}}}.",
  )
  hedges = (
    "I am not sure how to solve this.",
    "Let me think about it.",
    "This is a math question.",
    "I don't know.",
  )
  out = []
  for i, ex in enumerate(examples):
    answer = int(ex.answer)
    wrong = answer + int(rng.choice([-3, -2, -1, 1, 2, 3, 10]))
    form = forms[i % len(forms)]
    expr = ex.metadata.get("expression", ex.question)

    def say(value, form=form, expr=expr):
      if form.count("{}") == 1:
        return form.format(value)
      if form.count("{}") == 2:
        return form.format(expr, value)
      return form.format(expr, value, value)

    chosen = say(answer)
    if i % 2 == 0:
      kind, rejected = "wrong_answer", say(wrong)
    else:
      kind, rejected = "no_answer", hedges[int(rng.integers(len(hedges)))]
    out.append((PreferencePair(render(ex.question), chosen, rejected), kind))
  return out


def split_pairs(
  items: Sequence[Any], held_out_fraction: float, seed: int = 0, key=None
) -> tuple[list[Any], list[Any]]:
  """(train, held_out): a random `held_out_fraction` of the items, grouped
  by `key(item)` (default the pair's prompt) so that no prompt is on both
  sides."""
  if not 0.0 <= held_out_fraction < 1.0:
    raise ValueError(
      f"held_out_fraction={held_out_fraction!r}; expected a value in [0, 1)"
    )
  key = key or (
    lambda item: (item[0] if isinstance(item, tuple) else item).prompt
  )
  groups = sorted({key(item) for item in items})
  rng = np.random.default_rng(seed)
  rng.shuffle(groups)
  held = set(groups[: int(round(held_out_fraction * len(groups)))])
  train = [item for item in items if key(item) not in held]
  return train, [item for item in items if key(item) in held]
