"""Every algorithm preset on one hand-worked batch: what each flag computes.

The batch: 2 prompts × 2 samples (group_size 2), responses of 3, 2, 3 and 1
tokens (max_new_tokens 3), outcome rewards r = [1, 0, .5, 0]. The policy is
on-policy and equal to the reference: log π = log π_old = log π_behav =
log π_ref = −1 on every token (so every ratio is 1 and every KL term 0), and
the critic says V = .5 everywhere. For each preset the test pins the token
advantages `build_batch` gives the update step (rows = responses, columns
= response tokens, padding 0) and the policy loss of `core.objectives` on
them (plus VAPO's NLL term); the comments work each one out.

At ratio 1 the PPO-family objective of a token is A and the loss is
−aggregate(A); REINFORCE's and CISPO's objective is A·log π = −A, so their
loss is +aggregate(A). The aggregations differ: "token-mean" divides by the
9 tokens, "seq-mean-token-mean" averages each response's mean (0 whenever
each group's advantages sum to 0), "seq-mean-token-sum-norm" divides each
response's sum by 3 (Dr. GRPO).
"""

import numpy as np
import jax.numpy as jnp
import pytest

from rljax.core import nll, objectives
from rljax.rollout.base import RolloutBatch
from rljax.train import build_batch as build_batch_lib
from rljax.train.config import ALGORITHMS, apply_preset

REWARDS = np.array([1.0, 0.0, 0.5, 0.0], np.float32)
LENGTHS = [3, 2, 3, 1]
T = 3  # max_new_tokens
VALID = np.array([[t < n for t in range(T)] for n in LENGTHS])

a1 = 0.5 / (0.5 + 1e-6)  # GRPO: group 1 [1, 0], mean .5, std .5
a2 = 0.25 / (0.25 + 1e-6)  # group 2 [.5, 0], mean .25, std .25


def _tokens(*rows):
  """[4, 3] from per-response token lists (padding 0)."""
  out = np.zeros((4, T))
  for i, row in enumerate(rows):
    out[i, : len(row)] = row
  return out


def _per_seq(values):
  """One advantage per response, on each of its tokens."""
  return np.where(VALID, np.asarray(values, np.float64)[:, None], 0.0)


# REINFORCE++ (Eq. 8 with β·KL = 0, then Eq. 10): token returns = r on the
# 9 tokens [1,1,1, 0,0, .5,.5,.5, 0]; mean 4.5/9 = .5; deviations ±.5 on the
# 6 tokens of responses 0, 1, 3 and 0 on response 2: var 1.5/9 = 1/6.
_S_PP = np.sqrt(1 / 6) + 1e-6
# REINFORCE++-baseline: centred [.5, −.5, .25, −.25] on 3, 2, 3, 1 tokens:
# sum 1.5 − 1 + .75 − .25 = 1, mean 1/9; Σ(x − 1/9)² = 3(.5 − 1/9)² +
# 2(.5 + 1/9)² + 3(.25 − 1/9)² + (.25 + 1/9)² = 25/18, var 25/162.
_M_PPB, _S_PPB = 1 / 9, np.sqrt(25 / 162) + 1e-6

