"""The update step: one jitted function from (state, batch) to (state, metrics).

The loss of a minibatch is assembled from the `rljax.core` kernels:

  L(θ) = Σ_mb S_pg(θ; mb) / D_pg  +  β_KL Σ_mb S_kl(θ; mb) / D_pg
         − β_H Σ_mb S_H(θ; mb) / D_pg

where each kernel returns a (sum S, denominator D) pair for its aggregation
mode and D_pg = Σ_mb D(mb) is known before any gradient is taken (it depends on
the masks only). Gradients of the micro-batches are therefore summed, not
averaged, and the accumulated gradient equals the full-batch gradient exactly,
whatever the aggregation mode (token-mean, seq-mean-token-mean, ...).

The function is jitted once per batch shape, donates the train state's
buffers, and runs sharded when its inputs carry NamedShardings.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rljax import models
from rljax.core import aggregation as agg_lib
from rljax.core import kl as kl_lib
from rljax.core import objectives

Batch = dict[str, jax.Array]


class TrainState(flax.struct.PyTreeNode):
  """Parameters and optimiser state of the policy (and the critic, for PPO)."""
  step: jax.Array
  params: Any
  opt_state: Any
  critic_params: Any = None
  critic_opt_state: Any = None


@dataclasses.dataclass(frozen=True)
class UpdateSpec:
  """Static description of the loss; hashable so jit can close over it."""
  model_config: Any
  loss: objectives.PolicyLossConfig
  temperature: float = 1.0
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  entropy_coef: float = 0.0
  micro_batches: int = 1
  logprob_chunk: int = 0
  remat: bool = False
  # When θ_prox is the very θ being differentiated (one epoch, one
  # minibatch), prox_logp = stop_gradient(logp) and no extra forward pass is
  # needed.
  prox_is_current: bool = False
  uses_critic: bool = False
  value_clip: float = 0.2
  value_coef: float = 0.5
  # LoRA (rljax.models.lora.LoraTransform): state.params holds only the
  # trainable tree; the model runs param_transform(frozen, params, rng), with
  # the frozen base passed to the step, never differentiated nor optimised.
  param_transform: Callable[..., Any] | None = None


def make_optimizer(learning_rate: float, steps: int, warmup_steps: int = 0,
                   schedule: str = "constant", weight_decay: float = 0.0,
                   max_grad_norm: float = 1.0, b1: float = 0.9,
                   b2: float = 0.999) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and a warmup + constant/cosine schedule."""
  if schedule == "cosine":
    lr = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, max(warmup_steps, 1), max(steps, warmup_steps + 1))
  elif warmup_steps > 0:
    lr = optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, warmup_steps),
         optax.constant_schedule(learning_rate)], [warmup_steps])
  else:
    lr = optax.constant_schedule(learning_rate)
  tx = optax.chain(
      optax.clip_by_global_norm(max_grad_norm) if max_grad_norm > 0
      else optax.identity(),
      optax.inject_hyperparams(optax.adamw)(
          learning_rate=lr, b1=b1, b2=b2, weight_decay=weight_decay))
  return tx


def current_learning_rate(opt_state) -> jax.Array:
  """The learning rate the last `update` used (inject_hyperparams state)."""
  return opt_state[1].hyperparams["learning_rate"]


def _learning_rate(opt_state) -> jax.Array:
  try:
    return current_learning_rate(opt_state)
  except (AttributeError, IndexError, KeyError, TypeError):
    return jnp.asarray(jnp.nan)  # an optimizer not built by make_optimizer


