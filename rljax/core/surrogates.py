"""Per-token policy-gradient surrogates: REINFORCE, PPO's clip, CISPO, GSPO.

Each returns the objective J_t to maximise (no correction weight, no
aggregation: `rljax.core.objectives.policy_loss` assembles those):
  reinforce   A·logp                                   (Williams 1992)
  ppo         min(R·A, clip(R, 1−ε_low, u)·A), optional dual clip
              max(·, c·A) for A < 0 (Schulman et al. 2017; Yu et al. 2025
              DAPO clip-higher; Ye et al. 2020 dual-clip)
  cispo       sg(clip(R, 1−ε_low, u))·A·logp           (MiniMax-M1 2025)
  gspo        s_i = exp(mean_t(logp − prox_logp)), min(s_i·A, clip(s_i)·A) on
              every token of i                         (Zheng et al. 2025)
  gspo_token  s_{i,t} = sg(s_i)·exp(logp − sg(logp)), same clip
where u = (1+ε_high)·upper_scale (QuRL's ACR widens it; 1+ε_high otherwise).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _tokens
from rljax.core import _validation as v
from rljax.core.importance import ratio_exp

SURROGATES = ("reinforce", "ppo", "cispo", "gspo", "gspo_token")
# The surrogates with a min(·) that dual_clip can bound from below.
MIN_FORM_SURROGATES = ("ppo", "gspo", "gspo_token")


def reinforce_objective(
  logp: Float[ArrayLike, "B T"], advantages: Float[ArrayLike, "B T"]
) -> Float[Array, "B T"]:
  """REINFORCE per-token objective A·log π_θ(o_t) (Williams 1992); ∇ = A·∇logp."""
  return jax.lax.stop_gradient(v.as_float(advantages)) * v.as_float(logp)


def ppo_clip_objective(
  ratio: Float[ArrayLike, "*s"],
  advantages: Float[ArrayLike, "*s"],
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  dual_clip: float | None = None,
  upper_scale: Float[ArrayLike, "*s"] | float = 1.0,
) -> Float[Array, "*s"]:
  """Clipped surrogate  min(R·A, clip(R, 1−ε_low, (1+ε_high)·u)·A).

  Schulman et al. 2017 (PPO); decoupled ε_low/ε_high is DAPO's clip-higher
  (Yu et al. 2025); u = upper_scale is QuRL's ACR factor 1/r (Eq. 9). With
  dual_clip = c > 1, tokens with A < 0 get max(that, c·A) (Ye et al. 2020),
  bounding the loss of a very large ratio.

  A < 0 with R > 1+ε: min picks R·A, the unclipped branch, so the gradient
  is A·R·∇logp however large R is (QuRL §4.2: for negative advantages "the
  large ratios do not get clipped regardless"). `policy_loss` keeps that
  gradient exact (R = `ratio_exp`, no clamp), because it is what PPO's
  objective says, and it is the token the policy over-weights most. The
  bound for such tokens is dual_clip, a choice of objective: with it, A < 0
  tokens with R > c have objective c·A and no gradient.
  """
  ratio = v.as_float(ratio)
  adv = jax.lax.stop_gradient(v.as_float(advantages))
  low = 1.0 - eps_low
  high = (1.0 + eps_high) * jax.lax.stop_gradient(upper_scale)
  clipped = jnp.clip(ratio, low, high)
  objective = jnp.minimum(ratio * adv, clipped * adv)
  if dual_clip is not None:
    objective = jnp.where(
      adv < 0, jnp.maximum(objective, dual_clip * adv), objective
    )
  return objective


def cispo_objective(
  logp: Float[ArrayLike, "*s"],
  ratio: Float[ArrayLike, "*s"],
  advantages: Float[ArrayLike, "*s"],
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  upper_scale: Float[ArrayLike, "*s"] | float = 1.0,
) -> Float[Array, "*s"]:
  """CISPO  sg(clip(R, 1−ε_low, (1+ε_high)·u))·A·log π_θ(o_t).

  MiniMax-M1 2025 (CISPO): the importance weight is clipped and detached, so
  every token keeps a gradient (A·clip(R)·∇logp) however far R has moved.
  """
  high = (1.0 + eps_high) * jax.lax.stop_gradient(upper_scale)
  clipped = jax.lax.stop_gradient(
    jnp.clip(v.as_float(ratio), 1.0 - eps_low, high)
  )
  adv = jax.lax.stop_gradient(v.as_float(advantages))
  return clipped * adv * v.as_float(logp)


def gspo_sequence_log_ratio(
  logp: Float[ArrayLike, "B T"],
  old_logp: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
) -> Float[Array, "B"]:
  """log s_i = (1/|y_i|) Σ_t (logp − old_logp) over valid tokens (0 if none).

  Zheng et al. 2025 (GSPO): s_i = (π_θ(y_i)/π_old(y_i))^(1/|y_i|), the
  geometric mean of the token ratios.
  """
  valid = _tokens.check_tokens(mask, logp=logp, old_logp=old_logp)
  diff = _tokens.masked(logp, valid) - _tokens.masked(old_logp, valid)
  n = valid.sum(axis=-1).astype(diff.dtype)
  return diff.sum(axis=-1) / jnp.maximum(n, 1.0)


def gspo_objective(
  logp: Float[ArrayLike, "B T"],
  old_logp: Float[ArrayLike, "B T"],
  advantages: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  dual_clip: float | None = None,
  upper_scale: Float[ArrayLike, "B T"] | float = 1.0,
  token_level: bool = False,
) -> Float[Array, "B T"]:
  """GSPO per-token objective min(s·A, clip(s, 1−ε_low, (1+ε_high)·u)·A).

  Zheng et al. 2025 (GSPO). Sequence form: s = s_i on every token of i, so all
  tokens move together (∇s_i = s_i·mean_t ∇logp_t). Token form (GSPO-token):
  s_{i,t} = sg(s_i)·exp(logp_t − sg(logp_t)), equal in value, with gradient
  sg(s_i)·∇logp_t so per-token advantages are possible. s_i = `ratio_exp`
  (log s_i): exact value and gradient wherever f32 can hold them.
  """
  valid = _tokens.check_tokens(
    mask, logp=logp, old_logp=old_logp, advantages=advantages
  )
  s = ratio_exp(gspo_sequence_log_ratio(logp, old_logp, valid))[:, None]
  if token_level:
    lp = _tokens.masked(logp, valid)
    s = jax.lax.stop_gradient(s) * jnp.exp(lp - jax.lax.stop_gradient(lp))
  s = jnp.broadcast_to(s, v.shape_of(logp))
  return ppo_clip_objective(
    s, advantages, eps_low, eps_high, dual_clip, upper_scale
  )
