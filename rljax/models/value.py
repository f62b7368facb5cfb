"""Scalar value head for PPO-style critics (GAE, VC-PPO, VAPO).

V(s_t) = h_t · w + b on the decoder's final hidden states. A critic is either
a head on the policy's own backbone (shared) or a separate backbone
initialized from the policy's params (`init_critic`), as in VC-PPO/VAPO.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from rljax.models import decoder
from rljax.models.config import ModelConfig


def init_value_head(
  config: ModelConfig,
  rng: PRNGKeyArray,
  dtype=jnp.float32,
  init_scale: float = 0.0,
) -> dict[str, jax.Array]:
  """{"kernel": [D, 1], "bias": [1]}.

  The default `init_scale=0` starts every value at 0 (no spurious baseline
  before the critic has learned anything); `init_scale>0` draws the kernel
  from N(0, (init_scale / sqrt(D))²).
  """
  if init_scale < 0:
    raise ValueError(f"init_scale={init_scale!r}; expected >= 0")
  d = config.hidden_size
  kernel = (init_scale / jnp.sqrt(d)) * jax.random.normal(
    rng, (d, 1), jnp.float32
  )
  return {"kernel": kernel.astype(dtype), "bias": jnp.zeros((1,), dtype)}


def init_critic(
  config: ModelConfig, policy_params, rng: PRNGKeyArray, init_scale: float = 0.0
) -> dict[str, Any]:
  """A separate critic: {"backbone": copy of the policy params, "head": ...}.

  The backbone is a fresh copy (not an alias), so training it leaves the
  policy untouched even under buffer donation.
  """
  backbone = jax.tree.map(lambda x: jnp.array(x, copy=True), policy_params)
  dtype = decoder.compute_dtype(policy_params)
  return {
    "backbone": backbone,
    "head": init_value_head(config, rng, dtype, init_scale),
  }


def value_forward(
  config: ModelConfig,
  params,
  value_params,
  tokens: Int[Array, "b t"],
  attention_mask: Int[Array, "b t"] | None = None,
  positions: Int[Array, "b t"] | None = None,
  *,
  remat: bool = False,
  activation_dtype=None,
) -> Float[Array, "b t"]:
  """Values [B, T] (float32): the head applied to each final hidden state.

  For a separate critic pass `critic["backbone"], critic["head"]`;
  `activation_dtype` as `decoder.final_hidden_states`.
  """
  if value_params["kernel"].shape != (config.hidden_size, 1):
    raise ValueError(
      f"value head kernel has shape "
      f"{tuple(value_params['kernel'].shape)}; expected "
      f"[{config.hidden_size}, 1]"
    )
  hidden = decoder.final_hidden_states(
    config,
    params,
    tokens,
    attention_mask,
    positions,
    remat=remat,
    activation_dtype=activation_dtype,
  )
  h = hidden.astype(jnp.float32)
  values = h @ value_params["kernel"].astype(jnp.float32)
  return values[..., 0] + value_params["bias"].astype(jnp.float32)[0]
