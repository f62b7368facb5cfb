"""From a collected rollout to the arrays the update step trains on.

`build_batch` is the pure part: given the packed rollout, its rewards and
the model's outputs on it (log π of the proximal and reference policies, the
critic's values), it computes the loss mask, the shaped rewards and the
advantages (group/batch baselines, or GAE with returns for a critic) with
`rljax.core`'s functions. `make_batch` runs those model calls and then
`build_batch`; it is the trainer's one batch phase.

Multi-turn trajectories (`RolloutBatch.action_mask`): one response row holds
model turns and the environment's observation tokens between them. The
loss mask is the response mask times the action mask, so every quantity the
update step reads through it (the policy loss and its corrections, the KL
and entropy terms, the token counts of every aggregation, the critic's
value loss) counts model tokens only; observation tokens are context, never
targets. The advantage of an observation position is 0. The sequence
estimators score the whole trajectory (one outcome reward per row, plus its
per-turn rewards) and put the advantage on its model tokens. GAE and
REINFORCE++ run over model tokens only, skipping observation positions as
if they were cut out: the "next state" of a turn's last model token is the
next turn's first model token (the observation in between is part of that
state), so V at an observation position is never read and γ, λ discount per
model token. Without an action mask nothing changes (bit-identical batches).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rljax import models
from rljax.core import advantages as adv_lib
from rljax.core import kl as kl_lib
from rljax.core import shaping
from rljax.rollout.base import RolloutBatch
from rljax.train import batch as batch_lib
from rljax.train.collect import Collected
from rljax.train.config import TrainConfig


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7))
def sequence_logprobs(
  config,
  params,
  tokens,
  attention_mask,
  temperature,
  chunk_size,
  activation_dtype=None,
  start=0,
):
  """log π_θ(y_t | ...) [B, T-1] of a packed batch (no entropy); columns
  before `start` are 0, as in the update step's own pass
  (`UpdateSpec.logprob_start`)."""
  return models.token_logprobs(
    config,
    params,
    tokens,
    attention_mask=attention_mask,
    temperature=temperature,
    chunk_size=chunk_size,
    activation_dtype=activation_dtype,
    start=start,
  )[0]


@functools.partial(jax.jit, static_argnums=(0, 4))
def sequence_values(
  config, critic_params, tokens, attention_mask, activation_dtype=None
):
  """The critic's V(s_t) [B, T-1] of a packed batch."""
  return models.value_forward(
    config,
    critic_params["backbone"],
    critic_params["head"],
    tokens,
    attention_mask,
    activation_dtype=activation_dtype,
  )[:, :-1]


def pack(rb: RolloutBatch, pad_id: int, response_len: int) -> dict:
  """The rollout as padded arrays, prompts padded to `batch.prompt_width` so
  that jit compiles are reused across steps."""
  return rb.pack(
    pad_id=pad_id,
    prompt_len=batch_lib.prompt_width(max(len(p) for p in rb.prompt_ids)),
    response_len=response_len,
  )


def loss_mask(cfg: TrainConfig, packed: dict, valid: np.ndarray) -> np.ndarray:
  """float [B, T-1]: response tokens of valid sequences, model tokens only
  when the rollout has an action mask; without truncated responses under
  DAPO's overlong filter."""
  mask = packed["response_mask"] * valid[:, None]
  if "action_mask" in packed:  # observation tokens are never trained on
    mask = mask * packed["action_mask"]
  if cfg.advantage.overlong_filter:
    mask = np.asarray(
      shaping.overlong_filter_mask(
        jnp.asarray(packed["truncated"]), jnp.asarray(mask) > 0
      ),
      np.float32,
    )
  return mask


def needs_prox(cfg: TrainConfig, prox_is_current: bool) -> bool:
  """Whether the batch needs log π_θold: the loss reads it (several updates
  per step), or the KL reward penalty does."""
  return (not prox_is_current) or cfg.kl.in_reward_coef > 0


# Token-level estimators (Hu et al. 2025), not one number per sequence.
REINFORCE_PP = ("reinforce_pp", "reinforce_pp_baseline")


def model_lengths(packed: dict) -> np.ndarray:
  """int [B]: model tokens per response (the response length without an
  action mask)."""
  if "action_mask" not in packed:
    return packed["response_lengths"]
  model = packed["response_mask"] * packed["action_mask"]
  return model.sum(axis=1).astype(np.int32)


