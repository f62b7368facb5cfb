"""Fused projections: one matmul for q/k/v and one for gate/up.

A decode step of a small model is many small kernels (an H100 ran ~1,000
per Qwen2.5-0.5B decode step, ~40 per layer, 89-96 % busy; docs/
performance.md). The three attention projections read the same normed
activations, and so do the MLP's gate and up projections: concatenating
their kernels along the output axis,

  [q | k | v] = h · [W_q | W_k | W_v],     [g | u] = h · [W_g | W_u],

turns five matmuls into two. Under W8A8 (`qtensor.qdot`) it also quantizes
the activations once per group instead of once per projection; the
per-token scale is a function of h alone, so each column sees the same
codes and scales as before: INT8's int32 products are exact, and FP8 and
float outputs differ at most by the GEMM's float32 accumulation order.

The fused layout is an inference layout: the rollout builds it inside its
jitted program from the contract tree (docs/CONTRACTS.md), which stays the
one every other path (training, checkpoints, engines) sees.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp

from rljax.quant.qtensor import QTensor

QKV = "qkv_proj"
GATE_UP = "gate_up_proj"

# Fused name -> the contract projections it replaces, in output order.
GROUPS: dict[str, tuple[str, ...]] = {
  QKV: ("q_proj", "k_proj", "v_proj"),
  GATE_UP: ("gate_proj", "up_proj"),
}


def fused_names(layers: Mapping[str, Any]) -> tuple[str, ...]:
  """The fused projections a (stacked) layers dict holds."""
  return tuple(name for name in GROUPS if name in layers)


def fused_layer_shapes(
  shapes: Mapping[str, Any], names: tuple[str, ...]
) -> dict[str, Any]:
  """The `param_shapes(config)["layers"]` dict with the projections of the
  fused `names` (`fused_names`) replaced by their fusion."""
  out = dict(shapes)
  for fused in names:
    parts = GROUPS[fused]
    leaves = {}
    for leaf in shapes[parts[0]]:
      widths = [shapes[p][leaf][-1] for p in parts]
      leaves[leaf] = (*shapes[parts[0]][leaf][:-1], sum(widths))
    for p in parts:
      del out[p]
    out[fused] = leaves
  return out


def _concat_kernels(kernels: list[Any]) -> Any | None:
  """Float kernels or QTensors [..., in, out_i] joined on the output axis;
  None where they cannot be (mixed kinds, modes or dtypes)."""
  if all(isinstance(k, QTensor) for k in kernels):
    first = kernels[0]
    if any(
      (k.mode, k.fake, k.value.dtype) != (first.mode, first.fake, first.dtype)
      for k in kernels
    ):
      return None
    # A per-tensor scale [..., 1, 1] becomes per-channel over its columns.
    scales = [
      jnp.broadcast_to(k.scale, (*k.scale.shape[:-1], k.value.shape[-1]))
      for k in kernels
    ]
    return QTensor(
      value=jnp.concatenate([k.value for k in kernels], axis=-1),
      scale=jnp.concatenate(scales, axis=-1),
      mode=first.mode,
      fake=first.fake,
    )
  if any(isinstance(k, QTensor) for k in kernels):
    return None
  if len({k.dtype for k in kernels}) != 1:
    return None
  return jnp.concatenate(kernels, axis=-1)


def _fused_group(projections: list[Mapping[str, Any]]) -> dict | None:
  keys = set(projections[0])
  # A LoRA adapter (`lora.attach`) stays beside its own kernel.
  if keys not in ({"kernel"}, {"kernel", "bias"}) or any(
    set(p) != keys for p in projections
  ):
    return None
  kernel = _concat_kernels([p["kernel"] for p in projections])
  if kernel is None:
    return None
  fused = {"kernel": kernel}
  if "bias" in keys:
    biases = [p["bias"] for p in projections]
    if len({b.dtype for b in biases}) != 1:
      return None
    fused["bias"] = jnp.concatenate(biases, axis=-1)
  return fused


def fuse_projections(params: Mapping[str, Any]) -> dict[str, Any]:
  """`params` with q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj`.

    W_qkv = [W_q | W_k | W_v] ∈ R^{D × (Hq + 2 Hkv)·hd},
    W_gu  = [W_g | W_u]       ∈ R^{D × 2F}

  (biases and per-channel scales joined the same way). A group whose
  projections carry LoRA adapters, or differ in format (float vs QTensor,
  mode, dtype), is left as it is; so is a group already fused. Every other
  leaf is passed through.
  """
  layers = params["layers"]
  new_layers = dict(layers)
  for fused, parts in GROUPS.items():
    if fused in layers or not all(p in layers for p in parts):
      continue
    joined = _fused_group([layers[p] for p in parts])
    if joined is None:
      continue
    for p in parts:
      del new_layers[p]
    new_layers[fused] = joined
  return {**params, "layers": new_layers}
