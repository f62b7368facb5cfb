"""The model a benchmark or profile runs (imported as a sibling module: the
scripts run with experiments/ on sys.path).

Random weights of a preset's shape (or "tiny", the few-thousand-parameter
decoder the scripts' dry runs use) measure cost only: shapes decide a
step's time, not what it samples. Acceptance, samples and anything else
that depends on the weights need a pretrained checkpoint
(`models.load_pretrained`).
"""

from __future__ import annotations

import jax

from rljax import models


def load(name: str, random_init: bool, seed: int = 0) -> models.Model:
  """`name`'s model: random weights of its shape (no tokenizer) when
  `random_init`, else the pretrained checkpoint `name` names."""
  if not random_init:
    return models.load_pretrained(name)
  config = models.tiny_config() if name == "tiny" else models.preset(name)
  params = models.init_params(config, jax.random.PRNGKey(seed))
  return models.Model(config=config, params=params, tokenizer=None)
