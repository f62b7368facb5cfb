"""The "tiny" model of `--model.name=tiny`: a random few-layer decoder with the
real SmolLM2 tokenizer, for tests and CPU smoke runs (never for results).

The models layer owns it (`models.load_named("tiny")`, so evaluation can
build it without the trainer); these are the names tests use.
"""

from __future__ import annotations

from rljax import models
from rljax.models import pretrained


def tiny_tokenizer():
  """The real SmolLM2 tokenizer (from the packaged GGUF), loaded once."""
  return pretrained.tiny_tokenizer()


def tiny_model(seed: int) -> models.Model:
  """A random `models.tiny_config` decoder over `tiny_tokenizer()`."""
  return models.load_named("tiny", seed)
