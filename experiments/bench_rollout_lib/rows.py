"""The fixed-shape workload of bench_rollout.py and the row every engine's
measurement becomes: chat-templated questions (or random ids), a PxNxT
shape, and one JSON row per engine x format."""

from __future__ import annotations

from absl import app
import numpy as np


_QUESTIONS = (
  "What is {a}+{b}?",
  "Compute {a} times {b}.",
  "If I have {a} apples and eat {b}, how many are left?",
  "Write a short poem about the number {a}.",
  "Explain why {a} is or is not a prime number.",
  "What is {a} minus {b}? Answer step by step.",
)


def make_prompts(
  tokenizer, num: int, seed: int, vocab_size: int
) -> list[list[int]]:
  """Chat-templated small math/writing questions (random ids without a
  tokenizer), generated here so the benchmark needs no dataset."""
  rng = np.random.default_rng(seed)
  if tokenizer is None:
    return [
      rng.integers(3, vocab_size, size=int(rng.integers(20, 60))).tolist()
      for _ in range(num)
    ]
  prompts = []
  for i in range(num):
    text = _QUESTIONS[i % len(_QUESTIONS)].format(
      a=int(rng.integers(2, 100)), b=int(rng.integers(2, 100))
    )
    chat = tokenizer.apply_chat_template(
      [{"role": "user", "content": text}],
      tokenize=False,
      add_generation_prompt=True,
    )
    prompts.append(tokenizer.encode(chat, add_special_tokens=False))
  return prompts


def parse_shape(text: str) -> tuple[int, int, int]:
  parts = text.lower().split("x")
  if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise app.UsageError(
      f"--shapes has {text!r}; expected PxNxT, e.g. 16x8x128"
    )
  return int(parts[0]), int(parts[1]), int(parts[2])


def row(engine, quant, batch, sync, kl, k1, sampling) -> dict:
  return {
    "engine": engine,
    "quant": quant,
    "prompts": batch.num_prompts,
    "samples": sampling.n,
    "new_tokens": sampling.max_new_tokens,
    "tokens_per_s": float(batch.timing["tokens_per_s"]),
    "sync_s": float(sync.seconds),
    "kl_to_full_precision": float(kl),
    "kl_exact": float(kl) if engine == "jax" else None,
    "kl_k1": float(k1),
    "seconds": float(batch.timing["seconds"]),
    "tokens": int(batch.timing["tokens"]),
    "sync_bytes": int(sync.bytes),
  }


def find(rows, engine, quant):
  return next(
    (r for r in rows if r["engine"] == engine and r["quant"] == quant), None
  )