CASES = {
  # drgrpo baseline r − mean_g: [.5, −.5, .25, −.25]; REINFORCE (A·log π,
  # TIS weight 1), seq-mean-token-mean: the response means cancel → 0.
  "reinforce": (_per_seq([0.5, -0.5, 0.25, -0.25]), 0.0),
  # GAE γ = 1, λ = .95, V = .5: δ = r − .5 on the last token, 0 before it,
  # so A_t = .95^(last − t)·(r − .5): [.45125, .475, .5], [−.475, −.5],
  # 0, [−.5]. token-mean: −(1.42625 − .975 − .5)/9 = .04875/9.
  "ppo": (
    _tokens([0.45125, 0.475, 0.5], [-0.475, -0.5], [0, 0, 0], [-0.5]),
    0.04875 / 9,
  ),
  # z-scores ±a1, ±a2; seq-mean-token-mean cancels per group → 0.
  "grpo": (_per_seq([a1, -a1, a2, -a2]), 0.0),
  # r − mean_g, seq-mean-token-sum-norm (÷ 3): sums 1.5, −1, .75, −.25 →
  # [.5, −1/3, .25, −1/12], mean 1/12 → loss −1/12.
  "drgrpo": (_per_seq([0.5, -0.5, 0.25, -0.25]), -1 / 12),
  # Leave-one-out: G/(G−1)·(r − mean_g) = [1, −1, .5, −.5]; token-mean
  # −(3 − 2 + 1.5 − .5)/9 = −2/9.
  "rloo": (_per_seq([1.0, -1.0, 0.5, -0.5]), -2 / 9),
  # Token whitening: ±.5/std on responses 0, 1, 3, 0 on response 2. A
  # whitened token-mean is 0, so is its loss. (Whitened per sequence
  # instead, the mistake this pins down, [1, 0, .5, 0] would give
  # [1.508, −.905, .302, −.905].)
  "reinforce_pp": (
    _per_seq([0.5 / _S_PP, -0.5 / _S_PP, 0.0, -0.5 / _S_PP]),
    0.0,
  ),
  # Overlong shaping, L_max = 3, L_cache = 3 // 5 → 1: length 3 gets −1
  # (ramp (2 − 3)/1), so r' = [0, 0, −.5, 0]. Group 1 constant → 0; group 2
  # [−.5, 0] → [−a2, a2]. token-mean −(−3a2 + a2)/9 = 2a2/9.
  "dapo": (_per_seq([0.0, 0.0, -a2, a2]), 2 * a2 / 9),
  # GRPO z-scores, CISPO objective clip(1)·A·log π = −A, token-mean:
  # +(3a1 − 2a1 + 3a2 − a2)/9 = (a1 + 2a2)/9.
  "cispo": (_per_seq([a1, -a1, a2, -a2]), (a1 + 2 * a2) / 9),
  # GRPO z-scores, sequence ratio 1, seq-mean-token-mean → 0.
  "gspo": (_per_seq([a1, -a1, a2, -a2]), 0.0),
  # Length-adaptive λ = 1 − 1/(.05·|y|) < 0 → 0 for |y| ≤ 20: A_t = δ_t,
  # r − .5 on the last token only. token-mean −(.5 − .5 − .5)/9 = .5/9;
  # + μ·NLL: responses 0 and 2 have r > 0, their 6 tokens log π = −1 →
  # NLL 1, μ = .1 → +.1.
  "vapo": (
    _tokens([0, 0, 0.5], [0, -0.5], [0, 0, 0], [-0.5]),
    0.5 / 9 + 0.1,
  ),
  # λ = γ = 1: A_t = r − V = r − .5 on every token; token-mean
  # −(1.5 − 1 + 0 − .5)/9 = 0.
  "orz": (_per_seq([0.5, -0.5, 0.0, -0.5]), 0.0),
  # r − mean_g, token-mean, TIS: −(1.5 − 1 + .75 − .25)/9 = −1/9.
  "olmo3": (_per_seq([0.5, -0.5, 0.25, -0.25]), -1 / 9),
}


def _packed():
  rb = RolloutBatch(
    prompt_ids=[[5, 6], [7]],
    response_ids=[list(range(1, n + 1)) for n in LENGTHS],
    behav_logp=[np.full(n, -1.0, np.float32) for n in LENGTHS],
    finish_reason=["stop"] * 4,
    n=2,
  )
  return build_batch_lib.pack(rb, pad_id=0, response_len=T)


def _run(algorithm, **extra):
  cfg = apply_preset(
    algorithm,
    {
      "rollout.group_size": 2,
      "rollout.prompts_per_step": 2,
      "rollout.max_new_tokens": T,
      **extra,
    },
  )
  packed = _packed()
  shape = packed["response_mask"].shape
  minus_one = jnp.full(shape, -1.0)
  batch, _ = build_batch_lib.build_batch(
    cfg,
    packed,
    np.ones(4, bool),
    REWARDS,
    prox_logp=minus_one,
    ref_logp=minus_one,
    values=jnp.full(shape, 0.5),
  )
  adv = np.asarray(batch["advantages"])
  mask = batch["loss_mask"]
  loss, _ = objectives.policy_loss(
    minus_one, minus_one, minus_one, batch["advantages"], mask, cfg.loss
  )
  if cfg.loss.positive_nll_coef > 0:
    loss = loss + cfg.loss.positive_nll_coef * nll.positive_nll(
      minus_one, mask, batch["rewards"]
    )
  return cfg, batch, adv[:, -T:], float(loss)


