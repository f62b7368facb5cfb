"""Per-token log-probabilities and entropies of a sequence under the decoder.

These are what every policy-gradient loss consumes (logp, prox_logp, ref_logp).
The [B, T, V] float32 logits are the largest activation of an RL step
(V ≈ 150k for Qwen), so `chunk_size` computes the LM head and the log-softmax
over chunks of the sequence, recomputing each chunk in the backward pass.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from rljax.models import decoder
from rljax.models.config import ModelConfig


def _check_temperature(temperature):
  if isinstance(temperature, (int, float)) and not temperature > 0:
    raise ValueError(f"temperature={temperature!r}; expected > 0")


def logprobs_from_logits(
  logits: Float[Array, "... v"], targets: Int[Array, "..."], temperature=1.0
) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
  """Log-prob of `targets` and entropy of softmax(logits / τ).

    logp = z_y − logsumexp(z),  H = −Σ_v p_v log p_v,  z = logits / τ

  The distribution is the one a sampler at temperature τ draws from, so
  importance ratios compare like with like. Computed in float32.
  """
  _check_temperature(temperature)
  chex.assert_equal(logits.shape[:-1], targets.shape)
  z = logits.astype(jnp.float32) / temperature
  log_probs = jax.nn.log_softmax(z, axis=-1)
  logp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
  return logp, entropy


def token_logprobs(
  config: ModelConfig,
  params,
  tokens: Int[Array, "b t"],
  attention_mask: Int[Array, "b t"] | None = None,
  temperature: float | Float[Array, ""] = 1.0,
  chunk_size: int | None = None,
  *,
  positions: Int[Array, "b t"] | None = None,
  remat: bool = False,
) -> tuple[Float[Array, "b t-1"], Float[Array, "b t-1"]]:
  """Log-prob of each next token and the entropy of its distribution.

    logp[:, t]    = log softmax(logits[:, t] / τ)[tokens[:, t+1]]
    entropy[:, t] = H(softmax(logits[:, t] / τ))

  Args:
    config: the architecture.
    params: the params tree.
    tokens: int [B, T].
    attention_mask: [B, T], 1 = real token (left or right padding). Values at
      positions whose target is padding are computed but meaningless: mask them.
    temperature: τ > 0, a float or a traced scalar.
    chunk_size: if set, the LM head and log-softmax run over chunks of this
      many positions (`lax.map`, each chunk rematerialized in the backward
      pass), so [B, T, V] logits never exist at once.
    positions: RoPE positions (see `decoder.final_hidden_states`).
    remat: per-layer rematerialization of the decoder blocks.

  Returns:
    (logp, entropy), both float32 [B, T−1]. Differentiable w.r.t. params.
  """
  _check_temperature(temperature)
  if tokens.ndim != 2 or tokens.shape[1] < 2:
    raise ValueError(
      f"tokens has shape {tuple(tokens.shape)}; expected [B, T] with T >= 2"
    )
  if chunk_size is not None and (
    not isinstance(chunk_size, int) or chunk_size <= 0
  ):
    raise ValueError(
      f"chunk_size={chunk_size!r}; expected a positive int or None"
    )
  hidden = decoder.final_hidden_states(
    config, params, tokens, attention_mask, positions, remat=remat
  )[:, :-1]
  targets = tokens[:, 1:]

  def head(h, y):
    logits = decoder.logits_from_hidden(config, params, h)
    return logprobs_from_logits(logits, y, temperature)

  if chunk_size is None or chunk_size >= targets.shape[1]:
    return head(hidden, targets)

  b, n = targets.shape
  num_chunks = -(-n // chunk_size)
  pad = num_chunks * chunk_size - n
  hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(targets, ((0, 0), (0, pad)))
  # [num_chunks, B, C, ...]: lax.map runs one chunk at a time.
  h_chunks = hidden.reshape(b, num_chunks, chunk_size, -1).swapaxes(0, 1)
  y_chunks = targets.reshape(b, num_chunks, chunk_size).swapaxes(0, 1)
  chunk_fn = jax.checkpoint(lambda hy: head(*hy), prevent_cse=False)
  logp, entropy = jax.lax.map(chunk_fn, (h_chunks, y_chunks))
  unchunk = lambda x: x.swapaxes(0, 1).reshape(b, -1)[:, :n]
  return unchunk(logp), unchunk(entropy)
