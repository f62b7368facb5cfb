"""The update step: one jitted function from (state, batch) to (state, metrics).

The loss of a minibatch is assembled from the `rljax.core` kernels, each a
(sum S, denominator D) pair in its own aggregation mode:

  L(θ) = Σ_mb S_pg(θ; mb) / D_pg  +  β_KL Σ_mb S_kl(θ; mb) / D_mask
         − β_H Σ_mb S_H(θ; mb) / D_mask  +  μ Σ_mb S_NLL(θ; mb) / D_pos

D_pg = Σ_mb `objectives.policy_loss_denominator` counts only the tokens the
correction keeps (mis and the sequence-level rejections drop tokens from the
sum *and* the denominator); D_mask counts the loss mask; D_pos the tokens of
the positive-reward responses (VAPO's NLL term, `core.nll`, when μ > 0).
All depend on the masks, rewards and ρ only, so they are known before any gradient is taken (when
θ_prox is the current θ and the correction rejects, ρ needs one forward pass
first). Gradients of the micro-batches are therefore summed, not averaged,
and the step's loss and gradient equal those of `objectives.policy_loss` +
β_KL·`kl.kl_loss` − β_H·aggregate(entropy) on the whole minibatch, for every
correction and aggregation mode.

The function is jitted once per batch shape, donates the train state's
buffers, and runs sharded when its inputs carry NamedShardings.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rljax import models
from rljax import quant
from rljax.core import aggregation as agg_lib
from rljax.core import exposure as exposure_lib
from rljax.core import kl as kl_lib
from rljax.core import nll as nll_lib
from rljax.core import objectives
from rljax.train import optim as optim_lib

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
  # True: recompute each decoder layer in the backward pass; "dots": keep
  # the projections' outputs and recompute the rest (decoder docstring).
  remat: bool | str = False
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
  # Mixed precision (docs/precision.md): the dtype the forward passes run in,
  # cast from the master params inside the step (gradients and optimizer
  # state stay in the params' dtype); None = the params' own dtype.
  compute_dtype: str | None = None
  # The activation dtype of those passes; None = compute_dtype. "float32"
  # under a bfloat16 compute dtype is the CPU's mixed precision: bf16 x bf16
  # -> f32 dots (`quant.bf16_dot`, backward too) with float32 activations,
  # since CPUs have bf16 dot units but no fast bf16 elementwise arithmetic
  # (`placement.activation_dtype`, docs/precision.md).
  activation_dtype: str | None = None
  # The batch's last `response_len` tokens are the responses (the trainer
  # packs every rollout so: prompts left-padded first, then responses
  # right-padded to max_new_tokens, `RolloutBatch.pack`) and only those
  # tokens are in the loss mask. Log-probs are then computed for the
  # response targets only: the LM head and its vocabulary-wide softmax skip
  # the prompt positions, which the loss masks out (the default job's
  # update step, 48 x 96 tokens with 32 of response: 53.2 -> 41.8 s on a
  # 2-core CPU, docs/performance.md). None = every position.
  response_len: int | None = None

  def logprob_start(self, length: int) -> int:
    """The first log-prob column the loss can read in a batch of `length`
    tokens: that of the first response token's target."""
    if self.response_len is None:
      return 0
    return max(length - 1 - self.response_len, 0)


def cast_floating(tree: Any, dtype: Any) -> Any:
  """`tree` with its floating-point arrays cast to `dtype` (None: as is).

  Leaves already in `dtype` are returned as they are (no op is traced), so a
  float32 run with compute_dtype="float32" traces the very same program as
  one without a compute dtype. Integer leaves and quantized `QTensor`s
  (codes and scales belong together) are kept.
  """
  if dtype is None:
    return tree
  dtype = jnp.dtype(dtype)

  def cast(x):
    if isinstance(x, quant.QTensor) or not hasattr(x, "dtype"):
      return x
    if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
      return x.astype(dtype)
    return x

  return jax.tree.map(
    cast, tree, is_leaf=lambda x: isinstance(x, quant.QTensor)
  )


