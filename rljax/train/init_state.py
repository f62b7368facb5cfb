"""A Trainer's starting weights and its compiled update step, from the config.

`build` turns the loaded model into what the update step trains:

  θ          master weights in `model.param_dtype`, UAQ-folded when
             `rollout.uaq_scale` != 1; with LoRA, the adapters alone
  reference  a copy of θ in the compute dtype, for the KL term
  LoRA base  θ frozen (after the fold); the adapters merge into it
  critic     a value head initialised from the base weights (GAE runs)
  spec       the `UpdateSpec` every pass of the step reads
  steps      the single-device update step (jitted, the state donated) and
             the value-pretraining step, compiled once per process for
             equal configurations

Where these arrays live (one device or a mesh) is the Trainer's
`placement.Placement`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from rljax import models
from rljax import quant
from rljax.models import lora as lora_lib
from rljax.train import critic_pretrain
from rljax.train import optim as optim_lib
from rljax.train import placement as placement_lib
from rljax.train import update as update_lib
from rljax.train.config import TrainConfig


def load_policy(cfg: TrainConfig, seed: int) -> models.Model:
  """The policy named by `cfg.model`, its master weights in
  `model.param_dtype`."""
  return models.load_named(
    cfg.model.name, seed, dtype=jnp.dtype(cfg.model.param_dtype)
  )


# Update steps shared by every Trainer of a process (an ablation, the
# tests), so that equal configurations compile once; `rljax.study` empties
# it between runs to give the memory back.
UPDATE_STEPS: dict = {}


def compiled_update(spec, optim, critic_optim) -> tuple:
  """(optimizer, critic optimizer or None, jit(update_step)) for a spec and
  its optimizer configs; the same objects for equal arguments."""
  key = (spec, optim, critic_optim)
  if key not in UPDATE_STEPS:
    opt = optim_lib.make_optimizer(optim)
    copt = optim_lib.make_optimizer(critic_optim) if critic_optim else None
    UPDATE_STEPS[key] = (
      opt,
      copt,
      update_lib.make_update_step(spec, opt, copt),
    )
  return UPDATE_STEPS[key]


@functools.partial(jax.jit, static_argnums=0)
def merge_lora(transform, frozen, adapters):
  """θ as the model runs it under LoRA: the adapters merged into the frozen
  base (fresh buffers)."""
  return transform(frozen, adapters)


def update_spec(
  cfg: TrainConfig, model_config: Any, param_transform: Any
) -> update_lib.UpdateSpec:
  """The static description of the update step that `cfg` asks for."""
  n_updates = cfg.update.ppo_epochs * cfg.update.minibatches
  return update_lib.UpdateSpec(
    model_config=model_config,
    loss=cfg.loss,
    temperature=cfg.rollout.temperature,
    kl_coef=cfg.kl.coef,
    kl_estimator=cfg.kl.estimator,
    entropy_coef=cfg.update.entropy_coef,
    micro_batches=cfg.update.micro_batches,
    logprob_chunk=cfg.update.logprob_chunk,
    remat=(
      "dots"
      if cfg.update.remat and cfg.update.remat_policy == "dots"
      else cfg.update.remat
    ),
    prox_is_current=(n_updates == 1),
    uses_critic=cfg.uses_critic,
    value_clip=cfg.critic.value_clip,
    value_coef=cfg.critic.value_coef,
    param_transform=param_transform,
    compute_dtype=placement_lib.compute_dtype(cfg),
    activation_dtype=placement_lib.activation_dtype(cfg),
    # make_batch packs every response to max_new_tokens after its prompt.
    response_len=cfg.rollout.max_new_tokens,
  )


@dataclasses.dataclass
class Start:
  """What `build` returns: the Trainer places the arrays, then keeps them."""

  spec: update_lib.UpdateSpec
  lora: Any  # models.lora config, or None
  optimizer: optax.GradientTransformation
  critic_optimizer: optax.GradientTransformation | None
  update_step: Callable  # single-device jit(update_step), donates the state
  critic_step: Callable | None  # value pretraining's step, if the run has it
  state: update_lib.TrainState
  ref_params: Any  # None without a KL term
  frozen_params: Any  # the LoRA base, None without LoRA


def build(cfg: TrainConfig, model: models.Model) -> Start:
  """The starting train state and update steps for `model` under `cfg`."""
  config = model.config
  # Master weights in model.param_dtype (a model passed in is cast too);
  # the forward passes run in the compute dtype (`spec.compute_dtype`).
  params = update_lib.cast_floating(model.params, cfg.model.param_dtype)
  compute_dtype = placement_lib.compute_dtype(cfg)
  # UAQ (QuRL §4.3): a one-time, function-preserving reparametrisation;
  # training then runs in the folded parametrisation. Applied whatever the
  # rollout's format, so config.json records what ran and an unquantized
  # run with s != 1 is UAQ's exact control.
  if cfg.rollout.uaq_scale != 1.0:
    params = quant.fold_uaq(config, params, scale=cfg.rollout.uaq_scale)
  # A copy: the update step donates (and so deletes) the buffers of θ.
  # The reference is only ever run forward: it is kept in the compute
  # dtype (half the memory under bf16; the cast is the copy then).
  ref_params = None
  if cfg.uses_reference:
    ref_params = update_lib.cast_floating(
      jax.tree.map(jnp.copy, params), compute_dtype
    )
  # LoRA: θ = frozen base (after the UAQ fold) ⊕ adapters; only the
  # adapters are trained, optimised and checkpointed (models/lora.py).
  lora = cfg.lora_config()
  frozen_params, param_transform = None, None
  base_params = params
  if lora is not None:
    frozen_params = lora_lib.freeze_base(config, params, lora)
    params = lora_lib.init_adapters(
      config, lora, jax.random.PRNGKey(cfg.run.seed + 2)
    )
    param_transform = lora_lib.LoraTransform(config, lora)
  critic_optim, critic_params = None, None
  if cfg.uses_critic:
    critic_optim = cfg.optim_config(critic=True)
    critic_params = models.init_critic(
      config, base_params, jax.random.PRNGKey(cfg.run.seed + 1)
    )
  spec = update_spec(cfg, config, param_transform)
  optimizer, critic_opt, update_step = compiled_update(
    spec, cfg.optim_config(), critic_optim
  )
  state = update_lib.init_train_state(
    params, optimizer, critic_params, critic_opt
  )
  critic_step = None
  if critic_pretrain.steps(cfg):
    critic_step = critic_pretrain.make_critic_step(spec, critic_opt)
  return Start(
    spec=spec,
    lora=lora,
    optimizer=optimizer,
    critic_optimizer=critic_opt,
    update_step=update_step,
    critic_step=critic_step,
    state=state,
    ref_params=ref_params,
    frozen_params=frozen_params,
  )
