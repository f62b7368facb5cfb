"""The policy loss: one surrogate, one off-policy correction, one aggregation.

`policy_loss` (and its micro-batch form `policy_loss_terms`) assembles the
per-token surrogate (`rljax.core.surrogates`), the behaviour-correction
weight and keep-mask (`rljax.core.importance`) and the reduction
(`rljax.core.aggregation`) under one static `PolicyLossConfig`, and reports
the clip, correction and KL metrics. The building blocks, the entropy and
the value loss are re-exported here, so `rljax.core.objectives.X` names
every piece of the objective.

Notation (per response token t of sequence i; design.md "The math"):
  logp       log π_θ(o_t), current parameters, differentiated
  prox_logp  log π_prox(o_t), full-precision θ_old recomputed by the trainer
  behav_logp log π_behav(o_t), the (quantized) rollout engine's log-prob
  R = exp(logp − prox_logp),   ρ = exp(prox_logp − behav_logp).
R is differentiated: exact in value and gradient (`ratio_exp`); ρ is a
stop-gradient weight, its log clamped at ±LOG_RATIO_CLAMP.

Per-token objective J_t = w_t · surrogate_t (maximised; loss = −J), where the
correction gives the constant weight w_t (stop-gradient) and the clip bounds
(QuRL, Eq. 3-9; the table is in `rljax.core.importance`), and the surrogate
is one of SURROGATES (the table is in `rljax.core.surrogates`).

Definitions where a combination is not in the papers:
  * reinforce has no ratio: every correction only sets w (acr behaves as tis).
  * gspo with acr: the sequence ratio s_i is clipped at token t with token t's
    bound (1+ε_high)/r_t, and weighted with token t's min(ρ_t, C); with ρ ≤ C
    everywhere it is exactly gspo with tis.
  * gspo with mis: dropped tokens are also left out of the mean that defines
    s_i (they are treated as padding throughout).
  * dual_clip applies to the min-form surrogates (ppo, gspo, gspo_token);
    asking for it with reinforce or cispo raises at config construction.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _tokens
from rljax.core import _validation as v
from rljax.core import aggregation
from rljax.core import kl
from rljax.core.entropy import entropy_from_logits, token_entropy
from rljax.core.importance import (
  CORRECTIONS,
  LOG_RATIO_CLAMP,
  MAX_EXACT_LOG_RATIO,
  REJECTING_CORRECTIONS,
  ImportanceWeights,
  clamped_exp,
  importance_weights,
  ratio_exp,
)
from rljax.core.surrogates import (
  MIN_FORM_SURROGATES,
  SURROGATES,
  cispo_objective,
  gspo_objective,
  gspo_sequence_log_ratio,
  ppo_clip_objective,
  reinforce_objective,
)
from rljax.core.critic import value_loss, value_loss_terms

__all__ = [
  "CORRECTIONS",
  "LOG_RATIO_CLAMP",
  "MAX_EXACT_LOG_RATIO",
  "REJECTING_CORRECTIONS",
  "SURROGATES",
  "ImportanceWeights",
  "PolicyLossConfig",
  "cispo_objective",
  "entropy_from_logits",
  "gspo_objective",
  "gspo_sequence_log_ratio",
  "importance_weights",
  "policy_loss",
  "policy_loss_denominator",
  "policy_loss_keep",
  "policy_loss_per_token",
  "policy_loss_terms",
  "ppo_clip_objective",
  "ratio_exp",
  "reinforce_objective",
  "token_entropy",
  "value_loss",
  "value_loss_terms",
]


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Static configuration of `policy_loss` (hashable: usable as a jit static arg).

  Attributes:
    surrogate: one of SURROGATES.
    correction: one of CORRECTIONS (QuRL's adaptive clipping range is "acr").
    eps_low: lower clip 1 − eps_low, >= 0 (inf allowed: no lower clip).
    eps_high: upper clip 1 + eps_high, >= 0 (inf allowed); eps_high > eps_low
      is DAPO's clip-higher.
    dual_clip: c > 1 bounds the objective of A < 0 tokens below by c·A
      (dual-clip PPO); None disables. Only for ppo/gspo/gspo_token.
    tis_cap: C >= 1 (inf allowed) for tis/acr/mis and the sequence-level
      corrections (see `importance_weights`). C < 1 would down-weight even
      on-policy tokens (ρ = 1).
    veto_threshold: τ in (0, 1], or None: reject every sequence holding a
      token with ρ < τ, whatever the correction (see `importance_weights`).
    aggregation: one of aggregation.AGGREGATION_MODES.
    norm_const: divisor of "seq-mean-token-sum-norm" (None: padded length T).
    positive_nll_coef: μ >= 0 of VAPO's positive-example NLL (`nll`); not
      part of `policy_loss` (it needs the rewards): the trainer adds it.
  """

  surrogate: str = "ppo"
  correction: str = "acr"
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: float | None = None
  tis_cap: float = 2.0
  aggregation: str = "token-mean"
  norm_const: float | None = None
  veto_threshold: float | None = None
  # VAPO's positive-example NLL weight μ (`rljax.core.nll`); 0 = off. The
  # term needs the rewards, so the trainer adds it (train/update.py).
  positive_nll_coef: float = 0.0

  def __post_init__(self):
    v.check_choice("surrogate", self.surrogate, SURROGATES)
    v.check_choice("correction", self.correction, CORRECTIONS)
    v.check_choice(
      "aggregation", self.aggregation, aggregation.AGGREGATION_MODES
    )
    # Normalise numbers to float so equal configs hash equal (0.2 vs 0.2).
    set_ = lambda k, x: object.__setattr__(self, k, x)
    set_(
      "eps_low", v.check_real("eps_low", self.eps_low, low=0.0, allow_inf=True)
    )
    set_(
      "eps_high",
      v.check_real("eps_high", self.eps_high, low=0.0, allow_inf=True),
    )
    set_(
      "tis_cap", v.check_real("tis_cap", self.tis_cap, low=1.0, allow_inf=True)
    )
    if self.dual_clip is not None:
      set_(
        "dual_clip",
        v.check_real(
          "dual_clip",
          self.dual_clip,
          low=1.0,
          low_inclusive=False,
          allow_inf=True,
        ),
      )
      if self.surrogate not in MIN_FORM_SURROGATES:
        raise ValueError(
          f"dual_clip={self.dual_clip} needs a min-form surrogate "
          f"({', '.join(MIN_FORM_SURROGATES)}); surrogate={self.surrogate!r} "
          f"has no min to bound. Set dual_clip=None."
        )
    set_("norm_const", aggregation.check_norm_const(self.norm_const))
    set_(
      "positive_nll_coef",
      v.check_real("positive_nll_coef", self.positive_nll_coef, low=0.0),
    )
    if self.veto_threshold is not None:
      set_(
        "veto_threshold",
        v.check_real(
          "veto_threshold",
          self.veto_threshold,
          low=0.0,
          high=1.0,
          low_inclusive=False,
        ),
      )

  @property
  def rejects(self) -> bool:
    """Whether the keep-mask depends on ρ (not only on the mask)."""
    return (
      self.correction in REJECTING_CORRECTIONS
      or self.veto_threshold is not None
    )