def compute_params(spec: UpdateSpec, params: Any) -> Any:
  """Policy (or reference) params as the forward passes run them: cast to
  `spec.compute_dtype`. Differentiable: the cast's gradient reaches the
  master params in their own dtype."""
  return cast_floating(params, spec.compute_dtype)


def compute_critic(spec: UpdateSpec, critic_params: Any) -> Any:
  """The critic as its forward pass runs it: the backbone in
  `spec.compute_dtype`; the value head stays in its own dtype
  (`models.value_forward` applies it in float32)."""
  if critic_params is None or spec.compute_dtype is None:
    return critic_params
  return dict(
    critic_params,
    backbone=cast_floating(critic_params["backbone"], spec.compute_dtype),
  )


def current_learning_rate(opt_state) -> jax.Array:
  """The learning rate the last `update` used (inject_hyperparams state)."""
  return optim_lib.learning_rate(opt_state)


def all_finite(tree) -> jax.Array:
  """True iff every floating-point leaf of `tree` is free of NaN and inf
  (integer leaves, such as Adam's step count, cannot be non-finite)."""
  checks = [
    jnp.all(jnp.isfinite(x))
    for x in jax.tree.leaves(tree)
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
  ]
  return jnp.all(jnp.stack(checks)) if checks else jnp.asarray(True)


def _like(x, like):
  """`x` in the dtype of `like` (no op traced when it already is)."""
  return x if x.dtype == like.dtype else x.astype(like.dtype)


def guarded_update(
  optimizer: optax.GradientTransformation,
  grads,
  opt_state,
  params,
  loss: jax.Array,
):
  """One optimizer step that is applied only if everything it produces is
  finite; otherwise the old (params, opt_state) come back unchanged.

  Checking the loss and gradients is not enough: finite gradients can still
  make non-finite parameters or moments (Adam with b2 = 1 divides 0 by 0 at
  its bias correction; an inf learning rate; an overflowing second moment).
  So the check covers the inputs (loss, gradients) and the results (the
  updated parameters and the whole optimizer state). `optax.apply_if_finite`
  checks only its input updates and changes the optimizer-state tree (so
  checkpoints and `current_learning_rate` would change), so it is not used.

  Returns:
    (params, opt_state, applied): the new or the old values, and the bool
    scalar `applied`.
  """
  updates, new_opt_state = optimizer.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  applied = (
    jnp.isfinite(loss)
    & all_finite(grads)
    & all_finite(new_params)
    & all_finite(new_opt_state)
  )
  # The state keeps its dtypes from step to step (so the jitted step and the
  # checkpoints see one tree): with bfloat16 params optax computes Adam's
  # first moment against float32 hyperparameters, in float32.
  keep = lambda n, o: _like(jnp.where(applied, n, o), o)
  return (
    jax.tree.map(keep, new_params, params),
    jax.tree.map(keep, new_opt_state, opt_state),
    applied,
  )


