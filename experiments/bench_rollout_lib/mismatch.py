"""The policy mismatch of an engine's samples: KL(π_q || π_f32) to the
full-precision policy on the sampled prefixes.

  KL(π_q || π_f32) = mean over sampled response positions t of
                     Σ_v π_q(v | o_<t) (log π_q(v | o_<t) − log π_f32(v | o_<t))

exactly from both models' logits (JAX engines), or with the k1 estimator
mean_t(behav_logp − logp_f32), unbiased for the same KL since the tokens are
sampled from π_q (vLLM, whose logits are not visible).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rljax import models
from rljax.rollout import base


@functools.partial(jax.jit, static_argnums=0)
def _kl_and_logp(configs, params_q, params_f, tokens, mask, temperature):
  """Exact KL(π_q || π_f) per position and log π_f of the next token.

  configs: (config of π_q, config of π_f, π_q's activation dtype or None),
  so π_q is the function the engine ran (`JaxSampler.activation_dtype`).
  """
  config_q, config_f, act_q = configs
  zq = models.forward(config_q, params_q, tokens, mask, activation_dtype=act_q)
  zq = zq[:, :-1] / temperature
  zf = models.forward(config_f, params_f, tokens, mask)[:, :-1] / temperature
  log_q = jax.nn.log_softmax(zq, axis=-1)
  log_f = jax.nn.log_softmax(zf, axis=-1)
  kl = jnp.sum(jnp.exp(log_q) * (log_q - log_f), axis=-1)
  logp_f = jnp.take_along_axis(log_f, tokens[:, 1:, None], axis=-1)[..., 0]
  return kl, logp_f


def policy_mismatch(
  config,
  params_q,
  params_f32,
  batch: base.RolloutBatch,
  temperature: float,
  num_rows: int,
  chunk: int,
  f32_config=None,
  activation_dtype=None,
) -> tuple[float, float]:
  """(exact KL or nan, k1 KL) of the engine's samples to the f32 policy.

  params_q None means the engine's logits are not available (vLLM): only the
  k1 estimate mean(behav_logp − logp_f32) is returned.
  """
  if num_rows <= 0:
    return float("nan"), float("nan")
  rows = np.linspace(0, batch.num_samples - 1, min(num_rows, batch.num_samples))
  rows = np.unique(rows.astype(int))
  packed = batch.pack()
  exact_sum, k1_sum, count = 0.0, 0.0, 0.0
  for start in range(0, len(rows), chunk):
    idx = rows[start : start + chunk]
    pad = chunk - len(idx)  # Keep one shape: one compile.
    idx_full = np.concatenate([idx, np.repeat(idx[-1:], pad)])
    tokens = jnp.asarray(packed["tokens"][idx_full])
    mask = jnp.asarray(packed["attention_mask"][idx_full])
    configs = (
      config if params_q is not None else f32_config or config,
      f32_config or config,
      activation_dtype if params_q is not None else None,
    )
    kl, logp_f = _kl_and_logp(
      configs,
      params_q if params_q is not None else params_f32,
      params_f32,
      tokens,
      mask,
      jnp.float32(temperature),
    )
    resp = packed["response_mask"][idx]
    exact_sum += float(np.sum(np.asarray(kl)[: len(idx)] * resp))
    k1_sum += float(
      np.sum(
        (packed["behav_logp"][idx] - np.asarray(logp_f)[: len(idx)]) * resp
      )
    )
    count += float(resp.sum())
  exact = exact_sum / count if params_q is not None else float("nan")
  return exact, k1_sum / count
