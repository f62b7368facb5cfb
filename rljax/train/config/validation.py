"""Every problem of a TrainConfig at once, before anything is loaded.

`validate` applies each field's own rule (field_rules.py: type, finiteness,
FIELD_RULES), then the checks over several fields (cross_checks.py:
CROSS_CHECKS), and reports every problem at once; `model_problems` checks
the fields bounded by the loaded model's shape, and `notes` names the
legitimate but unusual settings. The names of those modules are importable
from here too.

The rules and the wording of a problem are core's (`rljax.core._validation`):
`--{field}={value!r}; expected {what}`, as every config of rljax says it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rljax.train.config import sections
from rljax.train.config.cross_checks import CROSS_CHECKS, cross_problems
from rljax.train.config.field_rules import (
  FIELD_RULES,
  INF_ALLOWED,
  field_problems,
)
from rljax.train.config.problems import ConfigError, Problem

if TYPE_CHECKING:
  from rljax.train.config.train_config import TrainConfig

__all__ = [
  "CROSS_CHECKS",
  "FIELD_RULES",
  "INF_ALLOWED",
  "ConfigError",
  "Problem",
  "check",
  "cross_problems",
  "field_problems",
  "model_problems",
  "notes",
  "validate",
]


def validate(cfg: TrainConfig) -> list[Problem]:
  """Every problem of `cfg`: section types, per-field types and ranges,
  then cross-field checks (a cross check that cannot run because one of
  its fields is already reported adds nothing)."""
  problems = field_problems("algorithm", cfg.algorithm)
  for name, cls in sections.SECTIONS.items():
    section = getattr(cfg, name)
    if not isinstance(section, cls):
      problems.append(Problem(name, section, f"a {cls.__name__}"))
      continue
    for f in sections.fields(cls):
      problems += field_problems(f"{name}.{f.name}", getattr(section, f.name))
  if any(p.field in sections.SECTIONS for p in problems):
    return problems  # a section of the wrong type: nothing more to check
  return problems + cross_problems(cfg, {p.field for p in problems})


# The random "tiny" decoder of the tests has a nominal context (128): it was
# trained on no length, and its prompts alone may fill it.
_NOMINAL_CONTEXT_MODELS = ("tiny",)


def model_problems(cfg: TrainConfig, model_config: Any) -> list[Problem]:
  """The problems of `cfg` against the model it loaded (its `ModelConfig`):
  checked as soon as the model's shape is known, before any buffer is
  sized from these fields.

  * model.lora_rank <= hidden_size: every adapted projection has the
    residual width on one side; a larger rank is not low-rank any more.
  * rollout.max_new_tokens, and task.max_prompt_tokens + max_new_tokens,
    within max_position_embeddings (the context the checkpoint was trained
    for; the KV cache and the trainer's logits grow with it).
  """
  out = []
  width = model_config.hidden_size
  if cfg.model.lora_rank > width:
    expected = f"<= the model's hidden_size {width} (or 0: no LoRA)"
    out.append(Problem("model.lora_rank", cfg.model.lora_rank, expected))
  ctx = model_config.max_position_embeddings
  new, prompt = cfg.rollout.max_new_tokens, cfg.task.max_prompt_tokens
  if new >= ctx:
    expected = f"< the model's context max_position_embeddings={ctx}"
    out.append(Problem("rollout.max_new_tokens", new, expected))
  elif prompt + new > ctx and cfg.model.name not in _NOMINAL_CONTEXT_MODELS:
    expected = (
      f"<= {ctx - prompt}: task.max_prompt_tokens={prompt} + max_new_tokens "
      f"must fit the model's context max_position_embeddings={ctx}"
    )
    out.append(Problem("rollout.max_new_tokens", new, expected))
  return out


def notes(cfg: TrainConfig) -> list[str]:
  """One line for each legitimate but unusual setting of `cfg`, saying what
  it means (the scripts print them at start): research settings are
  accepted, never silently."""
  out = []
  loss = cfg.loss
  for name in ("eps_low", "eps_high"):
    if getattr(loss, name) == math.inf:
      side = "below" if name == "eps_low" else "above"
      out.append(
        f"--loss.{name}=inf: the ratio is not clipped {side} (an unclipped "
        "policy gradient on that side)"
      )
  if cfg.optim.learning_rate == 0:
    out.append(
      "--optim.learning_rate=0: a control run, the policy never moves (only "
      "the rollout/trainer mismatch and the sampling noise are measured)"
    )
  return out


def check(cfg: TrainConfig) -> None:
  """Raises `ConfigError` listing every problem of `cfg`."""
  problems = validate(cfg)
  if problems:
    raise ConfigError(problems)
