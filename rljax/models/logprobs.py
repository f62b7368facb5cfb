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


# Name scope of the LM head and log-softmax (see `_head_logprobs`).
HEAD_SCOPE = "logprob_head"


def _check_temperature(temperature):
  if isinstance(temperature, (int, float)) and not temperature > 0:
    raise ValueError(f"temperature={temperature!r}; expected > 0")


def logprobs_from_logits(
  logits: Float[Array, "... v"], targets: Int[Array, "..."], temperature=1.0
) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
  """Log-prob of `targets` and entropy of softmax(logits / τ).

    logp = z_y − logsumexp(z),  H = −Σ_v p_v log p_v,  z = logits / τ

  The distribution is the one a sampler at temperature τ draws from, so
  importance ratios compare like with like (the PPO ratio of Schulman et
  al., 2017, and the entropy bonus of Mnih et al., 2016). Computed in
  float32, with the hand-written gradient of `_logp_entropy`.
  """
  _check_temperature(temperature)
  chex.assert_equal(logits.shape[:-1], targets.shape)
  z = logits.astype(jnp.float32) / temperature
  return _logp_entropy(z, targets)


def _row_stats(z, targets):
  # With zc = z − max z (so every exp is ≤ 1) and s = Σ exp(zc):
  #   logp = zc_y − log s,   H = log s − E_p[zc],
  # and both terms of H are ≥ 0 (s ≥ 1, zc ≤ 0), so H ≥ 0 in floats too.
  m = jnp.max(z, axis=-1, keepdims=True)
  zc = z - m
  e = jnp.exp(zc)
  # Σ e and Σ e·zc in one pass over [.., V] (a variadic reduce): as two
  # jnp.sums XLA:CPU reads the [.., V] rows twice and runs the second as a
  # slow product-reduction (0.91 s against 1.86 s on 4080 x 49152 f32,
  # docs/performance.md).
  s, e_zc = jax.lax.reduce(
    (e, e * zc),
    (jnp.zeros((), z.dtype), jnp.zeros((), z.dtype)),
    lambda a, b: (a[0] + b[0], a[1] + b[1]),
    (z.ndim - 1,),
  )
  s, e_zc = s[..., None], e_zc[..., None]
  mean_zc = e_zc / s
  zc_y = jnp.take_along_axis(zc, targets[..., None], axis=-1)
  log_s = jnp.log(s)
  return zc_y - log_s, log_s - mean_zc, m, s, mean_zc


@jax.custom_vjp
def _logp_entropy(z, targets):
  logp, entropy, *_ = _row_stats(z, targets)
  return logp[..., 0], entropy[..., 0]


def _logp_entropy_fwd(z, targets):
  logp, entropy, m, s, mean_zc = _row_stats(z, targets)
  return (logp[..., 0], entropy[..., 0]), (z, targets, m, s, mean_zc)


def _logp_entropy_bwd(res, cotangents):
  # With p = softmax(z):  ∂logp/∂z_v = 1[v = y] − p_v  and
  # ∂H/∂z_v = −p_v (z_v − E_p[z]). One fused elementwise pass over [.., V]:
  # autodiff of the forward instead zero-fills a [.., V] buffer and scatters
  # into it for take_along_axis, and differentiates log_softmax and the
  # entropy sum separately (~8 s of a 50 s SmolLM2 update step on a CPU,
  # docs/performance.md).
  z, targets, m, s, mean_zc = res
  g_logp, g_entropy = (g[..., None] for g in cotangents)
  zc = z - m
  p = jnp.exp(zc) / s
  vocab = jax.lax.broadcasted_iota(targets.dtype, z.shape, z.ndim - 1)
  onehot = (vocab == targets[..., None]).astype(z.dtype)
  dz = g_logp * (onehot - p) - g_entropy * p * (zc - mean_zc)
  return dz, None


_logp_entropy.defvjp(_logp_entropy_fwd, _logp_entropy_bwd)


def token_logprobs(
  config: ModelConfig,
  params,
  tokens: Int[Array, "b t"],
  attention_mask: Int[Array, "b t"] | None = None,
  temperature: float | Float[Array, ""] = 1.0,
  chunk_size: int | None = None,
  *,
  positions: Int[Array, "b t"] | None = None,
  remat: bool | str = False,
  activation_dtype=None,
  start: int = 0,
) -> tuple[Float[Array, "b t-1"], Float[Array, "b t-1"]]:
  """Log-prob of each next token and the entropy of its distribution.

    logp[:, t]    = log softmax(logits[:, t] / τ)[tokens[:, t+1]]   (t ≥ start)
    entropy[:, t] = H(softmax(logits[:, t] / τ))                    (t ≥ start)
    logp[:, t] = entropy[:, t] = 0                                  (t < start)

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
    remat: per-layer rematerialization of the decoder blocks (True, or
      "dots": save the projections' outputs, `decoder.final_hidden_states`).
    activation_dtype: the forward pass's activation dtype (default the
      embedding's; float32 under bf16 weights is the CPU's mixed precision:
      bf16 x bf16 -> f32 dots, everything else in float32).
    start: the first column computed. Every position still runs through the
      decoder (it is context), but the LM head and the log-softmax, a fifth
      of a 135M model's FLOPs and most of its memory traffic, run only on
      columns t >= start; the ones before are 0, with 0 gradient. An RL
      batch packs prompts first (`RolloutBatch.pack`) and masks them out of
      the loss, so its losses do not change (`UpdateSpec.response_len`).

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
  if not isinstance(start, int) or not 0 <= start < tokens.shape[1] - 1:
    raise ValueError(
      f"start={start!r}; expected an int in [0, {tokens.shape[1] - 1}) for"
      f" tokens of length {tokens.shape[1]}"
    )
  hidden = decoder.final_hidden_states(
    config,
    params,
    tokens,
    attention_mask,
    positions,
    remat=remat,
    activation_dtype=activation_dtype,
  )[:, start:-1]
  targets = tokens[:, start + 1 :]
  logp, entropy = _head_logprobs(
    config, params, hidden, targets, temperature, chunk_size
  )
  if start:  # the skipped columns hold 0 (and pass no gradient)
    logp, entropy = (jnp.pad(x, ((0, 0), (start, 0))) for x in (logp, entropy))
  return logp, entropy


def _head_logprobs(config, params, hidden, targets, temperature, chunk_size):
  """(logp, entropy) [B, N] of `targets` [B, N] from final hidden states
  [B, N, D]: the LM head and log-softmax, over chunks of `chunk_size`
  positions when set."""

  def head(h, y):
    # The scope names the head's ops in a profile (rljax.tracing's
    # "logprob_head" share); it changes nothing that is computed.
    with jax.named_scope(HEAD_SCOPE):
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
