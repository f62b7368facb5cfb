"""Importance ratios and the behaviour-correction weights for quantized rollout.

The ratios between the policies of an off-policy update, per response token
t of sequence i (design.md "The math"):
  prox_logp  log π_prox(o_t), full-precision θ_old recomputed by the trainer
  behav_logp log π_behav(o_t), the (quantized) rollout engine's log-prob
  ρ = exp(prox_logp − behav_logp), a stop-gradient weight whose log is clamped
  at ±LOG_RATIO_CLAMP,
and the differentiated ratio R = exp(logp − prox_logp) is taken by
`ratio_exp`: exact in value and gradient (see MAX_EXACT_LOG_RATIO).

`importance_weights` turns ρ into the constant weight w_t, the clip scale
and the keep-mask of one correction (QuRL, Eq. 3-9):
  naive            R̂ = exp(logp − behav_logp) replaces R, w = 1          (Eq. 3)
  ignore_behavior  R against prox, w = 1                                 (Eq. 1)
  decoupled        w = ρ                          (Eq. 4; Hilton et al. 2022)
  tis              w = min(ρ, C)                         (Eq. 5; FlashRL)
  acr              w = min(ρ, C), upper clip (1+ε_high)/r, r = min(1, C/ρ) (Eq. 9)
  mis              w = ρ where ρ ≤ C, else the token is dropped (masked importance
                   sampling): it leaves both the loss sum and the denominator,
                   as if it were padding.
  seq_tis, seq_mis, geo_rs: sequence-level corrections, and a per-token veto
                   (any correction).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _tokens
from rljax.core import _validation as v

CORRECTIONS = (
  "naive",
  "ignore_behavior",
  "decoupled",
  "tis",
  "acr",
  "mis",
  "seq_tis",
  "seq_mis",
  "geo_rs",
)
# Corrections whose keep-mask depends on ρ (tokens or sequences are rejected).
REJECTING_CORRECTIONS = ("mis", "seq_mis", "geo_rs")

# The behaviour weight ρ is a stop-gradient constant: clamping its log at ±20
# (e^20 ≈ 4.9e8) changes no gradient and keeps every sum finite in f32.
LOG_RATIO_CLAMP = 20.0
# The differentiated ratios R and s_i are exact, value and gradient, up to
# log-ratio MAX_EXACT_LOG_RATIO (e^30 ≈ 1.1e13: its square, which global-norm
# clipping sums, stays far from f32 overflow) and continue along the tangent
# above it. Clamping them instead would zero ∂R/∂θ past the clamp: PPO's
# gradient for A < 0 tokens with a huge R is not clipped (QuRL §4.2: "the
# large ratios do not get clipped regardless"), and a clamp would silence
# exactly those tokens, the ones the policy over-weights most. To bound them,
# use dual_clip (Ye et al. 2020), which is a decision of the objective rather
# than an accident of the arithmetic.
MAX_EXACT_LOG_RATIO = 30.0


class ImportanceWeights(NamedTuple):
  """Output of `importance_weights`; every field is stop-gradient.

  weight: [B, T] w_t (0 where not kept).
  upper_scale: [B, T] 1/r_t ≥ 1 multiplying the upper clip bound (acr), else 1.
  keep: [B, T] bool, mask minus the tokens (or sequences) the correction rejects.
  """

  weight: Array
  upper_scale: Array
  keep: Array


def clamped_exp(log_ratio: jnp.ndarray) -> jnp.ndarray:
  """exp of a clamped log-ratio: for stop-gradient weights (ρ) and metrics."""
  return jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def ratio_exp(log_ratio: ArrayLike) -> Array:
  """exp(x) for a differentiated log-ratio: exact below MAX_EXACT_LOG_RATIO = K,
  the tangent e^K·(1 + x − K) above it (finite, and ∂/∂x = e^K > 0 there).

  Nothing is clamped below: e^x underflows to 0 gracefully, as its gradient.
  """
  x = v.as_float(log_ratio)
  k = MAX_EXACT_LOG_RATIO
  # Double where: the tangent branch has a constant derivative, so the
  # untaken branch never sends NaN into the gradient.
  return jnp.where(
    x > k, math.exp(k) * (1.0 + (x - k)), jnp.exp(jnp.minimum(x, k))
  )


def importance_weights(
  prox_logp: Float[ArrayLike, "B T"],
  behav_logp: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  correction: str,
  cap: float = 2.0,
  veto_threshold: float | None = None,
) -> ImportanceWeights:
  """Behaviour-correction weight, clip scale and keep-mask (QuRL Eq. 3-9).

  Token level, ρ_t = exp(prox_logp_t − behav_logp_t) (log clamped to
  ±LOG_RATIO_CLAMP):
    naive, ignore_behavior  w = 1
    decoupled               w = ρ                          (QuRL Eq. 4)
    tis                     w = min(ρ, C)          (QuRL Eq. 5, FlashRL)
    acr                     w = min(ρ, C), upper_scale = 1/r = max(1, ρ/C)
                            (QuRL Eq. 9, adaptive clipping range)
    mis                     w = ρ, keep = mask ∧ (ρ ≤ C)

  Sequence level, with log ρ(y_i) = Σ_t log ρ_t over the valid tokens of
  sequence i (the product ratio, in log space so it cannot overflow) and
  n_i = |y_i|; w and keep are the same on every token of i:
    seq_tis   w = min(ρ(y_i), C) = exp(min(log ρ(y_i), log C))
              truncated IS of the whole sequence (Yao et al. 2025, "Your
              Efficient RL Framework Secretly Brings You Off-Policy RL
              Training"; Liu et al. 2025, "When Speed Kills Stability:
              Demystifying RL Collapse from the Training-Inference
              Mismatch"; verl rollout correction, sequence-level IS).
    seq_mis   w = ρ(y_i), keep = mask ∧ (1/C ≤ ρ(y_i) ≤ C)
              sequence-level masked IS: the whole sequence is rejected
              (leaves sum and denominator) when its ratio leaves [1/C, C]
              (Liu et al. 2025; verl, sequence-level rejection sampling).
    geo_rs    w = 1, keep = mask ∧ (1/C ≤ ρ̄_i ≤ C), ρ̄_i = exp(log ρ(y_i) / n_i)
              geometric-mean rejection: the per-token average log-ratio is
              length-independent, so C is a per-token tolerance (verl's
              geometric rejection uses C ≈ 1.001-1.01); no reweighting.
  upper_scale is 1 for every sequence-level correction.

  Veto (any correction): with veto_threshold = τ, a sequence holding a valid
  token with ρ_t < τ is rejected whole, keep_{i,·} = False (Liu et al. 2025;
  verl's rollout_token_veto_threshold): one token the engine sampled that
  the trainer finds nearly impossible means the two disagree on the whole
  continuation after it.
  """
  valid = _tokens.check_tokens(mask, prox_logp=prox_logp, behav_logp=behav_logp)
  v.check_choice("correction", correction, CORRECTIONS)
  cap = v.check_real("cap", cap, low=1.0, allow_inf=True)
  if veto_threshold is not None:
    veto_threshold = v.check_real(
      "veto_threshold", veto_threshold, low=0.0, high=1.0, low_inclusive=False
    )
  log_rho = jax.lax.stop_gradient(
    _tokens.masked(prox_logp, valid) - _tokens.masked(behav_logp, valid)
  )
  rho = clamped_exp(log_rho)
  ones = jnp.ones_like(rho)
  keep = valid
  upper_scale = ones
  log_cap = math.log(cap)  # inf for an infinite cap
  if correction in ("naive", "ignore_behavior"):
    weight = ones
  elif correction == "decoupled":
    weight = rho
  elif correction == "tis":
    weight = jnp.minimum(rho, cap)
  elif correction == "acr":
    weight = jnp.minimum(rho, cap)
    upper_scale = jnp.maximum(1.0, rho / cap)
  elif correction == "mis":
    weight = rho
    keep = valid & (rho <= cap)
  else:  # sequence level: padding holds log ρ = 0, so sums run over valid tokens
    log_seq = log_rho.sum(axis=-1, keepdims=True)
    if correction == "seq_tis":
      weight = clamped_exp(jnp.minimum(log_seq, log_cap)) * ones
    elif correction == "seq_mis":
      weight = clamped_exp(log_seq) * ones
      keep = valid & (jnp.abs(log_seq) <= log_cap)
    else:  # geo_rs
      n = valid.sum(axis=-1, keepdims=True).astype(log_seq.dtype)
      log_geo = log_seq / jnp.maximum(n, 1.0)
      weight = ones
      keep = valid & (jnp.abs(log_geo) <= log_cap)
  if veto_threshold is not None:
    vetoed = jnp.any(
      valid & (log_rho < math.log(veto_threshold)), axis=-1, keepdims=True
    )
    keep = keep & ~vetoed
  weight = jnp.where(keep, weight, 0.0)
  return ImportanceWeights(weight=weight, upper_scale=upper_scale, keep=keep)