def _broadcast_advantages(
  advantages: ArrayLike, shape: tuple[int, int]
) -> jnp.ndarray:
  v.check_rank("advantages", advantages, (1, 2))
  v.check_floating("advantages", advantages)
  adv_shape = v.shape_of(advantages)
  if len(adv_shape) == 1:
    if adv_shape[0] != shape[0]:
      raise ValueError(
        f"advantages has shape {adv_shape}; expected ({shape[0]},) "
        f"(one per sequence) or {shape} (one per token) to match logp."
      )
    return jnp.broadcast_to(v.as_float(advantages)[:, None], shape)
  if adv_shape != shape:
    raise ValueError(
      f"advantages has shape {adv_shape}; expected ({shape[0]},) or "
      f"{shape} to match logp."
    )
  return v.as_float(advantages)


def policy_loss_keep(
  prox_logp: Float[ArrayLike, "B T"],
  behav_logp: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  config: PolicyLossConfig,
) -> Bool[Array, "B T"]:
  """The keep-mask `policy_loss_per_token` aggregates over, from ρ and the
  mask alone (no current log-probs needed): mask minus what the correction
  (and the veto) reject."""
  return importance_weights(
    prox_logp,
    behav_logp,
    mask,
    config.correction,
    config.tis_cap,
    config.veto_threshold,
  ).keep


def policy_loss_denominator(
  prox_logp: Float[ArrayLike, "B T"],
  behav_logp: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  config: PolicyLossConfig,
) -> Float[Array, ""]:
  """The denominator `policy_loss_terms` returns, computed before any forward
  pass: an update step splitting a minibatch into micro-batches sums it over
  them first, then divides each micro-batch's sum by the total."""
  keep = policy_loss_keep(prox_logp, behav_logp, mask, config)
  _, denominator = aggregation.aggregate(
    jnp.zeros(keep.shape, jnp.float32),
    keep,
    config.aggregation,
    config.norm_const,
  )
  return denominator