def outcome_advantages(
  cfg: TrainConfig,
  shaped: np.ndarray,
  valid: np.ndarray,
  mask: np.ndarray,
  prox_logp: jax.Array | None,
  ref_logp: jax.Array | None,
  turn_rewards: np.ndarray | None = None,
) -> jax.Array:
  """[B, T-1]: the sequence advantage on every loss-mask token.

  REINFORCE++ and REINFORCE++-baseline are token-level estimators
  (`reinforce_pp_advantages`). For the group estimators a KL reward penalty
  is sequence-level: the summed per-token −β·k_t joins the outcome reward
  before the baseline, and so do a trajectory's per-turn rewards
  (`turn_rewards` [B, T-1], laid out by `RolloutBatch.pack`): its return
  is r + Σ_k r_k (γ = 1).
  """
  if cfg.advantage.estimator in REINFORCE_PP:
    return reinforce_pp_advantages(
      cfg, shaped, mask, prox_logp, ref_logp, turn_rewards
    )
  if turn_rewards is not None:
    shaped = shaped + turn_rewards.sum(axis=1)
  if cfg.kl.in_reward_coef > 0:
    penalized = kl_lib.kl_penalized_rewards(
      jnp.zeros(np.shape(mask), jnp.float32),
      prox_logp,
      ref_logp,
      jnp.asarray(mask) > 0,
      cfg.kl.in_reward_coef,
      cfg.kl.estimator,
    )  # −β·k_t on valid tokens
    shaped = shaped + np.asarray(penalized.sum(axis=1))
  seq_adv = batch_lib.sequence_advantages(cfg, shaped, valid)
  return jnp.asarray(seq_adv[:, None] * mask, jnp.float32)


def reinforce_pp_advantages(
  cfg: TrainConfig,
  shaped: np.ndarray,
  mask: np.ndarray,
  prox_logp: jax.Array | None,
  ref_logp: jax.Array | None,
  turn_rewards: np.ndarray | None = None,
) -> jax.Array:
  """[B, T-1]: REINFORCE++ as Hu et al. 2025 define it.

  The return of token t is the outcome reward (REINFORCE++-baseline: minus
  its group's mean) minus β times the KL of token t and every later token
  (Eq. 8, `kl_penalized_returns`, with KL_t = k(log π_θold, log π_ref)),
  whitened over every valid response token of the batch (Eq. 10,
  `reinforce_pp`). The loss mask already excludes dynamic-sampling filler
  and observation tokens, so the statistics are those of the kept samples'
  model tokens.

  Per-turn rewards r_k (`turn_rewards`, at the last model token of turn k)
  are rewards-to-go like the KL: G_t also holds Σ_{k ≥ t} r_k, so a turn's
  reward credits its own and the earlier turns' tokens, not the later ones.
  REINFORCE++-baseline centres the trajectory's whole return r + Σ_k r_k by
  its group's mean (G_t at the first token is then Dr.GRPO's advantage of
  the trajectory return).
  """
  valid = jnp.asarray(mask) > 0
  rewards = jnp.asarray(shaped, jnp.float32)
  turn_total = None
  if turn_rewards is not None:
    turn_total = jnp.asarray(turn_rewards.sum(axis=1), jnp.float32)
  if cfg.advantage.estimator == "reinforce_pp_baseline":
    if turn_total is None:
      rewards = adv_lib.drgrpo(rewards, cfg.rollout.group_size)
    else:
      rewards = (
        adv_lib.drgrpo(rewards + turn_total, cfg.rollout.group_size)
        - turn_total
      )
  token_kl = jnp.zeros(valid.shape, jnp.float32)
  if cfg.kl.in_reward_coef > 0:
    token_kl = kl_lib.kl_estimate(
      jnp.where(valid, prox_logp, 0.0),
      jnp.where(valid, ref_logp, 0.0),
      cfg.kl.estimator,
    )
  returns = adv_lib.kl_penalized_returns(
    rewards, token_kl, valid, cfg.kl.in_reward_coef
  )
  if turn_rewards is not None:  # + Σ_{k ≥ t} r_k (γ = 1, as the KL's)
    returns = returns + jnp.where(
      valid, adv_lib.discounted_returns(turn_rewards, valid, 1.0), 0.0
    )
  return adv_lib.reinforce_pp(returns, valid).astype(jnp.float32)


