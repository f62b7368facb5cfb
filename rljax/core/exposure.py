"""Exposure of the adaptive clipping range: how much ACR can change a batch.

QuRL's ACR (Eq. 9) keeps TIS's weight w = min(ρ, C) and widens only the upper
clip bound of the PPO surrogate, from 1+ε_high to (1+ε_high)·u with
u = 1/r = max(1, ρ/C). It can therefore only differ from TIS on a token with
  ρ > C            (otherwise u = 1: the two bounds coincide),
  A > 0            (the upper bound matters only for a positive advantage),
  1+ε_high < R ≤ (1+ε_high)·u   (TIS clips it, ACR lets its gradient through),
with R = π_θ/π_prox, ρ = π_prox/π_behav. A token meeting all three is
"active". With one update per rollout π_prox = sg(π_θ) at the only gradient
evaluation, so R ≡ 1 and no token is ever active: ACR is TIS there, for every
C. These kernels measure the exposure a study needs before it can attribute
an effect to ACR (an ACR arm that never widened a bound cannot be credited
with its result), and they are computed for every correction: they
say what ACR *would* change in the batch the run actually trained on.

  would_change_fraction  |active| / |valid|
  gradient_share         Σ_active w·R·|A| / Σ_unclipped w·R·|A|: the share of
                         ACR's gradient mass that TIS would have clipped away
                         (∂ℓ_t/∂log π_θ = −w·R·A on a token the clip lets
                         through, 0 on a clipped one; "unclipped" is under
                         ACR's bounds)
  active_given_eligible  P(active | ρ > C, A > 0): how often the widened
                         bound is the one that decides, on the tokens where it
                         is wider (0 when no token is eligible)
  eligible_fraction      |{ρ > C, A > 0}| / |valid|

The definitions are those of the token-level PPO clip (QuRL Eq. 9 is stated
for it); w and u come from `objectives.importance_weights(..., "acr")`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _validation as v
from rljax.core import objectives


class AcrExposure(NamedTuple):
  """Scalar exposure metrics of one batch (float32, stop-gradient)."""

  would_change_fraction: Array
  gradient_share: Array
  active_given_eligible: Array
  eligible_fraction: Array


class _Tokens(NamedTuple):
  valid: jnp.ndarray  # [B, T] bool
  ratio: jnp.ndarray  # R
  adv: jnp.ndarray  # A, broadcast to [B, T]
  weight: jnp.ndarray  # w = min(ρ, C)
  eligible: jnp.ndarray  # ρ > C ∧ A > 0
  active: jnp.ndarray  # eligible ∧ 1+ε_high < R ≤ (1+ε_high)·u
  unclipped: jnp.ndarray  # ACR's clip lets the gradient through


def _tokens(
  logp, prox_logp, behav_logp, advantages, mask, eps_low, eps_high, cap
):
  for name, x in (
    ("logp", logp),
    ("prox_logp", prox_logp),
    ("behav_logp", behav_logp),
  ):
    v.check_rank(name, x, 2)
    v.check_floating(name, x)
  v.check_same_shape(
    logp=logp, prox_logp=prox_logp, behav_logp=behav_logp, mask=mask
  )
  valid = v.as_mask("mask", mask)
  eps_low = v.check_real("eps_low", eps_low, low=0.0, allow_inf=True)
  eps_high = v.check_real("eps_high", eps_high, low=0.0, allow_inf=True)
  cap = v.check_real("cap", cap, low=1.0, allow_inf=True)
  shape = v.shape_of(logp)
  sg = jax.lax.stop_gradient
  adv = sg(
    jnp.where(valid, objectives._broadcast_advantages(advantages, shape), 0.0)
  )
  lp = sg(jnp.where(valid, v.as_float(logp), 0.0))
  prox = sg(jnp.where(valid, v.as_float(prox_logp), 0.0))
  behav = sg(jnp.where(valid, v.as_float(behav_logp), 0.0))
  ratio = objectives.ratio_exp(lp - prox)
  iw = objectives.importance_weights(prox, behav, valid, "acr", cap)
  tis_high = 1.0 + eps_high
  acr_high = tis_high * iw.upper_scale
  eligible = valid & (iw.upper_scale > 1.0) & (adv > 0)
  active = eligible & (ratio > tis_high) & (ratio <= acr_high)
  clipped = ((ratio > acr_high) & (adv > 0)) | (
    (ratio < 1.0 - eps_low) & (adv < 0)
  )
  return _Tokens(
    valid, ratio, adv, iw.weight, eligible, active, valid & ~clipped
  )


def _count(x: jnp.ndarray) -> jnp.ndarray:
  return jnp.sum(x.astype(jnp.float32))


def _ratio(num: jnp.ndarray, den: jnp.ndarray) -> jnp.ndarray:
  # 0 where nothing is counted (an empty batch has no exposure), never NaN.
  return jnp.where(den > 0, num / jnp.maximum(den, 1e-30), 0.0)


def acr_exposure(
  logp: Float[ArrayLike, "B T"],
  prox_logp: Float[ArrayLike, "B T"],
  behav_logp: Float[ArrayLike, "B T"],
  advantages: Float[ArrayLike, "B"] | Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  *,
  eps_low: float,
  eps_high: float,
  cap: float,
) -> AcrExposure:
  """All four exposure metrics of ACR on one batch (module docstring).

  Args:
    logp: [B, T] log π_θ at the gradient evaluation (R = exp(logp − prox)).
    prox_logp: [B, T] log π_prox.
    behav_logp: [B, T] log π_behav of the (quantized) rollout engine.
    advantages: [B] or [B, T].
    mask: [B, T] valid response tokens.
    eps_low, eps_high: the PPO clip (ε_low ∈ [0, 1], ε_high ≥ 0).
    cap: C ≥ 1 (`loss.tis_cap`; inf: ACR never widens, exposure 0).

  Returns:
    `AcrExposure` of float32 scalars, all 0 on an empty mask.
  """
  t = _tokens(
    logp, prox_logp, behav_logp, advantages, mask, eps_low, eps_high, cap
  )
  n_valid = _count(t.valid)
  mass = t.weight * t.ratio * jnp.abs(t.adv)
  return AcrExposure(
    would_change_fraction=_ratio(_count(t.active), n_valid),
    gradient_share=_ratio(
      jnp.sum(jnp.where(t.active, mass, 0.0)),
      jnp.sum(jnp.where(t.unclipped, mass, 0.0)),
    ),
    active_given_eligible=_ratio(_count(t.active), _count(t.eligible)),
    eligible_fraction=_ratio(_count(t.eligible), n_valid),
  )


def acr_would_change_fraction(
  logp, prox_logp, behav_logp, advantages, mask, *, eps_high, cap
) -> Array:
  """|active| / |valid|: tokens with ρ > C, A > 0, 1+ε_high < R ≤ (1+ε_high)·ρ/C
  (QuRL Eq. 9: the tokens TIS clips and ACR does not)."""
  return acr_exposure(
    logp,
    prox_logp,
    behav_logp,
    advantages,
    mask,
    eps_low=0.0,
    eps_high=eps_high,
    cap=cap,
  ).would_change_fraction


def acr_gradient_share(
  logp, prox_logp, behav_logp, advantages, mask, *, eps_low, eps_high, cap
) -> Array:
  """Σ_active w·R·|A| / Σ_unclipped w·R·|A| with w = min(ρ, C): the part of
  ACR's gradient mass (|∂ℓ_t/∂log π_θ| summed over tokens) that TIS would clip
  (QuRL Eq. 9). Below ~1e-3 ACR is not exercised, whatever the outcome."""
  return acr_exposure(
    logp,
    prox_logp,
    behav_logp,
    advantages,
    mask,
    eps_low=eps_low,
    eps_high=eps_high,
    cap=cap,
  ).gradient_share


def acr_active_given_eligible(
  logp, prox_logp, behav_logp, advantages, mask, *, eps_high, cap
) -> Array:
  """P(active | ρ > C, A > 0): the share of the tokens whose ACR bound is wider
  than TIS's on which the widening decides the clip (0 if none is eligible)."""
  return acr_exposure(
    logp,
    prox_logp,
    behav_logp,
    advantages,
    mask,
    eps_low=0.0,
    eps_high=eps_high,
    cap=cap,
  ).active_given_eligible


# Metric names the trainer logs them under (`metrics.jsonl`).
METRIC_NAMES = {
  "would_change_fraction": "acr_would_change_fraction",
  "gradient_share": "acr_grad_share",
  "active_given_eligible": "acr_active_given_eligible",
  "eligible_fraction": "acr_eligible_fraction",
}


def exposure_metrics(exposure: AcrExposure) -> dict[str, Array]:
  """{metric name: value} of an `AcrExposure`, as the trainer logs it."""
  return {METRIC_NAMES[k]: x for k, x in exposure._asdict().items()}