def _keep_if(ok: jax.Array, new, old):
  return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def _split_micro(batch: Batch, n: int) -> Batch:
  def split(x):
    if x.shape[0] % n:
      raise ValueError(
          f"micro_batches={n} must divide the minibatch size {x.shape[0]}")
    return x.reshape((n, x.shape[0] // n) + x.shape[1:])
  return jax.tree.map(split, batch)


def _policy_logp(spec: UpdateSpec, params, batch: Batch):
  logp, entropy = models.token_logprobs(
      spec.model_config, params, batch["tokens"],
      attention_mask=batch["attention_mask"], temperature=spec.temperature,
      chunk_size=spec.logprob_chunk or None)
  return logp, entropy


def policy_loss_sum(spec: UpdateSpec, params, mb: Batch, denom: jax.Array):
  """This micro-batch's share of the full-minibatch loss, and its metrics."""
  logp, entropy = _policy_logp(spec, params, mb)
  mask = mb["loss_mask"]
  prox = jax.lax.stop_gradient(logp) if spec.prox_is_current else mb["prox_logp"]
  pg_sum, _, metrics = objectives.policy_loss_terms(
      logp, prox, mb["behav_logp"], mb["advantages"], mask, spec.loss)
  total = pg_sum
  if spec.kl_coef > 0:
    kl_tok = getattr(kl_lib, spec.kl_estimator)(logp, mb["ref_logp"])
    kl_sum, _ = agg_lib.aggregate(kl_tok, mask, spec.loss.aggregation,
                                  spec.loss.norm_const)
    total = total + spec.kl_coef * kl_sum
    metrics["kl_to_ref"] = jnp.sum(kl_tok * mask) / jnp.maximum(mask.sum(), 1)
  ent_sum, _ = agg_lib.aggregate(entropy, mask, spec.loss.aggregation,
                                 spec.loss.norm_const)
  if spec.entropy_coef > 0:
    total = total - spec.entropy_coef * ent_sum
  metrics["entropy"] = jnp.sum(entropy * mask) / jnp.maximum(mask.sum(), 1)
  metrics["pg_loss_sum"] = pg_sum
  return total / denom, metrics


def value_loss_sum(spec: UpdateSpec, critic_params, mb: Batch,
                   denom: jax.Array):
  """This micro-batch's share of the PPO clipped value loss."""
  values = models.value_forward(
      spec.model_config, critic_params["backbone"], critic_params["head"],
      mb["tokens"], mb["attention_mask"])[:, :-1]
  s, _, metrics = objectives.value_loss_terms(
      values, mb["old_values"], mb["returns"], mb["loss_mask"],
      clip_eps=spec.value_clip, aggregation_mode="token-mean")
  metrics["value_loss_sum"] = s
  return spec.value_coef * s / denom, metrics


def _accumulate(loss_fn: Callable, params, micro: Batch, denom: jax.Array):
  """Σ over micro-batches of (loss, grads, metrics); metrics are averaged
  weighted by valid tokens (max for `max_*`)."""
  def body(carry, mb):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, mb, denom)
    g_acc, l_acc = carry
    g_acc = jax.tree.map(jnp.add, g_acc, grads)
    ntok = jnp.sum(mb["loss_mask"])
    return (g_acc, l_acc + loss), (metrics, ntok)
  zeros = jax.tree.map(jnp.zeros_like, params)
  (grads, loss), (metrics, ntok) = jax.lax.scan(
      body, (zeros, jnp.zeros((), jnp.float32)), micro)
  weights = ntok / jnp.maximum(jnp.sum(ntok), 1)
  merged = {}
  for k, v in metrics.items():
    if k.startswith("max_"):
      merged[k] = jnp.max(v)
    elif k.endswith("_sum"):
      merged[k] = jnp.sum(v)
    else:
      merged[k] = jnp.sum(v * weights)
  return loss, grads, merged


def make_update_step(spec: UpdateSpec, optimizer: optax.GradientTransformation,
                     critic_optimizer: optax.GradientTransformation | None = None,
                     donate: bool = True):
  """Returns jit(update_step)(state, minibatch) -> (state, metrics)."""
  if spec.uses_critic and critic_optimizer is None:
    raise ValueError("uses_critic=True needs a critic_optimizer")

  def update_step(state: TrainState, batch: Batch, frozen=None):
    _, denom = agg_lib.aggregate(
        jnp.zeros_like(batch["loss_mask"]), batch["loss_mask"],
        spec.loss.aggregation, spec.loss.norm_const)
    denom = jnp.maximum(denom, 1e-8)
    micro = _split_micro(batch, spec.micro_batches)
    pg = lambda p, mb, d: policy_loss_sum(spec, p, mb, d)
    if spec.param_transform is not None:  # LoRA: merge adapters into the base
      rng = jax.random.fold_in(jax.random.PRNGKey(0), state.step)
      pg = lambda p, mb, d: policy_loss_sum(
          spec, spec.param_transform(frozen, p, rng), mb, d)
    if spec.remat:
      pg = jax.checkpoint(pg)
    loss, grads, metrics = _accumulate(pg, state.params, micro, denom)
    grad_norm = optax.global_norm(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # A NaN/inf loss or gradient must not reach the params: keep the old
    # state and report it (the trainer stops with a debug dump).
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    params, opt_state = _keep_if(finite, (params, opt_state),
                                 (state.params, state.opt_state))
    metrics.update(loss=loss, grad_norm=grad_norm,
                   applied=finite.astype(jnp.float32),
                   learning_rate=_learning_rate(opt_state))
    new_state = state.replace(step=state.step + 1, params=params,
                              opt_state=opt_state)
    if spec.uses_critic:
      _, tok_denom = agg_lib.aggregate(
          jnp.zeros_like(batch["loss_mask"]), batch["loss_mask"], "token-mean")
      vf = lambda p, mb, d: value_loss_sum(spec, p, mb, d)
      v_loss, v_grads, v_metrics = _accumulate(
          vf, state.critic_params, micro, jnp.maximum(tok_denom, 1e-8))
      v_updates, c_opt = critic_optimizer.update(
          v_grads, state.critic_opt_state, state.critic_params)
      c_params = optax.apply_updates(state.critic_params, v_updates)
      c_ok = finite & jnp.isfinite(v_loss)
      c_params, c_opt = _keep_if(c_ok, (c_params, c_opt),
                                 (state.critic_params, state.critic_opt_state))
      new_state = new_state.replace(critic_params=c_params,
                                    critic_opt_state=c_opt)
      metrics.update(value_loss=v_loss, critic_grad_norm=optax.global_norm(v_grads))
    return new_state, metrics

  return jax.jit(update_step, donate_argnums=(0,) if donate else ())


def init_train_state(params, optimizer, critic_params=None,
                     critic_optimizer=None) -> TrainState:
  return TrainState(
      step=jnp.zeros((), jnp.int32), params=params,
      opt_state=optimizer.init(params),
      critic_params=critic_params,
      critic_opt_state=(critic_optimizer.init(critic_params)
                        if critic_params is not None else None))
