"""The Llama/Qwen2/Qwen3 decoder as pure functions over a params dict: the
full-sequence forward pass (`final_hidden_states`, `forward`) and its
`flax.linen` face (`Decoder`).

The params tree is the one fixed in docs/CONTRACTS.md (`decoder_params`):
blocks stacked on a leading layer axis and run with `jax.lax.scan`, so
compile time does not grow with depth. Pure functions (rather than a Module)
are what the rest of rljax calls, because quantized `QTensor` leaves and
`NamedSharding`s plug into a plain dict without module surgery. `Decoder` is
a thin `flax.linen` wrapper for users who want `init`/`apply`.

The layer's pieces live in `blocks`, the params' init and checks in
`decoder_params`, and the cached prefill and decode steps in `kv_cache`;
their public names are re-exported here, so `rljax.models.decoder.X` names
every part of the decoder.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from rljax.models import blocks, layers
from rljax.models.blocks import (
  compute_dtype,
  embed_tokens,
  lm_head_kernel,
  logits_from_hidden,
  positions_from_mask,
)
from rljax.models.config import ModelConfig
from rljax.models.decoder_params import (
  PROJECTIONS,
  Params,
  check_params,
  init_embed,
  init_final_norm,
  init_layers,
  init_lm_head,
  init_params,
  layer_kernel_shapes,
  param_shapes,
)
from rljax.models.kv_cache import (
  KVCache,
  decode_with_prefix_cache,
  forward_with_cache,
  init_cache,
  init_decode_cache,
  to_decode_cache,
  to_prefix_cache,
  unstack_layers,
)

__all__ = [
  "Decoder",
  "KVCache",
  "PROJECTIONS",
  "Params",
  "SCAN_SAVES",
  "check_params",
  "compute_dtype",
  "decode_with_prefix_cache",
  "embed_tokens",
  "final_hidden_states",
  "forward",
  "forward_with_cache",
  "init_cache",
  "init_decode_cache",
  "init_embed",
  "init_final_norm",
  "init_layers",
  "init_lm_head",
  "init_params",
  "layer_kernel_shapes",
  "lm_head_kernel",
  "logits_from_hidden",
  "param_shapes",
  "positions_from_mask",
  "to_decode_cache",
  "to_prefix_cache",
  "unstack_layers",
]

# The rollout's slot program builds its own decode step from a layer's
# pieces, and LoRA targets the projections, under these names.
_qkv = blocks.qkv
_mlp_block = blocks.mlp_block
_PROJECTIONS = PROJECTIONS

# Layer loops of at most this many layers are unrolled (final_hidden_states).
_UNROLL_MAX_LAYERS = 4

# What a scanned decoder layer saves for its backward pass (a
# `jax.checkpoint` policy; None saves everything autodiff keeps): the
# outputs of its projections (2-D dots, `contract_last`) and the attention
# output, which the o_proj weight gradient reads. The [B, H, T, T]
# attention probabilities, the largest residual of all, are recomputed.
SCAN_SAVES = jax.checkpoint_policies.save_from_both_policies(
  jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
  jax.checkpoint_policies.save_only_these_names(layers.ATTENTION_OUT),
)


def final_hidden_states(
  config: ModelConfig,
  params: Params,
  tokens: Int[Array, "b t"],
  attention_mask: Int[Array, "b t"] | None = None,
  positions: Int[Array, "b t"] | None = None,
  *,
  remat: bool | str = False,
  activation_dtype=None,
) -> Float[Array, "b t d"]:
  """Hidden states after the final RMSNorm, in the activation dtype.

  Args:
    config: the architecture.
    params: the params tree (float or QTensor kernels).
    tokens: int [B, T].
    attention_mask: [B, T], 1 for real tokens, 0 for padding (left or right).
      Padded keys are never attended to; outputs at padded queries are finite
      but meaningless.
    positions: int [B, T] RoPE positions; default cumsum(mask) − 1, or
      0..T−1 without a mask.
    remat: recompute each block's activations in the backward pass
      (`jax.checkpoint` per layer) to save memory. `"dots"` keeps what
      `SCAN_SAVES` names (every projection's output and the attention
      output) and recomputes only the rest, at any depth. Without remat a
      decoder of more than 4 layers (a layer scan) still recomputes what
      `SCAN_SAVES` does not keep.
    activation_dtype: dtype of the activations (`embed_tokens`); default the
      embedding's dtype.
  """
  blocks.check_tokens(tokens)
  check_params(config, params)
  blocks.check_same_shape(attention_mask, tokens, "attention_mask")
  blocks.check_same_shape(positions, tokens, "positions")
  b, t = tokens.shape
  if positions is None:
    positions = (
      positions_from_mask(attention_mask)
      if attention_mask is not None
      else jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    )
  causal = jnp.tril(jnp.ones((t, t), jnp.bool_))[None]
  if attention_mask is not None:
    mask = causal & attention_mask.astype(jnp.bool_)[:, None, :]
  else:
    mask = jnp.broadcast_to(causal, (b, t, t))
  cos, sin = layers.rope_cos_sin(config, positions)

  def block(x, layer):
    x, _ = blocks.attention_block(
      config, layer, x, cos, sin, lambda k, v: (k, v, mask, None), causal=True
    )
    return blocks.mlp_block(config, layer, x), None

  # Small decoders (the long-horizon instrument, test models) unroll the
  # layer loop: the scan's stacked residual buffers (zero-filled, then
  # sliced per layer) were ~15% of the instrument's update step, while
  # unrolling a 30-layer model would multiply its compile time.
  unroll = config.num_layers if config.num_layers <= _UNROLL_MAX_LAYERS else 1
  if remat == "dots":
    # Save what SCAN_SAVES names (projection outputs, attention output) and
    # recompute only the cheap rest: on a GPU the full per-layer remat below
    # re-runs every matmul of the forward (~1/3 more matmul FLOPs).
    block = jax.checkpoint(block, prevent_cse=False, policy=SCAN_SAVES)
  elif remat:
    block = jax.checkpoint(block, prevent_cse=False)
  elif unroll == 1 and SCAN_SAVES is not None:
    # A scanned decoder keeps only what `SCAN_SAVES` names for the
    # backward pass and recomputes the rest (norms, RoPE, SwiGLU's
    # elementwise product, the attention scores): every residual the scan
    # saves is a [L, ...] buffer it zero-fills, writes and reads back, which
    # cost more than recomputing them on a CPU (docs/performance.md).
    block = jax.checkpoint(block, prevent_cse=False, policy=SCAN_SAVES)
  x = embed_tokens(params, tokens, activation_dtype)
  x, _ = jax.lax.scan(block, x, params["layers"], unroll=unroll)
  return layers.rms_norm(x, params["final_norm"]["scale"], config.rms_norm_eps)


def forward(
  config: ModelConfig,
  params: Params,
  tokens: Int[Array, "b t"],
  attention_mask: Int[Array, "b t"] | None = None,
  positions: Int[Array, "b t"] | None = None,
  *,
  remat: bool = False,
  return_hidden: bool = False,
  activation_dtype=None,
):
  """Next-token logits of a Llama/Qwen2/Qwen3 decoder.

  Returns float32 logits [B, T, V]; with `return_hidden`, the pair
  (logits, final hidden states [B, T, D]). See `final_hidden_states` for the
  arguments.
  """
  hidden = final_hidden_states(
    config,
    params,
    tokens,
    attention_mask,
    positions,
    remat=remat,
    activation_dtype=activation_dtype,
  )
  logits = logits_from_hidden(config, params, hidden)
  return (logits, hidden) if return_hidden else logits


# ------------------------------------------------------------ Flax wrapper
class Decoder(nn.Module):
  """`flax.linen` face of the decoder: `init` creates the contract params
  layout under "params", `apply` calls `forward`."""

  config: ModelConfig
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(
    self,
    tokens,
    attention_mask=None,
    positions=None,
    *,
    remat: bool = False,
    return_hidden: bool = False,
  ):
    cfg, dtype = self.config, self.param_dtype
    parts = {
      "embed": init_embed,
      "layers": init_layers,
      "final_norm": init_final_norm,
    }
    if not cfg.tie_word_embeddings:
      parts["lm_head"] = init_lm_head
    params = {
      name: self.param(name, lambda rng, f=init: f(cfg, rng, dtype))
      for name, init in parts.items()
    }
    return forward(
      cfg,
      params,
      tokens,
      attention_mask,
      positions,
      remat=remat,
      return_hidden=return_hidden,
    )
