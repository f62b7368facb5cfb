"""The rule of each config field on its own: its type (from the section's
type hint), finiteness, and its range or vocabulary (FIELD_RULES).

To add a field: declare it in its section (its dotted name is its flag) and
give it a rule in FIELD_RULES (tests/train/test_config.py checks that every
numeric field has one); a check over several fields goes in
cross_checks.py. `field_problems` applies them to one value.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

from rljax.core import _validation as v
from rljax.core import aggregation as aggregation_lib
from rljax.core import objectives
from rljax.train.config import sections
from rljax.train.config.problems import Problem


def _mesh_size(value) -> str | None:
  ok = value == -1 or value >= 1
  return None if ok else "a positive size, or -1 for the devices left over"


def _task(value) -> str | None:
  from rljax.data import DATASET_SPECS  # no jax; imported only to validate
  from rljax.train.tasks import GENERATED_TASKS

  names = tuple(GENERATED_TASKS) + tuple(sorted(DATASET_SPECS))
  ok = value in names
  return None if ok else f"a generated task or dataset, one of {names}"


def _eps_low(value) -> str | None:
  # 1 − eps_low is the lower clip of the ratio; at eps_low = 1 it is 0 and
  # never binds (a ratio is > 0; CISPO's preset), above 1 it is negative.
  ok = 0 <= value <= 1 or value == math.inf
  return None if ok else "a value in [0, 1], or inf for no lower clip"


def _async_mode(value) -> str | None:
  return (
    None
    if value in sections.ASYNC_MODES
    else (f"one of {sections.ASYNC_MODES}")
  )


# A seed both jax.random.key and numpy take, as a 31-bit int.
_MAX_SEED = 2**31 - 1
# More verifier processes than this are interpreters idling on a CPU.
_MAX_REWARD_WORKERS = 64

_PROB = v.in_range(0.0, 1.0)
_NONNEG = v.at_least(0)
_POSITIVE = v.in_range(0.0, math.inf, lo_open=True)
_POSITIVE_INT = v.at_least(1)

FIELD_RULES: dict[str, v.Rule] = {
  "algorithm": v.one_of(*sections.ALGORITHMS),
  "model.lora_rank": v.at_least(0, "0 trains every weight"),
  "model.lora_alpha": _POSITIVE,
  "model.lora_dropout": v.in_range(0.0, 1.0, hi_open=True),
  "model.param_dtype": v.one_of("float32", "bfloat16"),
  "model.compute_dtype": v.one_of("auto", "float32", "bfloat16"),
  "task.name": _task,
  "task.eval_size": _NONNEG,
  "task.reward_workers": v.expect(
    v.in_range(0, _MAX_REWARD_WORKERS),
    f"a value in [0, {_MAX_REWARD_WORKERS}] (0 scores in-process)",
  ),
  # A chat prompt's fixed part alone is longer than this.
  "task.max_prompt_tokens": v.at_least(16, "the chat template alone is longer"),
  "task.tool": v.one_of(*sections.TOOLS),
  "task.python_sandbox": v.one_of(*sections.PYTHON_SANDBOXES),
  "task.tool_format": v.one_of(*sections.TOOL_FORMATS),
  "task.tool_prompt": v.one_of(*sections.TOOL_PROMPTS),
  "task.tool_choice": v.one_of(*sections.TOOL_CHOICES),
  "task.max_turns": _POSITIVE_INT,
  "task.max_calls_per_turn": _POSITIVE_INT,
  "task.env_url": v.expect(
    lambda url: not (url == "" or url.startswith("http://")),
    '"" (in-process) or http://HOST:PORT of an environment server',
  ),
  "task.max_turn_tokens": v.at_least(0, "0 = rollout.max_new_tokens"),
  "reward.name": v.one_of(*sections.REWARDS),
  "reward.judge_timeout_s": _POSITIVE,
  "rollout.engine": v.one_of(*sections.ENGINES),
  "rollout.quant": v.one_of(*sections.ROLLOUT_QUANT),
  # 1 turns UAQ off; s < 1 would shrink updates against the quantization
  # grid (the opposite of UAQ); QuRL §4.3 tests s = 1..3.
  "rollout.uaq_scale": v.in_range(1.0, 8.0),
  "rollout.prompts_per_step": _POSITIVE_INT,
  "rollout.group_size": _POSITIVE_INT,
  "rollout.max_new_tokens": _POSITIVE_INT,
  # Below 0.01 sampling is greedy in all but name and logits / T leave the
  # range where the behaviour log-probs mean anything.
  "rollout.temperature": v.expect(
    v.in_range(0.01, math.inf),
    ">= 0.01 (below, sampling is greedy in all but name)",
  ),
  "rollout.top_p": v.in_range(0.0, 1.0, lo_open=True),
  "rollout.batching": v.one_of("static", "continuous"),
  "rollout.inflight_kv": v.one_of("keep", "recompute"),
  "rollout.kv_page_size": v.at_least(0),
  "rollout.chunk_steps": v.at_least(1),
  "rollout.speculative": v.one_of("off", "suffix"),
  "loss.surrogate": v.one_of(*objectives.SURROGATES),
  "loss.correction": v.one_of(*objectives.CORRECTIONS),
  "loss.aggregation": v.one_of(*aggregation_lib.AGGREGATION_MODES),
  "loss.eps_low": _eps_low,
  "loss.eps_high": _NONNEG,
  "loss.dual_clip": v.optional(v.in_range(1.0, math.inf, lo_open=True)),
  # C < 1 would down-weight even on-policy tokens (core's PolicyLossConfig).
  "loss.tis_cap": v.at_least(1.0),
  "loss.norm_const": v.optional(_POSITIVE),
  "loss.veto_threshold": v.optional(v.in_range(0.0, 1.0, lo_open=True)),
  "loss.positive_nll_coef": v.at_least(0, "0 turns the NLL term off"),
  "kl.coef": v.at_least(0, "0 turns the KL loss off"),
  "kl.estimator": v.one_of("k1", "k2", "k3"),
  "kl.in_reward_coef": v.at_least(0, "0 turns the KL penalty off"),
  "advantage.estimator": v.one_of(*sections.ADVANTAGE_ESTIMATORS),
  "advantage.gamma": _PROB,
  "advantage.gae_lambda": _PROB,
  "advantage.vapo_alpha": _NONNEG,
  "advantage.max_resample_rounds": _NONNEG,
  "advantage.overlong_max_len": v.at_least(0, "0 turns overlong shaping off"),
  "advantage.overlong_cache_len": _NONNEG,
  "critic.learning_rate": _PROB,
  "critic.gae_lambda": _PROB,
  "critic.value_clip": _POSITIVE,
  "critic.value_coef": _NONNEG,
  "critic.pretrain_steps": v.at_least(0, "0 = no value pretraining"),
  "update.ppo_epochs": _POSITIVE_INT,
  "update.minibatches": _POSITIVE_INT,
  "update.micro_batches": _POSITIVE_INT,
  "update.entropy_coef": _NONNEG,
  "update.logprob_chunk": v.at_least(0, "0 = the whole sequence at once"),
  "update.remat_policy": v.one_of("full", "dots"),
  # 0 is a legitimate control (the policy never moves): see `notes`.
  "optim.learning_rate": _PROB,
  "optim.steps": v.at_least(0, "0 = run.steps × ppo_epochs × minibatches"),
  "optim.warmup_steps": _NONNEG,
  "optim.schedule": v.one_of("constant", "cosine"),
  "optim.weight_decay": _NONNEG,
  "optim.max_grad_norm": v.at_least(0, "0 turns clipping off"),
  # b = 1 never forgets the first moment and divides by a zero bias
  # correction (NaN weights in the first step).
  "optim.b1": v.in_range(0.0, 1.0, hi_open=True),
  "optim.b2": v.in_range(0.0, 1.0, hi_open=True),
  "mesh.data": _mesh_size,
  "mesh.fsdp": _mesh_size,
  "mesh.tensor": _mesh_size,
  "run.steps": _POSITIVE_INT,
  "run.seed": v.in_range(0, _MAX_SEED),
  "run.run_dir": v.non_empty_str,
  "run.checkpoint_every": _POSITIVE_INT,
  "run.keep_checkpoints": _POSITIVE_INT,
  "run.eval_every": v.at_least(0, "0 = only before and after training"),
  "run.max_staleness": v.at_least(0, "0 only with async_mode=streaming"),
  "run.async_mode": _async_mode,
}

# The Python types a field's hint may name; a config holds only what its
# config.json can record.
_TYPED = (bool, int, float, str)


def _type_rule(name: str) -> v.Rule | None:
  """The rule of the field's type hint (`X | None` also takes None)."""
  hint = sections.field_type(name)
  args = typing.get_args(hint)
  union = typing.get_origin(hint) in (typing.Union, types.UnionType)
  if union and type(None) in args:
    base = next(a for a in args if a is not type(None))
    return v.optional(v.of_type(base)) if base in _TYPED else None
  return v.of_type(hint) if hint in _TYPED else None


# The float fields whose infinity means something (core's PolicyLossConfig:
# no clip, no cap). Every other float field must be finite: an infinite
# hyper-parameter is a config error, not a run that the non-finite guard
# stops after its first step.
INF_ALLOWED = frozenset(
  {"loss.eps_low", "loss.eps_high", "loss.tis_cap", "loss.dual_clip"}
)


def _finite(value) -> str | None:
  # Only floats: the type rule has already refused what is not a number.
  if isinstance(value, float) and not math.isfinite(value):
    return "a finite number"
  return None


def field_problems(name: str, value: Any) -> list[Problem]:
  """The problem of one dotted field's value: its type, then finiteness
  (floats outside INF_ALLOWED), then its rule (the rule only sees values of
  the right type)."""
  finite = None if name in INF_ALLOWED else _finite
  rule = v.all_of(
    *(
      r
      for r in (_type_rule(name), finite, FIELD_RULES.get(name))
      if r is not None
    )
  )
  expected = rule(value)
  return [Problem(name, value, expected)] if expected else []