def test_every_algorithm_has_a_worked_example():
  assert set(CASES) == set(ALGORITHMS)


@pytest.mark.parametrize("algorithm", sorted(CASES))
def test_advantages_and_loss_by_hand(algorithm):
  want_adv, want_loss = CASES[algorithm]
  cfg, batch, adv, loss = _run(algorithm)
  np.testing.assert_array_equal(np.asarray(batch["loss_mask"])[:, -T:], VALID)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
  if cfg.uses_critic:
    # The critic's targets: r on every token when λ_critic = 1 (VAPO,
    # ORZ: Monte-Carlo), A + V under PPO's λ = .95.
    returns = np.asarray(batch["returns"])[:, -T:]
    if cfg.critic.gae_lambda == 1.0:
      want = _per_seq(REWARDS)
    else:
      want = np.where(VALID, want_adv + 0.5, 0.0)
    np.testing.assert_allclose(returns, want, rtol=1e-5, atol=1e-6)


def test_reinforce_pp_baseline_estimator():
  # Centred rewards whitened over the 9 tokens (see _M_PPB, _S_PPB).
  _, _, adv, loss = _run(
    "reinforce_pp", **{"advantage.estimator": "reinforce_pp_baseline"}
  )
  want = _per_seq([0.5, -0.5, 0.25, -0.25])
  want = np.where(VALID, (want - _M_PPB) / _S_PPB, 0.0)
  np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(loss, 0.0, atol=1e-6)


def test_reinforce_pp_kl_penalty_is_reward_to_go():
  # β = .5, k1 = log π_old − log π_ref: log π_old = −1, log π_ref = −1.2 on
  # every token → KL_t = .2. Response 0 (r = 1, 3 tokens): returns
  # 1 − .5·.2·[3, 2, 1] = [.7, .8, .9]; response 1 (r = 0, 2 tokens):
  # [−.2, −.1]; response 2 (r = .5): [.2, .3, .4]; response 3: [−.1].
  # (The old code charged every token the whole response's KL: 0.7 on all
  # three tokens of response 0.)
  cfg = apply_preset(
    "reinforce_pp",
    {
      "rollout.group_size": 2,
      "rollout.prompts_per_step": 2,
      "rollout.max_new_tokens": T,
      "kl.in_reward_coef": 0.5,
      "kl.estimator": "k1",
    },
  )
  packed = _packed()
  shape = packed["response_mask"].shape
  batch, _ = build_batch_lib.build_batch(
    cfg,
    packed,
    np.ones(4, bool),
    REWARDS,
    prox_logp=jnp.full(shape, -1.0),
    ref_logp=jnp.full(shape, -1.2),
  )
  returns = _tokens([0.7, 0.8, 0.9], [-0.2, -0.1], [0.2, 0.3, 0.4], [-0.1])
  x = returns[VALID]
  want = np.where(VALID, (returns - x.mean()) / (x.std() + 1e-6), 0.0)
  np.testing.assert_allclose(
    np.asarray(batch["advantages"])[:, -T:], want, rtol=1e-5, atol=1e-6
  )


def test_vapo_and_orz_presets_turn_on_their_parts():
  vapo = apply_preset("vapo")
  assert vapo.uses_critic and vapo.critic.pretrain_steps == 50
  assert vapo.critic.gae_lambda == 1.0 and vapo.advantage.vapo_alpha == 0.05
  assert (vapo.loss.eps_low, vapo.loss.eps_high) == (0.2, 0.28)
  assert vapo.loss.aggregation == "token-mean"
  assert vapo.loss.positive_nll_coef == 0.1
  assert vapo.rollout.group_size > 1  # group sampling
  orz = apply_preset("orz")
  assert orz.uses_critic and not orz.uses_reference  # no KL at all
  assert orz.advantage.gamma == orz.advantage.gae_lambda == 1.0
  assert orz.critic.gae_lambda == 1.0 and orz.critic.pretrain_steps == 0
  assert orz.loss.surrogate == "ppo" and orz.rollout.group_size > 1
