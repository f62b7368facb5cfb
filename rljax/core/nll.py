"""VAPO's positive-example language-model loss.

Yue et al. 2025, "VAPO: Efficient and Reliable Reinforcement Learning for
Advanced Reasoning Tasks", §3.3 (reward sparsity): besides the policy
gradient, the responses that earned a positive reward (the correct ones,
set 𝒯) are also trained on by plain maximum likelihood,

  L_NLL(θ) = − 1 / Σ_{o_i ∈ 𝒯} |o_i| · Σ_{o_i ∈ 𝒯} Σ_t log π_θ(o_i,t | q, o_i,<t)

a token-mean over the tokens of the positive responses, added to the PPO
loss with a weight μ (L = L_PPO + μ·L_NLL; μ = 0.1 in the paper). Unlike
the policy gradient it does not vanish when a group's rewards are all
equal, so an all-correct group still teaches the model its own answers.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _validation as v


def positive_nll_terms(
  logp: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  rewards: Float[ArrayLike, "B"],
) -> tuple[Float[Array, ""], Float[Array, ""]]:
  """(sum, denominator) of VAPO's positive-example NLL (see the module).

    sum = − Σ_{i: r_i > 0} Σ_t mask_i,t · logp_i,t,
    denominator = Σ_{i: r_i > 0} Σ_t mask_i,t

  so that sum / denominator is L_NLL; summing both over micro-batches gives
  the whole batch's token mean exactly. Gradients flow into `logp` only.

  Args:
    logp: [B, T] log π_θ of the sampled tokens (differentiable).
    mask: [B, T] valid response tokens.
    rewards: [B] outcome rewards; a response takes part iff its reward > 0.
  """
  v.check_rank("logp", logp, 2)
  v.check_same_shape(logp=logp, mask=mask)
  v.check_rank("rewards", rewards, 1)
  batch = v.shape_of(logp)[0]
  if v.shape_of(rewards)[0] != batch:
    raise ValueError(
      f"rewards must have one entry per row of logp ({batch}); got shape "
      f"{v.shape_of(rewards)}."
    )
  positive = v.as_float(rewards) > 0
  keep = v.as_mask("mask", mask) & positive[:, None]
  # where, not a product: garbage (inf) log-probs at padding give no NaN.
  nll_sum = -jnp.where(keep, v.as_float(logp), 0.0).sum()
  return nll_sum, keep.sum().astype(nll_sum.dtype)


def positive_nll(
  logp: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  rewards: Float[ArrayLike, "B"],
) -> Float[Array, ""]:
  """L_NLL: the token-mean NLL of the responses with positive reward; 0 when
  no response has one."""
  s, d = positive_nll_terms(logp, mask, rewards)
  return jnp.where(d > 0, s / jnp.maximum(d, 1.0), 0.0)
