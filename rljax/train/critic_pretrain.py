"""Value pretraining (VC-PPO): the critic fitted before the policy moves.

Yuan et al. 2025, "What's Behind PPO's Collapse in Long-CoT? Value
Optimization Holds the Secret" (VC-PPO), and VAPO (Yue et al. 2025) after
it: a critic initialised from the policy (or a reward model) starts biased,
and GAE's bootstrapping turns that bias into wrong advantages in the first
RL steps. So the value model is first trained alone, on responses sampled
from the initial policy, against Monte-Carlo returns (λ = 1: G_t = Σ_{k≥t}
γ^{k−t} r_k, no bootstrapping), until its loss has come down.

With `--critic.pretrain_steps=N` the run's first N steps are such steps
(the trainer's `train_step`, `loop.py`): the same rollout, reward and batch
phases as an RL step (the batch's returns with λ_critic = 1 whatever
`critic.gae_lambda` says), then `update.ppo_epochs` × `update.minibatches`
updates of the critic alone (`make_critic_step`: the clipped value loss of
`objectives.value_loss_terms`, the critic's AdamW); the policy, its
optimizer state and the rollout engine's weights are not touched. Each
step's `value_loss` and `critic_pretrain` = 1 go to metrics.jsonl (the loss
curve), and it is checkpointed and resumed like any step. The RL steps then
follow as steps N+1 ... N+run.steps. Without a critic
(`advantage.estimator` other than "gae") the setting has nothing to fit and
the run has no pretraining steps.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from rljax.train import update as update_lib
from rljax.train.config import TrainConfig


def steps(cfg: TrainConfig) -> int:
  """The number of value-pretraining steps the run starts with."""
  return cfg.critic.pretrain_steps if cfg.uses_critic else 0


def total_steps(cfg: TrainConfig) -> int:
  """Every step of the run: value pretraining, then run.steps RL steps."""
  return steps(cfg) + cfg.run.steps


def is_pretraining(cfg: TrainConfig, step: int) -> bool:
  """Whether step `step` (1-based) fits the critic only."""
  return step <= steps(cfg)


def policy_version(cfg: TrainConfig, step: int) -> int:
  """The version of θ after step `step`: how many policy updates made it.

  Value-pretraining steps update the critic only, so they are not versions:
  a token sampled by θ_0 and trained after P pretraining steps has lag 0,
  not P (`RolloutBatch.policy_version`, `staleness.py`).
  """
  return max(0, step - steps(cfg))


def monte_carlo_config(cfg: TrainConfig) -> TrainConfig:
  """`cfg` with λ_critic = 1: the batch's returns are Monte-Carlo returns."""
  return dataclasses.replace(
    cfg, critic=dataclasses.replace(cfg.critic, gae_lambda=1.0)
  )


def make_critic_step(
  spec: update_lib.UpdateSpec, critic_optimizer: optax.GradientTransformation
) -> Callable:
  """jit(critic_step)(state, minibatch, frozen) -> (state, metrics).

  The critic's half of `update.make_update_step`: the token-mean clipped
  value loss over the minibatch (micro-batch sums, as there), one guarded
  AdamW step of the critic. `state.params` and `state.opt_state` come back
  as they went in (the buffers themselves: nothing is donated), so the
  policy is bit-identical after any number of these steps.
  """

  def critic_step(state: update_lib.TrainState, batch, frozen=None):
    del frozen  # the policy is not run
    micro = update_lib._split_micro(batch, spec.micro_batches)  # pylint: disable=protected-access
    tokens = jnp.maximum(jnp.sum(batch["loss_mask"]), 1e-8)  # token-mean
    vf = lambda p, mb, d: update_lib.value_loss_sum(spec, p, mb, d)
    v_loss, v_grads, metrics = update_lib._accumulate(  # pylint: disable=protected-access
      vf, state.critic_params, micro, {"mask": tokens}
    )
    c_params, c_opt, ok = update_lib.guarded_update(
      critic_optimizer,
      v_grads,
      state.critic_opt_state,
      state.critic_params,
      v_loss,
    )
    metrics.update(
      value_loss=v_loss,
      critic_grad_norm=optax.global_norm(v_grads),
      applied=ok.astype(jnp.float32),
    )
    new_state = state.replace(critic_params=c_params, critic_opt_state=c_opt)
    return new_state, metrics

  return jax.jit(critic_step)