def _split_micro(batch: Batch, n: int) -> Batch:
  def split(x):
    if x.shape[0] % n:
      raise ValueError(
        f"micro_batches={n} must divide the minibatch size {x.shape[0]}"
      )
    # Micro-batch i = rows i, i+n, i+2n, ...: a batch sharded in contiguous
    # blocks over devices then keeps every micro-batch spread over all of
    # them (rows i*B/n.. would put each micro-batch on 1/n of the devices and
    # make the others wait or recompute it). The sums are the same.
    return x.reshape((x.shape[0] // n, n) + x.shape[1:]).swapaxes(0, 1)

  return jax.tree.map(split, batch)


def _policy_logp(spec: UpdateSpec, params, batch: Batch):
  logp, entropy = models.token_logprobs(
    spec.model_config,
    params,
    batch["tokens"],
    attention_mask=batch["attention_mask"],
    temperature=spec.temperature,
    chunk_size=spec.logprob_chunk or None,
    remat=spec.remat,
    activation_dtype=spec.activation_dtype,
    start=spec.logprob_start(batch["tokens"].shape[1]),
  )
  return logp, entropy


def _uses_current_prox(spec: UpdateSpec) -> bool:
  """prox = stop_gradient(logp) in the loss itself; otherwise the batch's
  prox_logp (given, or computed by `_with_prox` when the correction rejects)."""
  return spec.prox_is_current and not spec.loss.rejects


def policy_loss_sum(spec: UpdateSpec, params, mb: Batch, denoms: dict):
  """This micro-batch's share of the full-minibatch loss, and its metrics."""
  logp, entropy = _policy_logp(spec, params, mb)
  mask = mb["loss_mask"]
  if _uses_current_prox(spec):
    prox = jax.lax.stop_gradient(logp)
  else:
    prox = mb["prox_logp"]
  pg_sum, _, metrics = objectives.policy_loss_terms(
    logp, prox, mb["behav_logp"], mb["advantages"], mask, spec.loss
  )
  # What ACR would change in this batch, logged for every correction: a
  # study must see it before it attributes an effect to ACR (an arm whose
  # widened bound never decided a token cannot be credited with its result).
  exposure = exposure_lib.acr_exposure(
    logp,
    prox,
    mb["behav_logp"],
    mb["advantages"],
    mask,
    eps_low=spec.loss.eps_low,
    eps_high=spec.loss.eps_high,
    cap=spec.loss.tis_cap,
  )
  metrics.update(exposure_lib.exposure_metrics(exposure))
  total = pg_sum / denoms["pg"]
  if spec.kl_coef > 0:
    kl_sum, _ = kl_lib.kl_loss_terms(
      logp,
      mb["ref_logp"],
      mask,
      spec.kl_estimator,
      spec.loss.aggregation,
      spec.loss.norm_const,
    )
    total = total + spec.kl_coef * kl_sum / denoms["mask"]
    metrics["kl_to_ref"] = kl_lib.kl_loss(
      jax.lax.stop_gradient(logp), mb["ref_logp"], mask, spec.kl_estimator
    )
  if spec.entropy_coef > 0:
    ent_sum, _ = agg_lib.aggregate(
      entropy, mask, spec.loss.aggregation, spec.loss.norm_const
    )
    total = total - spec.entropy_coef * ent_sum / denoms["mask"]
  if spec.loss.positive_nll_coef > 0:
    # VAPO: + μ·L_NLL, a token mean over the positive responses' tokens of
    # the whole minibatch (D_pos), so the micro-batches sum to it exactly.
    nll_sum, _ = nll_lib.positive_nll_terms(logp, mask, mb["rewards"])
    total = total + spec.loss.positive_nll_coef * nll_sum / denoms["pos"]
    metrics["positive_nll_sum"] = jax.lax.stop_gradient(nll_sum)
  metrics["entropy"] = agg_lib.masked_mean(jax.lax.stop_gradient(entropy), mask)
  metrics["pg_loss_sum"] = pg_sum
  return total, metrics


def _with_prox(spec: UpdateSpec, params, micro: Batch) -> Batch:
  """When θ_prox is the current θ and the correction rejects by ρ, the keep
  mask (hence D_pg) needs log π_θ before the gradient pass: one forward pass
  per micro-batch, whose result then serves as prox_logp in the loss too, so
  the denominator and the kernel's keep-mask come from the same numbers.

  Either way π_prox is "full precision" as docs/precision.md defines it
  under mixed precision: the master θ (never the quantized actor's), cast
  to `spec.compute_dtype` like the training forward, log-softmax in
  float32, so that π_θ/π_prox = 1 before the update."""
  if not (spec.prox_is_current and spec.loss.rejects):
    return micro
  prox = jax.lax.map(
    lambda mb: jax.lax.stop_gradient(_policy_logp(spec, params, mb)[0]), micro
  )
  return dict(micro, prox_logp=prox)


def _denominators(spec: UpdateSpec, micro: Batch) -> dict:
  """D_pg and D_mask of the whole minibatch: sums over micro-batches."""

  def one(mb):
    mask = mb["loss_mask"]
    _, d_mask = agg_lib.aggregate(
      jnp.zeros(mask.shape, jnp.float32),
      mask,
      spec.loss.aggregation,
      spec.loss.norm_const,
    )
    if spec.loss.rejects:
      d_pg = objectives.policy_loss_denominator(
        mb["prox_logp"], mb["behav_logp"], mask, spec.loss
      )
    else:
      d_pg = d_mask  # keep = mask: ρ cannot change it
    return d_pg, d_mask

  d_pg, d_mask = jax.lax.map(one, micro)
  # An all-masked minibatch: every sum is 0, and 0/1 keeps the step finite.
  out = {
    "pg": jnp.maximum(d_pg.sum(), 1e-8),
    "mask": jnp.maximum(d_mask.sum(), 1e-8),
  }
  if spec.loss.positive_nll_coef > 0:  # D_pos: tokens of r > 0 responses
    d_pos = jax.lax.map(
      lambda mb: nll_lib.positive_nll_terms(
        jnp.zeros(mb["loss_mask"].shape), mb["loss_mask"], mb["rewards"]
      )[1],
      micro,
    )
    out["pos"] = jnp.maximum(d_pos.sum(), 1e-8)
  return out


def value_loss_sum(spec: UpdateSpec, critic_params, mb: Batch, denoms: dict):
  """This micro-batch's share of the PPO clipped value loss."""
  critic_params = compute_critic(spec, critic_params)
  values = models.value_forward(
    spec.model_config,
    critic_params["backbone"],
    critic_params["head"],
    mb["tokens"],
    mb["attention_mask"],
    activation_dtype=spec.activation_dtype,
  )[:, :-1]
  s, _, metrics = objectives.value_loss_terms(
    values,
    mb["old_values"],
    mb["returns"],
    mb["loss_mask"],
    clip_eps=spec.value_clip,
    aggregation_mode="token-mean",
  )
  metrics["value_loss_sum"] = s
  return spec.value_coef * s / denoms["mask"], metrics


def _accumulate(loss_fn: Callable, params, micro: Batch, denoms: dict):
  """Σ over micro-batches of (loss, grads, metrics); metrics are averaged
  weighted by valid tokens (max for `max_*`)."""

  def body(carry, mb):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params, mb, denoms
    )
    g_acc, l_acc = carry
    g_acc = jax.tree.map(jnp.add, g_acc, grads)
    ntok = jnp.sum(mb["loss_mask"])
    return (g_acc, l_acc + loss), (metrics, ntok)

  zeros = jax.tree.map(jnp.zeros_like, params)
  (grads, loss), (metrics, ntok) = jax.lax.scan(
    body, (zeros, jnp.zeros((), jnp.float32)), micro
  )
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


def make_update_step(
  spec: UpdateSpec,
  optimizer: optax.GradientTransformation,
  critic_optimizer: optax.GradientTransformation | None = None,
  donate: bool = True,
):
  """Returns jit(update_step)(state, minibatch) -> (state, metrics)."""
  if spec.uses_critic and critic_optimizer is None:
    raise ValueError("uses_critic=True needs a critic_optimizer")

  def update_step(state: TrainState, batch: Batch, frozen=None):
    if spec.param_transform is not None:  # LoRA: merge adapters into the base
      rng = jax.random.fold_in(jax.random.PRNGKey(0), state.step)
      merge = lambda p: compute_params(
        spec, spec.param_transform(frozen, p, rng)
      )
    else:
      merge = lambda p: compute_params(spec, p)
    micro = _with_prox(
      spec, merge(state.params), _split_micro(batch, spec.micro_batches)
    )
    denoms = _denominators(spec, micro)
    # spec.remat: per-layer remat in the decoder (`_policy_logp`); wrapping
    # the whole loss in jax.checkpoint would keep every activation anyway.
    pg = lambda p, mb, d: policy_loss_sum(spec, merge(p), mb, d)
    loss, grads, metrics = _accumulate(pg, state.params, micro, denoms)
    grad_norm = optax.global_norm(grads)
    if "positive_nll_sum" in metrics:  # L_NLL of the minibatch (VAPO)
      metrics["positive_nll"] = metrics["positive_nll_sum"] / denoms["pos"]
    # Nothing non-finite may reach the params or the optimizer state: keep
    # the old state and report it (the trainer stops with a debug dump).
    params, opt_state, finite = guarded_update(
      optimizer, grads, state.opt_state, state.params, loss
    )
    metrics.update(
      loss=loss,
      grad_norm=grad_norm,
      applied=finite.astype(jnp.float32),
      learning_rate=optim_lib.learning_rate(opt_state),
    )
    new_state = state.replace(
      step=state.step + 1, params=params, opt_state=opt_state
    )
    if spec.uses_critic:
      tokens = jnp.maximum(jnp.sum(batch["loss_mask"]), 1e-8)  # token-mean
      vf = lambda p, mb, d: value_loss_sum(spec, p, mb, d)
      v_loss, v_grads, v_metrics = _accumulate(
        vf, state.critic_params, micro, {"mask": tokens}
      )
      c_params, c_opt, c_ok = guarded_update(
        critic_optimizer,
        v_grads,
        state.critic_opt_state,
        state.critic_params,
        v_loss,
      )
      # Actor and critic move together or not at all.
      both = finite & c_ok
      keep = lambda n, o: jnp.where(both, n, o)
      new_state = new_state.replace(
        params=jax.tree.map(keep, params, state.params),
        opt_state=jax.tree.map(keep, opt_state, state.opt_state),
        critic_params=jax.tree.map(keep, c_params, state.critic_params),
        critic_opt_state=jax.tree.map(keep, c_opt, state.critic_opt_state),
      )
      metrics["applied"] = both.astype(jnp.float32)
      metrics.update(
        value_loss=v_loss, critic_grad_norm=optax.global_norm(v_grads)
      )
    return new_state, metrics

  return jax.jit(update_step, donate_argnums=(0,) if donate else ())


def minibatch(batch: Batch, minibatches: int, seed: int, m: int) -> Batch:
  """Minibatch `m` of `minibatches` of one epoch whose row order is drawn
  with `seed` (rows kept in ascending order within a minibatch)."""
  size = batch["tokens"].shape[0]
  order = np.random.default_rng(seed).permutation(size)
  per = size // minibatches
  idx = jnp.asarray(np.sort(order[m * per : (m + 1) * per]))
  return {k: v[idx] for k, v in batch.items()}


def run_epochs(
  update_step: Callable,
  state: TrainState,
  batch: Batch,
  frozen: Any,
  seeds: list[int],
  minibatches: int,
) -> tuple[TrainState, list[dict[str, jax.Array]]]:
  """len(seeds) epochs × `minibatches` updates of `update_step`.

  Returns the new state and every update's metrics as device arrays: each
  update is dispatched as soon as the previous one is, and nothing waits
  until the caller fetches the metrics (once per step).
  """
  metrics = []
  for seed in seeds:
    for m in range(minibatches):
      state, out = update_step(
        state, minibatch(batch, minibatches, seed, m), frozen
      )
      metrics.append(out)
  return state, metrics


def reduce_metrics(updates: list[dict[str, float]]) -> dict[str, float]:
  """One value per metric over a step's updates: the max of `max_*`, the
  mean of the others."""
  out = {}
  for k in updates[0]:
    vals = [u[k] for u in updates]
    out[k] = max(vals) if k.startswith("max_") else float(np.mean(vals))
  return out


def fetch_metrics(updates: list[dict[str, jax.Array]]) -> list[dict]:
  """The host floats of a step's update metrics, in one transfer (it waits
  for the last update)."""
  return [{k: float(v) for k, v in m.items()} for m in jax.device_get(updates)]


def init_train_state(
  params, optimizer, critic_params=None, critic_optimizer=None
) -> TrainState:
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=optimizer.init(params),
    critic_params=critic_params,
    critic_opt_state=(
      critic_optimizer.init(critic_params)
      if critic_params is not None
      else None
    ),
  )
