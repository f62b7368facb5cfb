"""The decoder's params tree: random init (HF's), the shape of every leaf a
config implies, and the check that a given tree fits a config.

The layout is the one fixed in docs/CONTRACTS.md: blocks stacked on a
leading layer axis, projections as [in, out] kernels.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from rljax.models import fusion
from rljax.models.config import ModelConfig

Params = Mapping[str, Any]

_INIT_STD = 0.02  # HF initializer_range of Llama/Qwen2.

PROJECTIONS = (
  "q_proj",
  "k_proj",
  "v_proj",
  "o_proj",
  "gate_proj",
  "up_proj",
  "down_proj",
)


def layer_kernel_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
  """[in, out] of every linear layer of one block."""
  d, f = config.hidden_size, config.intermediate_size
  hd = config.head_dim
  q, kv = config.num_heads * hd, config.num_kv_heads * hd
  return {
    "q_proj": (d, q),
    "k_proj": (d, kv),
    "v_proj": (d, kv),
    "o_proj": (q, d),
    "gate_proj": (d, f),
    "up_proj": (d, f),
    "down_proj": (f, d),
  }


def _normal(rng, shape, dtype):
  return (_INIT_STD * jax.random.normal(rng, shape, jnp.float32)).astype(dtype)


def init_embed(config: ModelConfig, rng: PRNGKeyArray, dtype=jnp.float32):
  return {
    "embedding": _normal(rng, (config.vocab_size, config.hidden_size), dtype)
  }


def init_layers(config: ModelConfig, rng: PRNGKeyArray, dtype=jnp.float32):
  n, d = config.num_layers, config.hidden_size
  shapes = layer_kernel_shapes(config)
  rngs = jax.random.split(rng, len(shapes))
  out: dict[str, Any] = {
    "attn_norm": {"scale": jnp.ones((n, d), dtype)},
    "mlp_norm": {"scale": jnp.ones((n, d), dtype)},
  }
  for key, name in zip(rngs, PROJECTIONS):
    out[name] = {"kernel": _normal(key, (n, *shapes[name]), dtype)}
  if config.has_qkv_bias:
    for name in ("q_proj", "k_proj", "v_proj"):
      out[name]["bias"] = jnp.zeros((n, shapes[name][1]), dtype)
  if config.qk_norm:
    for name in ("q_norm", "k_norm"):
      out[name] = {"scale": jnp.ones((n, config.head_dim), dtype)}
  return out


def init_final_norm(config: ModelConfig, rng: PRNGKeyArray, dtype=jnp.float32):
  del rng
  return {"scale": jnp.ones((config.hidden_size,), dtype)}


def init_lm_head(config: ModelConfig, rng: PRNGKeyArray, dtype=jnp.float32):
  shape = (config.hidden_size, config.vocab_size)
  return {"kernel": _normal(rng, shape, dtype)}


def init_params(
  config: ModelConfig, rng: PRNGKeyArray, dtype=jnp.float32
) -> dict[str, Any]:
  """Random params, HF's init: N(0, 0.02²) weights, unit norms, zero biases."""
  k_embed, k_layers, k_head = jax.random.split(rng, 3)
  params = {
    "embed": init_embed(config, k_embed, dtype),
    "layers": init_layers(config, k_layers, dtype),
    "final_norm": init_final_norm(config, None, dtype),
  }
  if not config.tie_word_embeddings:
    params["lm_head"] = init_lm_head(config, k_head, dtype)
  return params


def param_shapes(config: ModelConfig) -> dict[str, Any]:
  """The shape of every leaf `init_params(config, ...)` creates."""
  n, d, v = config.num_layers, config.hidden_size, config.vocab_size
  shapes: dict[str, Any] = {
    "embed": {"embedding": (v, d)},
    "layers": {"attn_norm": {"scale": (n, d)}, "mlp_norm": {"scale": (n, d)}},
    "final_norm": {"scale": (d,)},
  }
  for name, (d_in, d_out) in layer_kernel_shapes(config).items():
    shapes["layers"][name] = {"kernel": (n, d_in, d_out)}
    if config.has_qkv_bias and name in ("q_proj", "k_proj", "v_proj"):
      shapes["layers"][name]["bias"] = (n, d_out)
  if config.qk_norm:
    for name in ("q_norm", "k_norm"):
      shapes["layers"][name] = {"scale": (n, config.head_dim)}
  if not config.tie_word_embeddings:
    shapes["lm_head"] = {"kernel": (d, v)}
  return shapes


def check_params(config: ModelConfig, params: Params) -> None:
  """Raises naming the first leaf of `params` whose presence or shape does
  not fit `config` (a QTensor kernel is checked by its `value`)."""

  def walk(expected, got, path):
    if not isinstance(expected, dict):
      shape = tuple(got.shape)
      if shape != expected:
        raise ValueError(
          f"params{path} has shape {shape}; expected {expected} "
          f"for this ModelConfig"
        )
      return
    if not isinstance(got, Mapping):
      raise TypeError(
        f"params{path} is a {type(got).__name__}; expected a dict"
      )
    missing = sorted(set(expected) - set(got))
    if missing:
      raise KeyError(f"params{path} lacks {missing}")
    for key in expected:
      walk(expected[key], got[key], f"{path}[{key!r}]")

  shapes = param_shapes(config)
  layers_got = params.get("layers") if isinstance(params, Mapping) else None
  if isinstance(layers_got, Mapping):
    # The rollout's inference layout (`fusion.fuse_projections`).
    shapes["layers"] = fusion.fused_layer_shapes(
      shapes["layers"], fusion.fused_names(layers_got)
    )
  walk(shapes, params, "")
