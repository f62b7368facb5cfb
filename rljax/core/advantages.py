"""Advantage estimators: group baselines, batch whitening, GAE.

Group estimators take rewards [N] laid out as contiguous groups,
N = n_groups * group_size (all samples of prompt g are rows
g*G ... g*G + G − 1), and return one advantage per sample [N]; broadcast it
over the response tokens (objectives.policy_loss accepts advantages [B]).
Token-level estimators take [B, T] arrays with a validity mask and return 0
at padding. Advantages and returns are targets: they carry no gradient.

A group whose rewards are all equal gets advantage exactly 0 (no NaN, and no
rounding residue from mean() that the std division would blow up).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from rljax.core import _validation as v


def _grouped(rewards: ArrayLike, group_size: int) -> jnp.ndarray:
  return jax.lax.stop_gradient(v.as_float(rewards)).reshape(-1, group_size)


def _centered(groups: jnp.ndarray) -> jnp.ndarray:
  """x − mean over the last axis, exactly 0 for constant rows."""
  centered = groups - groups.mean(axis=-1, keepdims=True)
  constant = groups.max(axis=-1, keepdims=True) == groups.min(
    axis=-1, keepdims=True
  )
  return jnp.where(constant, 0.0, centered)


def _safe_divide(x: jnp.ndarray, y: jnp.ndarray) -> jnp.ndarray:
  nonzero = y > 0
  return jnp.where(nonzero, x / jnp.where(nonzero, y, 1.0), 0.0)


def _check_eps(eps: Any) -> float:
  return v.check_real("eps", eps, low=0.0)


def grpo(
  rewards: Float[ArrayLike, "N"],
  group_size: int,
  eps: float = 1e-6,
  ddof: int = 0,
) -> Float[Array, "N"]:
  """GRPO advantage  Â_i = (r_i − mean_g(r)) / (std_g(r) + eps).

  Shao et al. 2024, DeepSeekMath (GRPO), outcome supervision §4.1.2. std_g is
  the population std of the group (ddof=0, numpy's default); pass ddof=1 for
  the unbiased std that torch.std uses (TRL/verl).
  """
  group_size = v.check_group_size(rewards, group_size)
  eps = _check_eps(eps)
  if ddof not in (0, 1):
    raise ValueError(f"ddof must be 0 or 1; got {ddof!r}.")
  if group_size <= ddof:
    raise ValueError(
      f"group_size={group_size} must exceed ddof={ddof} for a group std."
    )
  centered = _centered(_grouped(rewards, group_size))
  std = jnp.sqrt(
    jnp.sum(jnp.square(centered), axis=-1, keepdims=True) / (group_size - ddof)
  )
  return _safe_divide(centered, std + eps).reshape(-1)


def drgrpo(
  rewards: Float[ArrayLike, "N"], group_size: int
) -> Float[Array, "N"]:
  """Dr. GRPO advantage  Â_i = r_i − mean_g(r)  (no std division).

  Liu et al. 2025, "Understanding R1-Zero-Like Training" (Dr. GRPO): the std
  normaliser biases updates toward too-easy / too-hard prompts.
  """
  group_size = v.check_group_size(rewards, group_size)
  return _centered(_grouped(rewards, group_size)).reshape(-1)


def rloo(rewards: Float[ArrayLike, "N"], group_size: int) -> Float[Array, "N"]:
  """RLOO advantage  Â_i = r_i − 1/(G−1) Σ_{j≠i} r_j = G/(G−1)·(r_i − mean_g(r)).

  Ahmadian et al. 2024, "Back to Basics" (REINFORCE Leave-One-Out). Needs G ≥ 2.
  """
  group_size = v.check_group_size(rewards, group_size, min_size=2)
  centered = _centered(_grouped(rewards, group_size))
  return (group_size / (group_size - 1) * centered).reshape(-1)


def _whiten(x: jnp.ndarray, valid: jnp.ndarray, eps: float) -> jnp.ndarray:
  n = valid.sum().astype(x.dtype)
  xs = jnp.where(valid, x, 0.0)
  mean = _safe_divide(xs.sum(), n)
  big = jnp.finfo(x.dtype).max
  constant = jnp.where(valid, x, -big).max() == jnp.where(valid, x, big).min()
  centered = jnp.where(valid & ~constant, x - mean, 0.0)
  std = jnp.sqrt(_safe_divide(jnp.square(centered).sum(), n))
  return _safe_divide(centered, std + eps)


def reinforce_pp(
  returns: Float[ArrayLike, "*s"],
  mask: Bool[ArrayLike, "*s"] | None = None,
  eps: float = 1e-6,
) -> Float[Array, "*s"]:
  """REINFORCE++ advantage: global batch whitening (Hu et al. 2025, Eq. 10)

    Â_t = (G_t − mean_batch G) / (std_batch G + eps)

  REINFORCE++ (Hu et al. 2025, "REINFORCE++: An Efficient RLHF Algorithm
  with Robustness to Both Prompt and Reward Models") has no per-prompt
  baseline: mean and std are taken over every valid entry of the whole
  (global) batch. The paper whitens token advantages, so pass [B, T] token
  returns (`kl_penalized_returns`, Eq. 8) with their `mask`: every valid
  response token is one sample, and a long response weighs in proportion to
  its length. [N] returns (one per sequence) whiten over sequences instead,
  which is not the paper's estimator when lengths differ. Padding gets 0 and
  is excluded from the statistics.

  Convention: std is the population std (divide by the number of valid
  entries n, ddof=0) and eps is added to the std. verl's `masked_whiten`
  (used by its REINFORCE++ estimators) divides by the unbiased std
  (Bessel's n − 1) with eps inside the square root, (x − μ)·rsqrt(σ²_{n−1} +
  1e-8): its advantages are √((n−1)/n) times these, a difference that
  vanishes for the thousands of tokens of a real batch (0.1% at n = 500).
  """
  v.check_rank("returns", returns, (1, 2))
  eps = _check_eps(eps)
  if mask is None:
    valid = jnp.ones(v.shape_of(returns), bool)
  else:
    v.check_same_shape(returns=returns, mask=mask)
    valid = v.as_mask("mask", mask)
  x = jax.lax.stop_gradient(v.as_float(returns))
  return _whiten(x, valid, eps)


def kl_penalized_returns(
  rewards: Float[ArrayLike, "B"],
  token_kl: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  kl_coef: float,
) -> Float[Array, "B T"]:
  """REINFORCE++ token return with the KL penalty as reward-to-go (Hu et al.
  2025, Eq. 8):

    G_t = r(x, y) − β Σ_{i ≥ t} KL_i        (t, i valid response tokens)

  The per-token reward is r(x, y)·[t = last] − β·KL_t, and with γ = 1 its
  return from token t counts only the KL of token t and the tokens after
  it: the first token carries the whole response's penalty, the last one
  only its own. (Adding the penalty summed over the whole response to every
  token would charge token t for KL it came before.)

  Args:
    rewards: [B] outcome rewards r(x, y) (for REINFORCE++-baseline, already
      centred by the group mean).
    token_kl: [B, T] per-token KL estimates KL_t, e.g. `kl.k1(logp_old,
      ref_logp)`; values at padding are ignored.
    mask: [B, T] valid response tokens.
    kl_coef: β >= 0.

  Returns:
    [B, T] token returns, 0 at padding, no gradient. Whiten them with
    `reinforce_pp(returns, mask)` (Eq. 10).
  """
  v.check_rank("rewards", rewards, 1)
  v.check_rank("token_kl", token_kl, 2)
  v.check_same_shape(token_kl=token_kl, mask=mask)
  batch = v.shape_of(token_kl)[0]
  if v.shape_of(rewards)[0] != batch:
    raise ValueError(
      f"rewards must have one entry per row of token_kl ({batch}); got "
      f"shape {v.shape_of(rewards)}."
    )
  if isinstance(kl_coef, (int, float)):
    kl_coef = v.check_real("kl_coef", kl_coef, low=0.0)
  valid = v.as_mask("mask", mask)
  kl = jax.lax.stop_gradient(jnp.where(valid, v.as_float(token_kl), 0.0))
  r = jax.lax.stop_gradient(v.as_float(rewards))
  # Σ_{i ≥ t}: a reversed cumulative sum along the tokens.
  kl_to_go = jnp.flip(jnp.cumsum(jnp.flip(kl, axis=1), axis=1), axis=1)
  return jnp.where(valid, r[:, None] - kl_coef * kl_to_go, 0.0)


def reinforce_pp_baseline(
  rewards: Float[ArrayLike, "N"],
  group_size: int,
  eps: float = 1e-6,
  valid: Bool[ArrayLike, "N"] | None = None,
  mask: Bool[ArrayLike, "N T"] | None = None,
) -> Float[Array, "N"] | Float[Array, "N T"]:
  """REINFORCE++-baseline: Â = whiten_batch(r_i − mean_g(r)).

  Hu et al. 2025, REINFORCE++-baseline: subtract the per-prompt mean
  (removes the prompt difficulty), then whiten across the whole batch as
  REINFORCE++ does (Eq. 10; avoids GRPO's small-group std).

  With `mask` [N, T] (the paper's estimator) the centred reward is put on
  every valid response token and the mean and std are taken over all valid
  tokens of the batch: returns [N, T], 0 at padding. (For a KL penalty in
  the reward, whiten `kl_penalized_returns(drgrpo(r), KL, mask, β)` with
  `reinforce_pp` instead: equal to this at β = 0.) Without `mask`, each
  sample is one entry: returns [N], whitened over sequences.

  `valid` [N] marks the samples that take part: the batch statistics are
  taken over them only, and the rest get 0. Filler groups (dynamic sampling
  pads a batch with masked-out groups) have centred reward 0; counted in
  the std they would shrink it and inflate every advantage by
  √(N/N_valid). std convention: see `reinforce_pp`.
  """
  group_size = v.check_group_size(rewards, group_size)
  eps = _check_eps(eps)
  centered = _centered(_grouped(rewards, group_size)).reshape(-1)
  if valid is None:
    keep = jnp.ones(centered.shape, bool)
  else:
    v.check_same_shape(rewards=rewards, valid=valid)
    keep = v.as_mask("valid", valid)
  if mask is None:
    return _whiten(centered, keep, eps)
  v.check_rank("mask", mask, 2)
  n = centered.shape[0]
  if v.shape_of(mask)[0] != n:
    raise ValueError(
      f"mask must have one row per reward ({n}); got shape {v.shape_of(mask)}."
    )
  tokens = v.as_mask("mask", mask) & keep[:, None]
  per_token = jnp.broadcast_to(centered[:, None], tokens.shape)
  return _whiten(per_token, tokens, eps)


def _check_lam(lam: Any, batch: int) -> jnp.ndarray:
  if isinstance(lam, (int, float)):
    return jnp.full(
      (batch,), v.check_real("lam", lam, low=0.0, high=1.0), jnp.float32
    )
  lam = v.as_float(lam)
  if lam.ndim == 0:
    return jnp.broadcast_to(lam, (batch,))
  if lam.shape != (batch,):
    raise ValueError(
      f"lam must be a scalar or shape ({batch},) (one λ per sequence); "
      f"got shape {lam.shape}."
    )
  return lam


def _check_gamma(gamma: Any) -> Any:
  if isinstance(gamma, (int, float)):
    return v.check_real("gamma", gamma, low=0.0, high=1.0)
  gamma = v.as_float(gamma)
  if gamma.ndim != 0:
    raise ValueError(f"gamma must be a scalar; got shape {gamma.shape}.")
  return gamma


def _gae_step(carry, xs):
  # Module-level (constants in the carry) so eager calls reuse the compiled scan.
  next_value, next_adv, gamma, gamma_lam = carry
  r_t, v_t, m_t = xs
  delta = r_t + gamma * next_value - v_t
  adv_t = delta + gamma_lam * next_adv
  carry = (
    jnp.where(m_t, v_t, next_value),
    jnp.where(m_t, adv_t, next_adv),
    gamma,
    gamma_lam,
  )
  return carry, jnp.where(m_t, adv_t, 0.0)


def gae(
  rewards: Float[ArrayLike, "B T"],
  values: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  gamma: float,
  lam: float | Float[ArrayLike, "B"],
) -> tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """Generalised advantage estimation over masked token sequences.

  Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE":
    δ_t = r_t + γ V_{t+1} − V_t,     Â_t = δ_t + γ λ Â_{t+1},     G_t = Â_t + V_t
  computed by a reverse `jax.lax.scan`. "t+1" is the next *valid* token:
  masked positions are skipped (they contribute nothing and may sit anywhere,
  e.g. tool output inside a response), and after the last valid token the
  sequence is terminal: V = 0, Â = 0 (bootstrapping stops there).

  Args:
    rewards: [B, T] per-token rewards (outcome reward on the last valid token,
      optionally minus a per-token KL penalty).
    values: [B, T] critic values V(s_t); treated as constants.
    mask: [B, T] validity mask.
    gamma: discount in [0, 1].
    lam: λ in [0, 1], scalar or one per sequence [B] (see `vapo_lambda`).

  Returns:
    (advantages, returns), [B, T], 0 at masked positions, no gradient.
  """
  v.check_rank("rewards", rewards, 2)
  v.check_same_shape(rewards=rewards, values=values, mask=mask)
  batch = v.shape_of(rewards)[0]
  gamma = _check_gamma(gamma)
  lam = _check_lam(lam, batch)
  valid = v.as_mask("mask", mask)
  r = jax.lax.stop_gradient(jnp.where(valid, v.as_float(rewards), 0.0))
  val = jax.lax.stop_gradient(jnp.where(valid, v.as_float(values), 0.0))
  dtype = jnp.result_type(r, val)
  r, val = r.astype(dtype), val.astype(dtype)
  gamma_lam = (gamma * lam).astype(dtype)

  zeros = jnp.zeros((batch,), dtype)
  carry = (zeros, zeros, jnp.asarray(gamma, dtype), gamma_lam)
  _, adv_tb = jax.lax.scan(
    _gae_step, carry, (r.T, val.T, valid.T), reverse=True
  )
  advantages = adv_tb.T
  returns = jnp.where(valid, advantages + val, 0.0)
  return advantages, returns


def discounted_returns(
  rewards: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  gamma: float = 1.0,
) -> Float[Array, "B T"]:
  """Reward-to-go  G_t = Σ_{k≥0} γ^k r_{t+k}  over valid tokens (REINFORCE,
  Williams 1992; REINFORCE++ token returns). Equals GAE with V ≡ 0, λ = 1."""
  v.check_rank("rewards", rewards, 2)
  advantages, _ = gae(rewards, jnp.zeros(v.shape_of(rewards)), mask, gamma, 1.0)
  return advantages


def vcppo_gae(
  rewards: Float[ArrayLike, "B T"],
  values: Float[ArrayLike, "B T"],
  mask: Bool[ArrayLike, "B T"],
  gamma: float = 1.0,
  lam_actor: float | Float[ArrayLike, "B"] = 0.95,
  lam_critic: float | Float[ArrayLike, "B"] = 1.0,
) -> tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """VC-PPO decoupled GAE: policy advantages with λ_actor, value targets with λ_critic.

  Yuan et al. 2025, "What's Behind PPO's Collapse in Long-CoT? Value
  Optimization Holds the Secret" (VC-PPO): λ_critic = 1 gives the critic
  unbiased Monte-Carlo targets G_t = Σ γ^k r_{t+k} (no decay of the terminal
  reward through bootstrapping), while λ_actor < 1 keeps the policy gradient's
  variance down.

  Returns:
    (advantages from λ_actor, returns from λ_critic), [B, T].
  """
  advantages, _ = gae(rewards, values, mask, gamma, lam_actor)
  _, returns = gae(rewards, values, mask, gamma, lam_critic)
  return advantages, returns


def vapo_lambda(
  lengths: Float[ArrayLike, "B"], alpha: float = 0.05
) -> Float[Array, "B"]:
  """VAPO length-adaptive λ  λ_i = 1 − 1/(α·|y_i|), clamped to [0, 1].

  Yue et al. 2025, VAPO: longer responses get λ closer to 1 so the terminal
  reward still reaches early tokens; α = 0.05 in the paper. Responses shorter
  than 1/α (and empty ones) get λ = 0. Feed the result to `gae(..., lam=...)`.
  """
  alpha = v.check_real("alpha", alpha, low=0.0, low_inclusive=False)
  v.check_rank("lengths", lengths, 1)
  lengths = jax.lax.stop_gradient(v.as_float(lengths))
  # 1/(α·0) = inf → −inf → clamped to 0: no NaN for empty responses.
  return jnp.clip(1.0 - 1.0 / (alpha * lengths), 0.0, 1.0)
