"""Helpers shared by the quantization tests: small random decoders."""

import jax
import jax.numpy as jnp

from rljax import models


def randomized_params(config, seed=0, dtype=jnp.float32):
  """`models.init_params` with random norm scales and biases.

  HF's init sets norms to 1 and biases to 0, which would hide a fold that
  forgets to scale a norm or wrongly scales a bias.
  """
  params = models.init_params(config, jax.random.key(seed), dtype)
  key = jax.random.key(seed + 1000)
  layers = dict(params["layers"])
  for name in ("attn_norm", "mlp_norm"):
    key, sub = jax.random.split(key)
    layers[name] = {
      "scale": jax.random.uniform(
        sub, layers[name]["scale"].shape, dtype, 0.5, 1.5
      )
    }
  for name in ("q_proj", "k_proj", "v_proj"):
    if "bias" in layers[name]:
      key, sub = jax.random.split(key)
      layers[name] = dict(
        layers[name],
        bias=0.1 * jax.random.normal(sub, layers[name]["bias"].shape, dtype),
      )
  return dict(params, layers=layers)


def random_tokens(config, batch=2, length=12, seed=1):
  return jax.random.randint(
    jax.random.key(seed), (batch, length), 0, config.vocab_size, jnp.int32
  )


def tiny_model(arch="llama", seed=0, **overrides):
  """(config, params) of a tiny GQA decoder; Qwen2 has q/k/v biases."""
  config = models.tiny_config(arch=arch, **overrides)
  return config, randomized_params(config, seed)


def next_token_loss(config, params, tokens):
  """Mean next-token cross-entropy of `tokens` under `params`."""
  logits = models.forward(config, params, tokens[:, :-1])
  logp = jax.nn.log_softmax(logits, axis=-1)
  picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)
  return -jnp.mean(picked)
