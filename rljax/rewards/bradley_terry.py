"""The Bradley–Terry reward model's math: the pair loss and accuracy, and the
reward r(x, y) read from a value head at the last real token.

Bradley & Terry (1952) model the probability that a response y_c is preferred
to y_r for a prompt x as

    P(y_c ≻ y_r | x) = σ(r(x, y_c) − r(x, y_r)),

and the reward model r is fit by maximum likelihood on (x, chosen, rejected)
pairs (Ouyang et al. 2022, "Training language models to follow instructions
with human feedback", eq. 1):

    L = −E log σ(r(x, y_c) − r(x, y_r)).

r(x, y) is the critic's value head (`rljax.models.value`) read at the last
real token of prompt + response: the same machinery as PPO's critic, so a
trained reward model can also initialise one.
"""

from __future__ import annotations

import functools
from typing import Any

import chex
import jax
import jax.numpy as jnp

from rljax import models


def bradley_terry_loss(
  r_chosen: chex.Array, r_rejected: chex.Array
) -> chex.Array:
  """Mean negative log-likelihood of the preferences, −log σ(r_c − r_r).

  Computed as softplus(r_r − r_c), which is exact and does not overflow for
  large margins. Bradley & Terry 1952; Ouyang et al. 2022, eq. 1.

  Args:
    r_chosen: [B] rewards of the preferred responses.
    r_rejected: [B] rewards of the other responses.

  Returns:
    Scalar float32 loss.
  """
  chex.assert_rank([r_chosen, r_rejected], 1)
  chex.assert_equal_shape([r_chosen, r_rejected])
  margin = r_chosen.astype(jnp.float32) - r_rejected.astype(jnp.float32)
  return jnp.mean(jax.nn.softplus(-margin))


def pair_accuracy(r_chosen: chex.Array, r_rejected: chex.Array) -> chex.Array:
  """Fraction of pairs ranked right: mean 1[r_c > r_r], a tie counting ½
  (an untrained model with equal scores is at chance, 0.5, not 0)."""
  chex.assert_rank([r_chosen, r_rejected], 1)
  chex.assert_equal_shape([r_chosen, r_rejected])
  wins = (r_chosen > r_rejected).astype(jnp.float32)
  ties = (r_chosen == r_rejected).astype(jnp.float32)
  return jnp.mean(wins + 0.5 * ties)


def last_token_index(attention_mask: chex.Array) -> chex.Array:
  """[B] index of each row's last real token (left or right padding)."""
  chex.assert_rank(attention_mask, 2)
  t = attention_mask.shape[1]
  return t - 1 - jnp.argmax(attention_mask[:, ::-1] > 0, axis=1)


def sequence_rewards(
  config: models.ModelConfig,
  params: dict[str, Any],
  tokens: chex.Array,
  attention_mask: chex.Array,
) -> chex.Array:
  """r(x, y) [B] float32: the value head at each row's last real token.

  Args:
    config: the backbone's architecture.
    params: {"backbone": decoder params, "head": value head}.
    tokens: int [B, T], prompt then response, padded.
    attention_mask: [B, T], 1 = real token.
  """
  chex.assert_rank([tokens, attention_mask], 2)
  chex.assert_equal_shape([tokens, attention_mask])
  values = models.value_forward(
    config, params["backbone"], params["head"], tokens, attention_mask
  )
  last = last_token_index(attention_mask)
  return jnp.take_along_axis(values, last[:, None], axis=1)[:, 0]


def init_reward_model(
  config: models.ModelConfig,
  backbone_params,
  rng: jax.Array,
  init_scale: float = 0.0,
) -> dict[str, Any]:
  """{"backbone": copy of `backbone_params`, "head": value head}.

  The critic's initialisation (`models.init_critic`): a zero head scores
  every response 0, so training starts at chance (accuracy 0.5, loss log 2).
  """
  return models.init_critic(config, backbone_params, rng, init_scale)


@functools.partial(jax.jit, static_argnums=(0,))
def score_batch(config, params, tokens, mask):
  """`sequence_rewards` compiled once per config and shape: the scoring call
  shared by held-out evaluation and the batched reward."""
  return sequence_rewards(config, params, tokens, mask)
