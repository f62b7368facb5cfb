"""Per-token KL estimators (Schulman 2020, "Approximating KL Divergence").

For tokens sampled from π (log-prob `logp`) and a reference π_ref
(`ref_logp`), with x = ref_logp − logp = log(π_ref/π):

  k1 = −x                   unbiased for KL(π‖π_ref), high variance, can be < 0
  k2 = ½ x²                 biased, low variance, ≥ 0
  k3 = (eˣ − 1) − x         unbiased for KL(π‖π_ref), low variance, ≥ 0

GRPO (Shao et al. 2024, DeepSeekMath) puts k3 in the loss; PPO-RLHF
(Ouyang et al. 2022) subtracts β·k1 from the per-token reward.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _validation as v
from rljax.core import aggregation

# Above this log-ratio x = ref_logp − logp, k3 continues along its tangent:
# e^30 ≈ 1.1e13 keeps the value, its gradient and the gradient's square
# (global-norm clipping sums squares) finite in f32. Below, nothing can
# overflow (e^x → 0) and k3 is exact.
K3_MAX_LOG_RATIO = 30.0

KL_ESTIMATORS = ("k1", "k2", "k3")


def _check_pair(logp, ref_logp):
  v.check_same_shape(logp=logp, ref_logp=ref_logp)
  v.check_floating("logp", logp)
  v.check_floating("ref_logp", ref_logp)
  return v.as_float(logp), v.as_float(ref_logp)


def k1(
  logp: Float[ArrayLike, "*s"], ref_logp: Float[ArrayLike, "*s"]
) -> Float[Array, "*s"]:
  """k1 = log π(o) − log π_ref(o) (Schulman 2020). Unbiased, may be negative."""
  logp, ref_logp = _check_pair(logp, ref_logp)
  return logp - ref_logp


def k2(
  logp: Float[ArrayLike, "*s"], ref_logp: Float[ArrayLike, "*s"]
) -> Float[Array, "*s"]:
  """k2 = ½ (log π(o) − log π_ref(o))² (Schulman 2020). Biased, ≥ 0."""
  logp, ref_logp = _check_pair(logp, ref_logp)
  return 0.5 * jnp.square(logp - ref_logp)


def k3(
  logp: Float[ArrayLike, "*s"], ref_logp: Float[ArrayLike, "*s"]
) -> Float[Array, "*s"]:
  """k3 = e^(ref−logp) − (ref−logp) − 1 (Schulman 2020; GRPO's KL term).

  Unbiased for KL(π‖π_ref) on samples of π, ≥ 0 and 0 iff logp = ref_logp.
  ∂k3/∂logp = 1 − π_ref/π, exact for every x = ref − logp ≤ K3_MAX_LOG_RATIO:
  in particular where the policy drifted furthest from the reference
  (x ≪ 0, gradient → 1), which a symmetric clamp of x would silence. Above
  K3_MAX_LOG_RATIO (π_ref/π > e^30, where e^x would head for overflow) k3
  continues along its tangent, so it stays finite, convex and increasing.
  Computed as expm1(x) − x (exact near 0) and floored at 0 against rounding.
  """
  logp, ref_logp = _check_pair(logp, ref_logp)
  x = ref_logp - logp
  k = K3_MAX_LOG_RATIO
  exact = jnp.expm1(jnp.minimum(x, k)) - jnp.minimum(x, k)
  # Double where: the tangent's derivative is a constant, so the untaken
  # branch never sends NaN/inf into the gradient.
  tangent = (math.expm1(k) - k) + math.expm1(k) * (x - k)
  return jnp.maximum(jnp.where(x > k, tangent, exact), 0.0)


def kl_estimate(
  logp: Float[ArrayLike, "*s"],
  ref_logp: Float[ArrayLike, "*s"],
  estimator: str = "k3",
) -> Float[Array, "*s"]:
  """Dispatches to k1 / k2 / k3 by name."""
  v.check_choice("estimator", estimator, KL_ESTIMATORS)
  return {"k1": k1, "k2": k2, "k3": k3}[estimator](logp, ref_logp)


def kl_loss_terms(
  logp: Float[ArrayLike, "B T"],
  ref_logp: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  estimator: str = "k3",
  aggregation_mode: str = "token-mean",
  norm_const: float | None = None,
) -> tuple[Float[Array, ""], Float[Array, ""]]:
  """(sum, denominator) of the KL loss term β·KL is built from (GRPO, Eq. 3 of
  Shao et al. 2024): aggregate(k(logp, ref_logp), mask). Gradients flow into
  `logp` only; the reference is a constant."""
  v.check_rank("logp", logp, 2)
  v.check_same_shape(logp=logp, ref_logp=ref_logp, mask=mask)
  valid = v.as_mask("mask", mask)
  # Zero the padding before any arithmetic so garbage there gives no NaN grads.
  logp = jnp.where(valid, v.as_float(logp), 0.0)
  ref_logp = jax.lax.stop_gradient(jnp.where(valid, v.as_float(ref_logp), 0.0))
  per_token = kl_estimate(logp, ref_logp, estimator)
  return aggregation.aggregate(per_token, mask, aggregation_mode, norm_const)


def kl_loss(
  logp: Float[ArrayLike, "B T"],
  ref_logp: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  estimator: str = "k3",
  aggregation_mode: str = "token-mean",
  norm_const: float | None = None,
) -> Float[Array, ""]:
  """The aggregated KL loss term (multiply by β and add to the policy loss)."""
  return aggregation.finalize(
    *kl_loss_terms(
      logp, ref_logp, mask, estimator, aggregation_mode, norm_const
    )
  )


def kl_penalized_rewards(
  token_rewards: Float[ArrayLike, "B T"],
  logp: Float[ArrayLike, "B T"],
  ref_logp: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  coef: float,
  estimator: str = "k1",
) -> Float[Array, "B T"]:
  """r'_t = r_t − β·k(logp_t, ref_logp_t) on valid tokens, 0 on padding.

  The per-token KL reward penalty of PPO-RLHF (Ouyang et al. 2022; Ziegler et
  al. 2019) and REINFORCE++ (Hu 2025). The penalty is a reward, so it carries
  no gradient (stop_gradient). `coef` (β) may be a traced scalar, e.g. from
  an adaptive KL controller.
  """
  v.check_rank("token_rewards", token_rewards, 2)
  v.check_same_shape(
    token_rewards=token_rewards, logp=logp, ref_logp=ref_logp, mask=mask
  )
  if isinstance(coef, (int, float)):  # traced coefficients (adaptive β) pass
    v.check_real("coef", coef, low=0.0)
  valid = v.as_mask("mask", mask)
  logp = jnp.where(valid, v.as_float(logp), 0.0)
  ref_logp = jnp.where(valid, v.as_float(ref_logp), 0.0)
  penalty = jax.lax.stop_gradient(kl_estimate(logp, ref_logp, estimator))
  rewards = v.as_float(token_rewards)
  return jnp.where(valid, rewards - coef * penalty, 0.0)
