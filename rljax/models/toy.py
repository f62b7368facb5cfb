"""Toy models for tests and benchmarks that need no checkpoint: random
params whose next-token choices are well separated, and a tokenizer whose
text is the ids themselves."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from rljax.models.config import ModelConfig
from rljax.models.decoder_params import init_params


def sharp_params(
  config: ModelConfig, rng: Any, gain: float = 10.0
) -> dict[str, Any]:
  """`init_params` with every weight times `gain` and every norm's scale
  one.

  HF's N(0, 0.02²) init gives near-uniform logits, so float noise flips
  greedy choices between programs that sum in other orders; gain-times
  larger weights make the argmax well separated and the attention matter
  (a row's next token depends on every key it attends to)."""
  params = jax.tree_util.tree_map(lambda x: x * gain, init_params(config, rng))

  def unit_norms(tree):
    for name, sub in tree.items():
      if isinstance(sub, dict) and name.endswith("norm") and "scale" in sub:
        sub["scale"] = jnp.ones_like(sub["scale"])
      elif isinstance(sub, dict):
        unit_norms(sub)

  unit_norms(params)
  return params


class DecimalTokenizer:
  """A tokenizer whose text of an id is its decimal number, ids separated
  by spaces; id 0 is end-of-sequence and padding."""

  eos_token_id = pad_token_id = 0

  def __init__(self, vocab_size: int):
    self.vocab_size = int(vocab_size)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    del add_special_tokens
    return [int(x) for x in text.split()]

  def decode(self, ids: Sequence[int], **kwargs: Any) -> str:
    del kwargs
    return " ".join(str(int(i)) for i in ids)

  def __len__(self) -> int:
    return self.vocab_size
