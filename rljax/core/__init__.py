"""rljax.core: pure-functional RL math on arrays (no I/O, models or globals).

Modules: `advantages` (GRPO, Dr. GRPO, RLOO, REINFORCE++, GAE, VC-PPO, VAPO),
`objectives` (surrogates + QuRL off-policy corrections, value loss, entropy),
`kl` (k1/k2/k3 estimators), `aggregation` (micro-batch-exact loss reduction),
`shaping` (DAPO overlong shaping, length penalty, dynamic-sampling filters).
"""

from rljax.core import advantages, aggregation, kl, objectives, shaping
from rljax.core.advantages import (discounted_returns, drgrpo, gae, grpo,
                                   reinforce_pp, reinforce_pp_baseline, rloo,
                                   vapo_lambda, vcppo_gae)
from rljax.core.aggregation import (AGGREGATION_MODES, aggregate, aggregate_mean,
                                    finalize, masked_mean)
from rljax.core.kl import (k1, k2, k3, kl_estimate, kl_loss, kl_loss_terms,
                           kl_penalized_rewards)
from rljax.core.objectives import (CORRECTIONS, SURROGATES, ImportanceWeights,
                                   PolicyLossConfig, cispo_objective,
                                   entropy_from_logits, gspo_objective,
                                   gspo_sequence_log_ratio, importance_weights,
                                   policy_loss, policy_loss_per_token,
                                   policy_loss_terms,
                                   ppo_clip_objective, reinforce_objective,
                                   token_entropy, value_loss, value_loss_terms)
from rljax.core.shaping import (group_keep_mask, informative_group_indices,
                                length_penalty, overlong_filter_mask,
                                soft_overlong_punishment, zero_variance_groups)

__all__ = [
    "advantages", "aggregation", "kl", "objectives", "shaping",
    "discounted_returns", "drgrpo", "gae", "grpo", "reinforce_pp",
    "reinforce_pp_baseline", "rloo", "vapo_lambda", "vcppo_gae",
    "AGGREGATION_MODES", "aggregate", "aggregate_mean", "finalize", "masked_mean",
    "k1", "k2", "k3", "kl_estimate", "kl_loss", "kl_loss_terms",
    "kl_penalized_rewards",
    "CORRECTIONS", "SURROGATES", "ImportanceWeights", "PolicyLossConfig",
    "cispo_objective", "entropy_from_logits", "gspo_objective",
    "gspo_sequence_log_ratio", "importance_weights", "policy_loss",
    "policy_loss_per_token", "policy_loss_terms", "ppo_clip_objective", "reinforce_objective",
    "token_entropy", "value_loss", "value_loss_terms",
    "group_keep_mask", "informative_group_indices", "length_penalty",
    "overlong_filter_mask", "soft_overlong_punishment", "zero_variance_groups",
]
