"""Policy-gradient surrogates with off-policy corrections for quantized rollout.

Notation (per response token t of sequence i; design.md "The math"):
  logp       log π_θ(o_t), current parameters, differentiated
  prox_logp  log π_prox(o_t), full-precision θ_old recomputed by the trainer
  behav_logp log π_behav(o_t), the (quantized) rollout engine's log-prob
  R = exp(logp − prox_logp),   ρ = exp(prox_logp − behav_logp).
R is differentiated: exact in value and gradient (see MAX_EXACT_LOG_RATIO);
ρ is a stop-gradient weight, its log clamped at ±LOG_RATIO_CLAMP.

Per-token objective J_t = w_t · surrogate_t (maximised; loss = −J), where the
correction gives the constant weight w_t (stop-gradient) and the clip bounds
(QuRL, Eq. 3-9):
  naive            R̂ = exp(logp − behav_logp) replaces R, w = 1          (Eq. 3)
  ignore_behavior  R against prox, w = 1                                 (Eq. 1)
  decoupled        w = ρ                          (Eq. 4; Hilton et al. 2022)
  tis              w = min(ρ, C)                         (Eq. 5; FlashRL)
  acr              w = min(ρ, C), upper clip (1+ε_high)/r, r = min(1, C/ρ) (Eq. 9)
  mis              w = ρ where ρ ≤ C, else the token is dropped (masked importance
                   sampling): it leaves both the loss sum and the denominator,
                   as if it were padding.
  seq_tis, seq_mis, geo_rs: sequence-level corrections, and a per-token veto
                   (any correction); see `importance_weights`.

Surrogates:
  reinforce   A·logp                                   (Williams 1992)
  ppo         min(R·A, clip(R, 1−ε_low, u)·A), optional dual clip
              max(·, c·A) for A < 0 (Schulman et al. 2017; Yu et al. 2025
              DAPO clip-higher; Ye et al. 2020 dual-clip)
  cispo       sg(clip(R, 1−ε_low, u))·A·logp           (MiniMax-M1 2025)
  gspo        s_i = exp(mean_t(logp − prox_logp)), min(s_i·A, clip(s_i)·A) on
              every token of i                         (Zheng et al. 2025)
  gspo_token  s_{i,t} = sg(s_i)·exp(logp − sg(logp)), same clip
where u = (1+ε_high)·(1/r) for acr and 1+ε_high otherwise.

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
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _validation as v
from rljax.core import aggregation
from rljax.core import kl

SURROGATES = ("reinforce", "ppo", "cispo", "gspo", "gspo_token")
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
_MIN_FORM_SURROGATES = ("ppo", "gspo", "gspo_token")

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
      if self.surrogate not in _MIN_FORM_SURROGATES:
        raise ValueError(
          f"dual_clip={self.dual_clip} needs a min-form surrogate "
          f"({', '.join(_MIN_FORM_SURROGATES)}); surrogate={self.surrogate!r} "
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


class ImportanceWeights(NamedTuple):
  """Output of `importance_weights`; every field is stop-gradient.

  weight: [B, T] w_t (0 where not kept).
  upper_scale: [B, T] 1/r_t ≥ 1 multiplying the upper clip bound (acr), else 1.
  keep: [B, T] bool, mask minus the tokens (or sequences) the correction rejects.
  """

  weight: Array
  upper_scale: Array
  keep: Array


def _clamped_exp(log_ratio: jnp.ndarray) -> jnp.ndarray:
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


def _check_tokens(mask, **arrays) -> jnp.ndarray:
  for name, x in arrays.items():
    v.check_rank(name, x, 2)
    v.check_floating(name, x)
  v.check_same_shape(**arrays, mask=mask)
  return v.as_mask("mask", mask)


def _masked(x: ArrayLike, valid: jnp.ndarray) -> jnp.ndarray:
  # Zero padding before any arithmetic: -inf/NaN there must not reach grads.
  return jnp.where(valid, v.as_float(x), 0.0)


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
  valid = _check_tokens(mask, prox_logp=prox_logp, behav_logp=behav_logp)
  v.check_choice("correction", correction, CORRECTIONS)
  cap = v.check_real("cap", cap, low=1.0, allow_inf=True)
  if veto_threshold is not None:
    veto_threshold = v.check_real(
      "veto_threshold", veto_threshold, low=0.0, high=1.0, low_inclusive=False
    )
  log_rho = jax.lax.stop_gradient(
    _masked(prox_logp, valid) - _masked(behav_logp, valid)
  )
  rho = _clamped_exp(log_rho)
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
      weight = _clamped_exp(jnp.minimum(log_seq, log_cap)) * ones
    elif correction == "seq_mis":
      weight = _clamped_exp(log_seq) * ones
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
  valid = _check_tokens(mask, logp=logp, old_logp=old_logp)
  diff = _masked(logp, valid) - _masked(old_logp, valid)
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
  valid = _check_tokens(
    mask, logp=logp, old_logp=old_logp, advantages=advantages
  )
  s = ratio_exp(gspo_sequence_log_ratio(logp, old_logp, valid))[:, None]
  if token_level:
    lp = _masked(logp, valid)
    s = jax.lax.stop_gradient(s) * jnp.exp(lp - jax.lax.stop_gradient(lp))
  s = jnp.broadcast_to(s, v.shape_of(logp))
  return ppo_clip_objective(
    s, advantages, eps_low, eps_high, dual_clip, upper_scale
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


def token_entropy(logits: Float[ArrayLike, "B T V"]) -> Float[Array, "B T"]:
  """H_t = −Σ_v p_v log p_v of p = softmax(logits), per token.

  The policy entropy monitored (and optionally maximised as a bonus) in policy
  gradient methods (Williams & Peng 1991; Mnih et al. 2016, A3C).
  """
  v.check_rank("logits", logits, 3)
  v.check_floating("logits", logits)
  log_probs = jax.nn.log_softmax(v.as_float(logits), axis=-1)
  # 0·(−inf) is NaN (and so is its gradient): masked-out vocabulary entries
  # (−inf logits) contribute 0, through a double where.
  finite = jnp.isfinite(log_probs)
  safe = jnp.where(finite, log_probs, 0.0)
  return -jnp.sum(jnp.where(finite, jnp.exp(safe) * safe, 0.0), axis=-1)


def entropy_from_logits(
  logits: Float[ArrayLike, "B T V"], mask: Bool[ArrayLike, "B T"]
) -> Float[Array, ""]:
  """Masked token-mean policy entropy (the entropy metric / bonus term)."""
  v.check_rank("mask", mask, 2)
  if v.shape_of(logits)[:2] != v.shape_of(mask):
    raise ValueError(
      f"logits has shape {v.shape_of(logits)} but mask has shape "
      f"{v.shape_of(mask)}; expected logits [B, T, V] with mask [B, T]."
    )
  return aggregation.masked_mean(token_entropy(logits), mask)


def _fraction(indicator: jnp.ndarray, valid: jnp.ndarray) -> jnp.ndarray:
  return aggregation.masked_mean(indicator.astype(jnp.float32), valid)


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
      lets their gradient through. 0 for every correction but acr, and for
      reinforce (QuRL Eq. 9; the issue's "how often does the bound bind").
    mis_masked_fraction: fraction of valid tokens rejected (mis, seq_mis,
      geo_rs, the veto; 0 otherwise).
    weight_mean: mean correction weight w over kept tokens.
    entropy: masked mean entropy, only when `logits` [B, T, V] is given.
  """
  if not isinstance(config, PolicyLossConfig):
    raise TypeError(
      f"config must be a PolicyLossConfig; got {type(config).__name__}."
    )
  valid = _check_tokens(
    mask, logp=logp, prox_logp=prox_logp, behav_logp=behav_logp
  )
  shape = v.shape_of(logp)
  adv = jax.lax.stop_gradient(
    jnp.where(valid, _broadcast_advantages(advantages, shape), 0.0)
  )
  lp = _masked(logp, valid)
  prox = jax.lax.stop_gradient(_masked(prox_logp, valid))
  behav = jax.lax.stop_gradient(_masked(behav_logp, valid))

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
  rho = _clamped_exp(prox - behav)
  metrics = {
    "clip_fraction_low": _fraction(clipped_low, keep),
    "clip_fraction_high": _fraction(clipped_high, keep),
    "dual_clip_fraction": _fraction(dual, keep),
    "ratio_mean": aggregation.masked_mean(r, keep),
    "behav_prox_kl": aggregation.masked_mean(kl.k3(behav, prox), valid),
    "behav_prox_log_ratio_mean": aggregation.masked_mean(behav - prox, valid),
    "max_prox_behav_ratio": jnp.max(jnp.where(valid, rho, 0.0), initial=0.0),
    "tis_truncated_fraction": _fraction(rho > config.tis_cap, valid),
    "acr_active_fraction": _fraction(acr_active, keep),
    "mis_masked_fraction": _fraction(valid & ~keep, valid),
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


def value_loss_terms(
  values: Float[ArrayLike, "B T"],
  old_values: Float[ArrayLike, "B T"],
  returns: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  clip_eps: float | None = 0.2,
  aggregation_mode: str = "token-mean",
  norm_const: float | None = None,
) -> tuple[Float[Array, ""], Float[Array, ""], dict[str, Array]]:
  """(sum, denominator, metrics) of the PPO clipped value loss.

  Schulman et al. 2017 (PPO, as in OpenAI baselines):
    ℓ_t = ½ max((V − G)², (clip(V, V_old − ε, V_old + ε) − G)²),
  or ½ (V − G)² when clip_eps is None. Returns G and V_old are constants.
  Metrics: value_clip_fraction (the clipped branch is the max), value_error.
  """
  valid = _check_tokens(
    mask, values=values, old_values=old_values, returns=returns
  )
  if clip_eps is not None:
    clip_eps = v.check_real("clip_eps", clip_eps, low=0.0, low_inclusive=False)
  vals = _masked(values, valid)
  old = jax.lax.stop_gradient(_masked(old_values, valid))
  target = jax.lax.stop_gradient(_masked(returns, valid))
  unclipped = jnp.square(vals - target)
  if clip_eps is None:
    per_token = 0.5 * unclipped
    clipped_active = jnp.zeros(v.shape_of(values), bool)
  else:
    clipped = jnp.square(
      old + jnp.clip(vals - old, -clip_eps, clip_eps) - target
    )
    per_token = 0.5 * jnp.maximum(unclipped, clipped)
    clipped_active = clipped > unclipped
  total, denominator = aggregation.aggregate(
    per_token, valid, aggregation_mode, norm_const
  )
  metrics = {
    "value_clip_fraction": _fraction(clipped_active, valid),
    "value_error": aggregation.masked_mean(
      jax.lax.stop_gradient(unclipped), valid
    ),
  }
  return total, denominator, metrics


def value_loss(
  values: Float[ArrayLike, "B T"],
  old_values: Float[ArrayLike, "B T"],
  returns: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  clip_eps: float | None = 0.2,
  aggregation_mode: str = "token-mean",
  norm_const: float | None = None,
) -> tuple[Float[Array, ""], dict[str, Array]]:
  """PPO clipped value loss (scalar) and metrics; see `value_loss_terms`."""
  total, denominator, metrics = value_loss_terms(
    values, old_values, returns, mask, clip_eps, aggregation_mode, norm_const
  )
  return aggregation.finalize(total, denominator), metrics
