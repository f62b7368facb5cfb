"""rljax.core: pure-functional RL math on arrays (no I/O, models or globals).

Modules: `advantages` (GRPO, Dr. GRPO, RLOO, REINFORCE++, GAE, VC-PPO, VAPO),
`objectives` (the policy loss: one surrogate, one off-policy correction and
one aggregation under one config; re-exports its parts), `surrogates`
(REINFORCE, PPO, CISPO, GSPO), `importance` (the ratios and QuRL's
behaviour corrections), `entropy` (policy entropy), `critic` (PPO's
clipped value loss), `kl` (k1/k2/k3 estimators), `aggregation`
(micro-batch-exact loss reduction), `shaping` (DAPO overlong shaping, length
penalty, dynamic-sampling filters), `nll` (VAPO's positive-example NLL),
`exposure` (how much QuRL's ACR can change a batch: its active tokens and
gradient share).
"""

from rljax.core import (
  advantages,
  aggregation,
  exposure,
  kl,
  nll,
  objectives,
  shaping,
)
from rljax.core.advantages import (
  discounted_returns,
  drgrpo,
  gae,
  grpo,
  kl_penalized_returns,
  reinforce_pp,
  reinforce_pp_baseline,
  rloo,
  vapo_lambda,
  vcppo_gae,
)
from rljax.core.aggregation import (
  AGGREGATION_MODES,
  aggregate,
  aggregate_mean,
  finalize,
  masked_mean,
)
from rljax.core.kl import (
  k1,
  k2,
  k3,
  kl_estimate,
  kl_loss,
  kl_loss_terms,
  kl_penalized_rewards,
)
from rljax.core.nll import positive_nll, positive_nll_terms
from rljax.core.objectives import (
  CORRECTIONS,
  SURROGATES,
  ImportanceWeights,
  PolicyLossConfig,
  cispo_objective,
  entropy_from_logits,
  gspo_objective,
  gspo_sequence_log_ratio,
  importance_weights,
  policy_loss,
  policy_loss_per_token,
  policy_loss_terms,
  ppo_clip_objective,
  reinforce_objective,
  token_entropy,
  value_loss,
  value_loss_terms,
)
from rljax.core.shaping import (
  group_keep_mask,
  informative_group_indices,
  length_penalty,
  overlong_filter_mask,
  soft_overlong_punishment,
  zero_variance_groups,
)

__all__ = [
  "advantages",
  "aggregation",
  "kl",
  "nll",
  "objectives",
  "shaping",
  "discounted_returns",
  "drgrpo",
  "gae",
  "grpo",
  "kl_penalized_returns",
  "reinforce_pp",
  "reinforce_pp_baseline",
  "rloo",
  "vapo_lambda",
  "vcppo_gae",
  "positive_nll",
  "positive_nll_terms",
  "AGGREGATION_MODES",
  "aggregate",
  "aggregate_mean",
  "finalize",
  "masked_mean",
  "k1",
  "k2",
  "k3",
  "kl_estimate",
  "kl_loss",
  "kl_loss_terms",
  "kl_penalized_rewards",
  "CORRECTIONS",
  "SURROGATES",
  "ImportanceWeights",
  "PolicyLossConfig",
  "cispo_objective",
  "entropy_from_logits",
  "gspo_objective",
  "gspo_sequence_log_ratio",
  "importance_weights",
  "policy_loss",
  "policy_loss_per_token",
  "policy_loss_terms",
  "ppo_clip_objective",
  "reinforce_objective",
  "token_entropy",
  "value_loss",
  "value_loss_terms",
  "group_keep_mask",
  "informative_group_indices",
  "length_penalty",
  "overlong_filter_mask",
  "soft_overlong_punishment",
  "zero_variance_groups",
]