def gae_advantages(
  cfg: TrainConfig,
  shaped: np.ndarray,
  mask: np.ndarray,
  response_lengths: np.ndarray,
  values: jax.Array,
  prox_logp: jax.Array | None,
  ref_logp: jax.Array | None,
  turn_rewards: np.ndarray | None = None,
) -> dict[str, jax.Array]:
  """Advantages and returns of a critic (VC-PPO's decoupled-λ GAE).

  The outcome reward sits on the last loss-mask token (a trajectory's last
  model token); per-turn rewards (`turn_rewards` [B, T-1]) at their own
  tokens; KL to the reference is a per-token penalty (Ouyang et al. 2022);
  VAPO makes the actor's λ length-adaptive (`response_lengths`: the model
  tokens of a trajectory). `adv_lib.gae` skips positions outside the mask,
  so observation tokens are neither actions nor states of the recursion.
  """
  mask_j = jnp.asarray(mask, jnp.float32)
  valid = np.asarray(mask) > 0
  has_tokens = valid.any(axis=1)
  ends = valid.shape[1] - 1 - np.argmax(valid[:, ::-1], axis=1)
  token_rewards = np.zeros(valid.shape, np.float32)
  token_rewards[np.arange(len(ends)), ends] = np.where(has_tokens, shaped, 0.0)
  if turn_rewards is not None:
    token_rewards = token_rewards + turn_rewards
  token_rewards = jnp.asarray(token_rewards)
  if cfg.kl.in_reward_coef > 0:
    token_rewards = kl_lib.kl_penalized_rewards(
      token_rewards,
      prox_logp,
      ref_logp,
      mask_j > 0,
      cfg.kl.in_reward_coef,
      cfg.kl.estimator,
    )
  actor_lam = cfg.advantage.gae_lambda
  if cfg.advantage.vapo_alpha > 0:
    actor_lam = adv_lib.vapo_lambda(
      jnp.asarray(response_lengths), cfg.advantage.vapo_alpha
    )
  adv, returns = adv_lib.vcppo_gae(
    token_rewards,
    values,
    mask_j > 0,
    cfg.advantage.gamma,
    actor_lam,
    cfg.critic.gae_lambda,
  )
  return {"advantages": adv * mask_j, "old_values": values, "returns": returns}


def build_batch(
  cfg: TrainConfig,
  packed: dict,
  valid: np.ndarray,
  rewards: np.ndarray,
  *,
  prox_logp: jax.Array | None = None,
  ref_logp: jax.Array | None = None,
  values: jax.Array | None = None,
) -> tuple[dict[str, jax.Array], dict[str, float]]:
  """The update step's batch and its metrics, from a packed rollout.

  Args:
    cfg: the run's config (advantage estimator, shaping, KL penalty).
    packed: `RolloutBatch.pack`'s arrays (see `pack`); a trajectory batch's
      `action_mask` and `turn_rewards` (module docstring) are read when
      present.
    valid: bool [B], the sequences that take part (dynamic-sampling filler
      is masked out).
    rewards: [B] outcome rewards (of a trajectory: its final reward; the
      per-turn rewards come in `packed`).
    prox_logp: log π_θold [B, T-1]; None when the loss uses the current θ
      (one update per step) and no KL reward penalty needs it.
    ref_logp: log π_ref [B, T-1] when `cfg.uses_reference`.
    values: the critic's values [B, T-1] when `cfg.uses_critic`.

  Returns:
    ({tokens, attention_mask, loss_mask, behav_logp, prox_logp, [ref_logp],
    advantages, [old_values, returns]}, metrics).
  """
  mask = loss_mask(cfg, packed, valid)
  # DAPO's overlong shaping reads the whole response: its budget is the
  # context the trajectory fills, observations included.
  shaped = batch_lib.shaped_rewards(cfg, rewards, packed["response_lengths"])
  # Per-turn rewards at their logp columns (`RolloutBatch.pack`), or None.
  turns = packed.get("turn_rewards")
  out = {
    "tokens": jnp.asarray(packed["tokens"]),
    "attention_mask": jnp.asarray(packed["attention_mask"]),
    "loss_mask": jnp.asarray(mask, jnp.float32),
    "behav_logp": jnp.asarray(packed["behav_logp"]),
  }
  # Unused when None: the loss's prox is then the current θ.
  out["prox_logp"] = out["behav_logp"] if prox_logp is None else prox_logp
  if cfg.uses_reference:
    out["ref_logp"] = ref_logp
  if cfg.uses_critic:
    out.update(
      gae_advantages(
        cfg,
        shaped,
        mask,
        model_lengths(packed),
        values,
        out["prox_logp"],
        ref_logp,
        turns,
      )
    )
  else:
    out["advantages"] = outcome_advantages(
      cfg, shaped, valid, mask, out["prox_logp"], ref_logp, turns
    )
  if cfg.loss.positive_nll_coef > 0:  # VAPO's NLL reads r > 0 (update.py)
    out["rewards"] = jnp.asarray(np.where(valid, rewards, 0.0), jnp.float32)
  adv = np.asarray(out["advantages"])[np.asarray(mask) > 0]
  lengths = packed["response_lengths"]
  model_tokens = model_lengths(packed)
  metrics = dict(
    advantage_mean=float(adv.mean()) if adv.size else 0.0,
    advantage_std=float(adv.std()) if adv.size else 0.0,
    advantage_abs_max=float(np.abs(adv).max()) if adv.size else 0.0,
    response_length_mean=float(lengths.mean()),
    response_length_max=float(lengths.max()),
    # A trajectory's length is the policy's tokens plus the environment's.
    response_model_tokens_mean=float(model_tokens.mean()),
    response_obs_tokens_mean=float((lengths - model_tokens).mean()),
    truncated_fraction=float(packed["truncated"].mean()),
    valid_fraction=float(valid.mean()),
  )
  return out, metrics


