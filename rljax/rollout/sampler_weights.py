"""What the JAX sampler runs on: its rollout weights and the dtypes they set.

  params (full precision) ──► prepare ──► rollout weights
                               │  cast / quantize (`quant.prepare_rollout_weights`)
                               │  W8A8 copy of the LM head (`head_quant="int8"`)
                               └  laid out over a mesh (`sharding.param_shardings`)
  rollout weights ──► activation_dtype, cache_dtype (what the programs compute in)
                  ──► weight_layout (part of every compile's key), tree_nbytes

`jax_sampler.JaxSampler.update_weights` calls `prepare`; the programs
(`static_program`, `slot_program`) read the result, `rollout_config` tells
them whether the head is a leaf of its own.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rljax import models
from rljax import quant as quant_lib
from rljax.models import decoder as decoder_lib
from rljax.models import sharding as sharding_lib

# Accepted values of `quant`; "none" and "f32" both mean "params as given".
QUANT_MODES = quant_lib.ROLLOUT_MODES
LOW_BIT_MODES = quant_lib.MODES
HEAD_QUANT_MODES = ("none", "int8")


def check_quant(quant: Any, where: str) -> str:
  """`quant` with "f32" spelled "none"; a ValueError names `where`."""
  if quant not in QUANT_MODES:
    raise ValueError(f"{where}: quant={quant!r}; expected one of {QUANT_MODES}")
  return "none" if quant == "f32" else quant


def tree_nbytes(tree: Any) -> int:
  """Total bytes of the array leaves of a pytree (QTensor value + scale)."""
  return int(
    sum(
      np.dtype(x.dtype).itemsize * int(np.prod(x.shape))
      for x in jax.tree_util.tree_leaves(tree)
      if hasattr(x, "dtype") and hasattr(x, "shape")
    )
  )


def weight_layout(tree: Any) -> Any:
  """What a jit trace of the params depends on: structure, shapes, dtypes."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


def rollout_config(config: Any, head_quant: str) -> Any:
  """The decoder config the sampler runs: untied when the head is separate.

  A quantized head is its own `lm_head` leaf, so the embedding lookup keeps
  the full-precision table while the logits go through the head copy.
  """
  if head_quant == "none" or not getattr(config, "tie_word_embeddings", False):
    return config
  return dataclasses.replace(config, tie_word_embeddings=False)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def with_head(config, head_quant: str, fake: bool, params):
  """Adds (or replaces) `lm_head` with an int8 W8A8 copy of the head.

  int8: s_v = max_d |W[d, v]| / 127 per vocabulary column, the same
  per-output-channel rule as the projections (`quant.quantize`).
  """
  kernel = decoder_lib.lm_head_kernel(config, params)
  if isinstance(kernel, quant_lib.QTensor):
    return params  # already quantized by quantize_params(include_lm_head)
  del head_quant  # "int8", the one mode besides "none".
  head = quant_lib.quantize(kernel, "int8", fake=fake)
  return {**params, "lm_head": {"kernel": head}}


def prepare(
  config: Any,
  params: Any,
  quant: str,
  head_quant: str,
  fake: bool,
  mesh: Any,
) -> Any:
  """The rollout weights of `params`, materialized.

  quant="none" takes `params` as given (the trainer passes weights it
  prepared itself); another mode converts full-precision params
  (`quant.prepare_rollout_weights`). A W8A8 head copy is added for
  head_quant="int8"; on a mesh every leaf is laid out by the logical-axis
  rules.
  """
  if quant == "none":
    new_params = params
  else:
    new_params = quant_lib.prepare_rollout_weights(
      config, params, quant, fake=fake
    )
  if head_quant != "none":
    new_params = with_head(config, head_quant, fake, new_params)
  if mesh is not None:
    new_params = jax.device_put(
      new_params, sharding_lib.param_shardings(config, new_params, mesh)
    )
  return jax.block_until_ready(new_params)


def activation_dtype(quant: str, params: Any) -> jnp.dtype | None:
  """The rollout's activation dtype; None: the embedding's (the weights').

  bf16 weights on the CPU backend ("bf16", bf16 params given to a "none"
  sampler, as the trainer's prepared weights, or a quantized tree whose
  float leaves are bf16 on a CPU with bf16 dot units,
  `quant.quantized_float_dtype`) run with float32 activations: each matmul
  is then a bf16 x bf16 -> f32 dot (`qdot`), ~2x the f32 dot with
  AVX512-BF16 or AMX, while bf16 elementwise work and attention are slower
  than f32 there (no bf16 arithmetic outside the dot units;
  docs/performance.md). On an accelerator they run in the embedding's
  dtype: bf16 throughout for "bf16" and for the quantized modes, whose
  float leaves are bf16 there (`quant.quantized_float_dtype`), around the
  int8/fp8 dots. `params` None (none loaded yet) decides by `quant`.
  """
  if jax.default_backend() != "cpu":
    return None
  if params is None:
    bf16 = quant == "bf16"
  else:
    bf16 = models.compute_dtype(params) == jnp.bfloat16
  return jnp.dtype(jnp.float32) if bf16 else None


def cache_dtype(explicit: Any, quant: str, params: Any) -> jnp.dtype:
  """The KV cache dtype: `explicit` when given, else the activations'.

  The cache holds keys and values as the activations compute them, so it
  takes their dtype: bf16 activations (a bf16 or, on an accelerator, a
  quantized tree; `quant.quantized_float_dtype`) in a float32 cache would
  double its reads at every decode step for no precision.
  """
  if explicit is not None:
    return jnp.dtype(explicit)
  act = activation_dtype(quant, params)
  if act is None and params is not None:
    act = models.compute_dtype(params)
  elif act is None:
    act = jnp.bfloat16 if quant == "bf16" else jnp.float32
  if jnp.dtype(act) == jnp.bfloat16:
    return jnp.dtype(jnp.bfloat16)
  return jnp.dtype(jnp.float32)


def paged_cache_dtype(explicit: Any, quant: str, params: Any) -> jnp.dtype:
  """The continuous engine's KV pool dtype: `explicit` when given, else
  bf16 where the weights compute in bf16 (a "bf16" tree, or a quantized
  one whose float leaves are bf16, `quant.quantized_float_dtype`), else
  float32.

  Unlike the static program's cache (`cache_dtype`, float32 on the CPU,
  where XLA converts a bf16 cache back at every step), the pool is read by
  the paged-attention kernel, which widens bf16 to f32 as it loads it:
  half the bytes of every step's attention reads, for keys and values
  rounded to bf16 once (the log-prob change the tests bound).
  """
  if explicit is not None:
    return jnp.dtype(explicit)
  if params is None:
    bf16 = quant == "bf16"
  else:
    bf16 = models.compute_dtype(params) == jnp.bfloat16
  return jnp.dtype(jnp.bfloat16 if bf16 else jnp.float32)