def policy_loss_per_token(
  logp: Float[ArrayLike, "B T"],
  prox_logp: Float[ArrayLike, "B T"],
  behav_logp: Float[ArrayLike, "B T"],
  advantages: Float[ArrayLike, "B"] | Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  config: PolicyLossConfig,
  *,
  logits: Float[ArrayLike, "B T V"] | None = None,
) -> tuple[Float[Array, "B T"], Bool[Array, "B T"], dict[str, Array]]:
  """(per-token loss ℓ_t = −w_t·surrogate_t, keep-mask, metrics).

  The building block of `policy_loss_terms`; see the module docstring for the
  surrogates and corrections. ℓ_t is 0 where keep is False (padding, and the
  tokens a rejecting correction drops); aggregate it over `keep`, not over
  `mask` (`policy_loss_keep` gives it from ρ alone).

  Metrics (stop-gradient f32 scalars; fractions over valid tokens, the clip
  ones over kept tokens):
    clip_fraction_low / _high: the clip is active on the side that matters for
      sign(A): for min-form surrogates R < 1−ε_low with A < 0 / R > upper with
      A > 0 (the token gets no gradient); for cispo the weight is clipped
      (either sign of A). clip_fraction is their sum. 0 for reinforce.
    dual_clip_fraction: A < 0 tokens bounded by c·A.
    ratio_mean: mean of the ratio inside the clip (R, R̂ or s_i).
    behav_prox_kl: KL(π_behav‖π_prox) on behaviour samples (QuRL Fig. 3a),
      estimated by the mean of k3 = ρ − log ρ − 1 (Schulman 2020): unbiased
      like k1 and, unlike it, never negative, so a plotted curve cannot dip
      below 0 from sampling noise.
    behav_prox_log_ratio_mean: mean(behav_logp − prox_logp), the k1 estimate
      of the same KL (unbiased, noisy, can be negative).
    max_prox_behav_ratio: max ρ (clamped at e^20; 0 if no valid token).
    tis_truncated_fraction: fraction with ρ > C (whatever the correction).
    acr_active_fraction: fraction of kept tokens whose outcome ACR's enlarged
      upper bound changes against plain TIS: 1+ε_high < R ≤ (1+ε_high)·u
      (with A > 0 for min-form surrogates), i.e. TIS would clip them and ACR
      lets their gradient through: how often ACR's bound binds. 0 for every
      correction but acr, and for reinforce (QuRL Eq. 9).
    mis_masked_fraction: fraction of valid tokens rejected (mis, seq_mis,
      geo_rs, the veto; 0 otherwise).
    weight_mean: mean correction weight w over kept tokens.
    entropy: masked mean entropy, only when `logits` [B, T, V] is given.
  """
  if not isinstance(config, PolicyLossConfig):
    raise TypeError(
      f"config must be a PolicyLossConfig; got {type(config).__name__}."
    )
  valid = _tokens.check_tokens(
    mask, logp=logp, prox_logp=prox_logp, behav_logp=behav_logp
  )
  shape = v.shape_of(logp)
  adv = jax.lax.stop_gradient(
    jnp.where(valid, _broadcast_advantages(advantages, shape), 0.0)
  )
  lp = _tokens.masked(logp, valid)
  prox = jax.lax.stop_gradient(_tokens.masked(prox_logp, valid))
  behav = jax.lax.stop_gradient(_tokens.masked(behav_logp, valid))

  iw = importance_weights(
    prox, behav, valid, config.correction, config.tis_cap, config.veto_threshold
  )
  keep = iw.keep
  old = behav if config.correction == "naive" else prox
  high = (1.0 + config.eps_high) * iw.upper_scale
  low = 1.0 - config.eps_low

  surrogate = config.surrogate
  if surrogate == "reinforce":
    objective = reinforce_objective(lp, adv)
    ratio = ratio_exp(lp - old)
  elif surrogate == "ppo":
    ratio = ratio_exp(lp - old)
    objective = ppo_clip_objective(
      ratio,
      adv,
      config.eps_low,
      config.eps_high,
      config.dual_clip,
      iw.upper_scale,
    )
  elif surrogate == "cispo":
    ratio = ratio_exp(lp - old)
    objective = cispo_objective(
      lp, ratio, adv, config.eps_low, config.eps_high, iw.upper_scale
    )
  else:  # gspo, gspo_token
    objective = gspo_objective(
      lp,
      old,
      adv,
      keep,
      config.eps_low,
      config.eps_high,
      config.dual_clip,
      iw.upper_scale,
      token_level=surrogate == "gspo_token",
    )
    log_s = gspo_sequence_log_ratio(lp, old, keep)
    ratio = jnp.broadcast_to(ratio_exp(log_s)[:, None], shape)
  per_token_loss = jnp.where(keep, -iw.weight * objective, 0.0)

  r = jax.lax.stop_gradient(ratio)
  if surrogate == "reinforce":
    clipped_low = clipped_high = jnp.zeros(shape, bool)
  elif surrogate == "cispo":
    clipped_low, clipped_high = r < low, r > high
  else:
    clipped_low, clipped_high = (r < low) & (adv < 0), (r > high) & (adv > 0)
  # Where ACR's bound (1+ε_high)·u is what keeps the token unclipped: plain
  # TIS (u = 1) would have clipped it.
  if surrogate == "reinforce":
    acr_active = jnp.zeros(shape, bool)
  else:
    acr_active = (r > 1.0 + config.eps_high) & (r <= high)
    if surrogate != "cispo":
      acr_active = acr_active & (adv > 0)
  if config.dual_clip is not None:
    dual = (adv < 0) & (r > config.dual_clip)
  else:
    dual = jnp.zeros(shape, bool)
  rho = clamped_exp(prox - behav)
  metrics = {
    "clip_fraction_low": _tokens.fraction(clipped_low, keep),
    "clip_fraction_high": _tokens.fraction(clipped_high, keep),
    "dual_clip_fraction": _tokens.fraction(dual, keep),
    "ratio_mean": aggregation.masked_mean(r, keep),
    "behav_prox_kl": aggregation.masked_mean(kl.k3(behav, prox), valid),
    "behav_prox_log_ratio_mean": aggregation.masked_mean(behav - prox, valid),
    "max_prox_behav_ratio": jnp.max(jnp.where(valid, rho, 0.0), initial=0.0),
    "tis_truncated_fraction": _tokens.fraction(rho > config.tis_cap, valid),
    "acr_active_fraction": _tokens.fraction(acr_active, keep),
    "mis_masked_fraction": _tokens.fraction(valid & ~keep, valid),
    "weight_mean": aggregation.masked_mean(iw.weight, keep),
  }
  metrics["clip_fraction"] = (
    metrics["clip_fraction_low"] + metrics["clip_fraction_high"]
  )
  if logits is not None:
    metrics["entropy"] = entropy_from_logits(logits, valid)
  metrics = jax.tree_util.tree_map(
    lambda x: jax.lax.stop_gradient(x.astype(jnp.float32)), metrics
  )
  return per_token_loss, keep, metrics


