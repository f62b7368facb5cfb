"""`TrainConfig`: one RL run, a composition of the sections.

`build` is the one constructor from {dotted field: value}: `resolve`,
`from_dict` and `TrainConfig.replace` all end in it, so every way to a
config reports every problem at once (`validation.validate`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from rljax.train.config import keys
from rljax.train.config import sections
from rljax.train.config import validation


def _section(name: str):
  return dataclasses.field(default_factory=sections.SECTIONS[name])


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything one RL run needs (sections: see the package docstring)."""

  algorithm: str = sections.DEFAULT_ALGORITHM
  model: sections.PolicyModelConfig = _section("model")
  task: sections.TaskConfig = _section("task")
  reward: sections.RewardConfig = _section("reward")
  rollout: sections.RolloutConfig = _section("rollout")
  loss: sections.PolicyLossConfig = _section("loss")
  kl: sections.KLConfig = _section("kl")
  advantage: sections.AdvantageConfig = _section("advantage")
  critic: sections.CriticConfig = _section("critic")
  update: sections.UpdateConfig = _section("update")
  optim: sections.OptimConfig = _section("optim")
  mesh: sections.MeshConfig = _section("mesh")
  run: sections.RunConfig = _section("run")

  def __post_init__(self):
    loss = self.loss
    if (
      isinstance(loss, sections.PolicyLossConfig)
      and isinstance(self.rollout, sections.RolloutConfig)
      and loss.aggregation == "seq-mean-token-sum-norm"
      and loss.norm_const is None
      and _is_number(self.rollout.max_new_tokens)
    ):
      # Dr. GRPO divides by the generation budget. Resolved here, once, so
      # `cfg.loss` is exactly what core gets and what config.json records.
      object.__setattr__(
        self,
        "loss",
        dataclasses.replace(
          loss, norm_const=float(self.rollout.max_new_tokens)
        ),
      )
    validation.check(self)  # every problem at once

  def replace(self, *layers: Mapping[str, Any], **values) -> TrainConfig:
    """This config with layers of values on top (nested or dotted keys, as
    `resolve` takes them; no preset is applied), validated again."""
    flat = keys.to_flat(self)
    for layer in (*layers, values):
      flat.update(keys.align_async_mode(keys.flatten(layer)))
    return build(flat)

  def to_dict(self) -> dict[str, Any]:
    """Nested {section: {field: value}}: what config.json holds."""
    return dataclasses.asdict(self)

  def lora_config(self):
    """The LoraConfig of the model.lora_* fields, None when lora_rank == 0."""
    m = self.model
    if m.lora_rank == 0:
      return None
    from rljax.models.lora import LoraConfig  # pylint: disable=g-import-not-at-top

    return LoraConfig(
      rank=m.lora_rank,
      alpha=m.lora_alpha,
      dropout=m.lora_dropout,
      targets=m.lora_targets,
      base_dtype=m.lora_base_dtype,
    )

  def optim_config(self, critic: bool = False) -> sections.OptimConfig:
    """`optim` with its update count filled in (or the critic's: its own
    learning rate, no weight decay, the same betas and schedule). One
    optimizer update per minibatch and epoch, so the schedule spans
    run.steps × update.ppo_epochs × update.minibatches unless optim.steps
    is set (the critic's: also over its critic.pretrain_steps)."""
    o = self.optim
    u = self.update
    n_steps = self.run.steps
    if critic and self.uses_critic:  # + its value-pretraining steps
      n_steps += self.critic.pretrain_steps
    return dataclasses.replace(
      o,
      learning_rate=self.critic.learning_rate if critic else o.learning_rate,
      steps=o.steps or n_steps * u.ppo_epochs * u.minibatches,
      weight_decay=0.0 if critic else o.weight_decay,
    )

  def overlong_lengths(self) -> tuple[int, int] | None:
    """(L_max, L_cache) of DAPO's soft overlong punishment, None when off.

    On with `advantage.overlong_shaping` (the dapo preset) or when a size is
    set (the older spelling: a size alone never goes silently unused). By
    default L_max is the generation budget and L_cache a fifth of it, as in
    DAPO (Yu et al. 2025: 16384 expected + 4096 cache = 20480 tokens).
    """
    a = self.advantage
    if not (a.overlong_shaping or a.overlong_max_len or a.overlong_cache_len):
      return None
    l_max = a.overlong_max_len or self.rollout.max_new_tokens
    return l_max, a.overlong_cache_len or max(1, l_max // 5)

  @property
  def rollout_batch(self) -> int:
    return self.rollout.prompts_per_step * self.rollout.group_size

  @property
  def uses_critic(self) -> bool:
    return self.advantage.estimator == "gae"

  @property
  def uses_reference(self) -> bool:
    return self.kl.coef > 0 or self.kl.in_reward_coef > 0


def build(values: Mapping[str, Any]) -> TrainConfig:
  """TrainConfig of {dotted: value} over the defaults. Every problem is
  reported at once: unknown fields, types and ranges (found before a
  section is built, so core's own checks never pre-empt the list), then
  the cross-field checks that can still run."""
  # A saved config.json older than run.async_mode names only run.pipelined.
  values = keys.align_async_mode(values)
  known = set(sections.field_names())
  problems = [
    validation.Problem(k, v, "a TrainConfig field")
    for k, v in values.items()
    if k not in known
  ]
  problems += [
    p
    for k, v in values.items()
    if k in known
    for p in validation.field_problems(k, v)
  ]
  nested = keys.unflatten({k: v for k, v in values.items() if k in known})
  kwargs: dict[str, Any] = {}
  if "algorithm" in nested:
    kwargs["algorithm"] = nested.pop("algorithm")
  for name, fields in nested.items():
    try:
      kwargs[name] = sections.SECTIONS[name](**fields)
    except (TypeError, ValueError) as e:  # a section's own checks
      if not problems:  # name the field the message starts with
        msg = str(e)
        field = min(fields, key=lambda f: (msg.find(f) % (len(msg) + 1), f))
        problems.append(
          validation.Problem(f"{name}.{field}", fields[field], msg)
        )
  if not problems:
    return TrainConfig(**kwargs)
  unchecked = object.__new__(TrainConfig)  # for the cross checks only
  for f in dataclasses.fields(TrainConfig):
    default = f.default_factory() if f.name in sections.SECTIONS else f.default
    object.__setattr__(unchecked, f.name, kwargs.get(f.name, default))
  reported = {p.field for p in problems}
  problems += validation.cross_problems(unchecked, reported)
  raise validation.ConfigError(problems)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)
