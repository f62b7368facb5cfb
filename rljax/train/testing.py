"""The "tiny" model of `--model=tiny`: a random few-layer decoder with the
real SmolLM2 tokenizer, for tests and CPU smoke runs (never for results)."""
from __future__ import annotations

import jax

from rljax import models

_TOKENIZER = None


def tiny_tokenizer():
  """The real SmolLM2 tokenizer (from the packaged GGUF), loaded once."""
  global _TOKENIZER
  if _TOKENIZER is None:
    _TOKENIZER = models.load_tokenizer(models.default_gguf_path())
  return _TOKENIZER


def tiny_model(seed: int) -> models.Model:
  """A random `models.tiny_config` decoder over `tiny_tokenizer()`."""
  config = models.tiny_config(vocab_size=len(tiny_tokenizer()))
  params = models.init_params(config, jax.random.PRNGKey(seed))
  return models.Model(config=config, params=params, tokenizer=tiny_tokenizer())