def _same(tree):
  return tree


def make_batch(
  cfg: TrainConfig,
  spec: Any,
  rollout: Collected,
  pad_id: int,
  policy_params: Callable[[], Any],
  ref_params: Any = None,
  critic_params: Any = None,
  placement: Any = None,
) -> tuple[dict[str, jax.Array], dict[str, float]]:
  """`build_batch` of a collected rollout, with the model calls it needs.

  Args:
    cfg: the run's config.
    spec: the update step's `UpdateSpec` (model config, whether θ_prox is
      the current θ).
    rollout: the step's `Collected` rollout.
    pad_id: the tokenizer's pad id.
    policy_params: () -> θ_old, called only if log π_θold is needed (with
      LoRA it merges the adapters).
    ref_params: the reference policy (KL), when `cfg.uses_reference`.
    critic_params: the critic, when `cfg.uses_critic`.
    placement: the run's `placement.Placement`: the model calls run on its
      mesh (tokens sharded over the batch, outputs gathered); None = one
      device.

  Returns:
    (batch, metrics); the metrics include `time_logprobs`.
  """
  model_config = spec.model_config
  packed = pack(rollout.batch, pad_id, cfg.rollout.max_new_tokens)
  tokens = jnp.asarray(packed["tokens"])
  attn = jnp.asarray(packed["attention_mask"])
  chunk = cfg.update.logprob_chunk or None
  act = spec.activation_dtype  # as the update step's forward (precision.md)
  # prox/ref hold 0 where the update step's logp does (prompt columns), so
  # every ratio and KL there is exactly 1 and 0 before the mask.
  start = spec.logprob_start(tokens.shape[1])
  put, gather = (
    (placement.put_batch, placement.gather) if placement else (_same, _same)
  )
  tokens, attn = put((tokens, attn))
  t0 = time.perf_counter()
  prox = ref = values = None
  if needs_prox(cfg, spec.prox_is_current):
    prox = gather(
      sequence_logprobs(
        model_config,
        policy_params(),
        tokens,
        attn,
        cfg.rollout.temperature,
        chunk,
        act,
        start,
      )
    )
  if cfg.uses_reference:
    ref = gather(
      sequence_logprobs(
        model_config,
        ref_params,
        tokens,
        attn,
        cfg.rollout.temperature,
        chunk,
        act,
        start,
      )
    )
  if cfg.uses_critic:
    values = gather(
      sequence_values(model_config, critic_params, tokens, attn, act)
    )
  out, metrics = build_batch(
    cfg,
    packed,
    rollout.valid,
    rollout.rewards,
    prox_logp=prox,
    ref_logp=ref,
    values=values,
  )
  jax.block_until_ready(out["prox_logp"])
  return out, {"time_logprobs": time.perf_counter() - t0, **metrics}