def policy_loss_terms(
  logp: Float[ArrayLike, "B T"],
  prox_logp: Float[ArrayLike, "B T"],
  behav_logp: Float[ArrayLike, "B T"],
  advantages: Float[ArrayLike, "B"] | Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  config: PolicyLossConfig,
  *,
  logits: Float[ArrayLike, "B T V"] | None = None,
) -> tuple[Float[Array, ""], Float[Array, ""], dict[str, Array]]:
  """(sum, denominator, metrics) of the policy loss of one micro-batch.

  aggregation.aggregate(ℓ, keep, config.aggregation, config.norm_const) of
  `policy_loss_per_token` (whose docstring lists the metrics). Sum the first
  two outputs over micro-batches (split along B) and call
  `aggregation.finalize` once: that is exactly the full-batch loss.
  """
  per_token_loss, keep, metrics = policy_loss_per_token(
    logp, prox_logp, behav_logp, advantages, mask, config, logits=logits
  )
  total, denominator = aggregation.aggregate(
    per_token_loss, keep, config.aggregation, config.norm_const
  )
  return total, denominator, metrics


def policy_loss(
  logp: Float[ArrayLike, "B T"],
  prox_logp: Float[ArrayLike, "B T"],
  behav_logp: Float[ArrayLike, "B T"],
  advantages: Float[ArrayLike, "B"] | Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  config: PolicyLossConfig,
  *,
  logits: Float[ArrayLike, "B T V"] | None = None,
) -> tuple[Float[Array, ""], dict[str, Array]]:
  """Scalar policy loss to minimise and its metrics (contract API).

  loss = finalize(policy_loss_terms(...)): see `policy_loss_terms` and the
  module docstring for the surrogates (REINFORCE, PPO, CISPO, GSPO) and the
  QuRL corrections (naive Eq. 3, decoupled Eq. 4, TIS Eq. 5, ACR Eq. 9, MIS).
  An empty mask gives loss 0 and zero gradient.
  """
  total, denominator, metrics = policy_loss_terms(
    logp, prox_logp, behav_logp, advantages, mask, config, logits=logits
  )
  return aggregation.finalize(total, denominator), metrics
