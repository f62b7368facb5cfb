"""The optimizer of the policy and the critic: AdamW, clipping, a schedule.

`OptimConfig` is the config section of the optimizer; `make_optimizer(cfg)`
builds the optax transformation from it, and `learning_rate(opt_state)`
reads the rate the last update used back out of the optimizer state.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW with global-norm clipping and a warmup + constant/cosine schedule.

  Also the `optim` section of `TrainConfig`, where `steps` stays 0 and the
  trainer fills it in (`TrainConfig.optim_config`). `OptimConfig(1e-3, 10)`
  reads as (learning rate, updates).
  """

  # 0 is accepted as a control run (the policy never moves), with a note.
  learning_rate: float = 1e-5
  # Optimizer updates in the run (the cosine length); 0 in a TrainConfig:
  # run.steps × update.ppo_epochs × update.minibatches.
  steps: int = 0
  warmup_steps: int = 0
  schedule: str = "constant"  # constant | cosine
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0  # 0 turns clipping off
  b1: float = 0.9
  b2: float = 0.999

  def __post_init__(self):
    if self.schedule not in ("constant", "cosine"):
      raise ValueError(
        f"OptimConfig.schedule={self.schedule!r}; expected "
        "'constant' or 'cosine'"
      )


def schedule(cfg: OptimConfig) -> optax.Schedule:
  """The learning-rate schedule of `cfg` (linear warmup from 0)."""
  if cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
      0.0,
      cfg.learning_rate,
      max(cfg.warmup_steps, 1),
      max(cfg.steps, cfg.warmup_steps + 1),
    )
  if cfg.warmup_steps > 0:
    return optax.join_schedules(
      [
        optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps),
        optax.constant_schedule(cfg.learning_rate),
      ],
      [cfg.warmup_steps],
    )
  return optax.constant_schedule(cfg.learning_rate)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
  """clip_by_global_norm → AdamW(schedule); hyperparameters injected so the
  current learning rate lives in the optimizer state (`learning_rate`)."""
  clip = (
    optax.clip_by_global_norm(cfg.max_grad_norm)
    if cfg.max_grad_norm > 0
    else optax.identity()
  )
  # hyperparam_dtype: without it the injected b1, b2, eps and learning rate
  # take the params' dtype, and bfloat16 params (--model.param_dtype) round
  # b2 = 0.999 to 1.0, whose zero bias correction makes every update NaN.
  return optax.chain(
    clip,
    optax.inject_hyperparams(optax.adamw, hyperparam_dtype=jnp.float32)(
      learning_rate=schedule(cfg),
      b1=cfg.b1,
      b2=cfg.b2,
      weight_decay=cfg.weight_decay,
    ),
  )


def _is_array(_, value) -> bool:
  return isinstance(value, jax.Array)


def with_hyperparams(opt_state, cfg: OptimConfig):
  """`opt_state` holding `cfg`'s b1, b2 and weight_decay.

  `inject_hyperparams` keeps them in the optimizer state, so a restored
  state would bring back the checkpoint's values whatever the config says;
  a resume applies the config's (a change `run.allow_config_change`
  allowed), as it does the learning rate, a schedule of the step count.
  """
  values = {}
  for name in ("b1", "b2", "weight_decay"):
    old = optax.tree_utils.tree_get(opt_state, name, filtering=_is_array)
    if old is not None:
      new = jnp.asarray(getattr(cfg, name), old.dtype)
      values[name] = jax.device_put(new, old.sharding)
  return optax.tree_utils.tree_set(opt_state, _is_array, **values)


def learning_rate(opt_state) -> jax.Array:
  """The learning rate the last update used, found by name in the optimizer
  state (`inject_hyperparams`); NaN for an optimizer without one."""
  # `hyperparams_states` also holds a "learning_rate" (the schedule's count
  # state): keep the array leaf only.
  lr = optax.tree_utils.tree_get(
    opt_state,
    "learning_rate",
    filtering=lambda _, value: isinstance(value, jax.Array),
  )
  return jnp.asarray(jnp.nan) if lr is None else jnp.asarray(lr)
