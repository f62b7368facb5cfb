"""Quantize the linear kernels of a decoder params tree (`docs/CONTRACTS.md`).

The quantized tree is the same nested dict with the seven projection kernels
of every block (stacked on the leading layer axis) replaced by `QTensor`s;
embeddings, norms, biases and the LM head stay in full precision unless asked,
as in vLLM's W8A8 checkpoints (`ignore: [lm_head]`). The decoder multiplies
every linear layer through `qdot`, so it runs the quantized tree unchanged.
"""

from __future__ import annotations

from typing import Any, Iterator

import jax
import jax.numpy as jnp

from rljax.quant import qtensor
from rljax.quant import quantizers
from rljax.quant.qtensor import QTensor

# The projections of a block that QuRL quantizes for rollout (the Linear
# targets of vLLM's compressed-tensors config).
LAYER_KERNELS = (
  "q_proj",
  "k_proj",
  "v_proj",
  "o_proj",
  "gate_proj",
  "up_proj",
  "down_proj",
)

Params = dict[str, Any]


def _check_params(params: Any, where: str) -> None:
  if not isinstance(params, dict) or "layers" not in params:
    raise TypeError(
      f"{where}: expected a decoder params dict with a 'layers' entry "
      f"(docs/CONTRACTS.md), got {type(params).__name__}"
      + (f" with keys {sorted(params)}" if isinstance(params, dict) else "")
    )
  missing = [
    n for n in LAYER_KERNELS if "kernel" not in params["layers"].get(n, {})
  ]
  if missing:
    raise ValueError(f"{where}: params['layers'] lacks kernels for {missing}")


def kernel_paths(
  params: Params, include_lm_head: bool = False
) -> list[tuple[str, ...]]:
  """Paths `("layers", "q_proj", "kernel")`, ... of the quantizable kernels."""
  _check_params(params, "kernel_paths(params)")
  paths = [("layers", name, "kernel") for name in LAYER_KERNELS]
  if include_lm_head:
    if "lm_head" not in params:
      raise ValueError(
        "include_lm_head=True but params has no 'lm_head' (the embeddings "
        "are tied, and the decoder multiplies the tied embedding directly, "
        "not through qdot); quantize an untied model or leave the head in "
        "full precision"
      )
    paths.append(("lm_head", "kernel"))
  return paths


def get_path(tree: Params, path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def replace_paths(
  tree: Params, new_leaves: dict[tuple[str, ...], Any]
) -> Params:
  """Copy of the nested dict `tree` with the leaves at the given paths replaced.

  Only the dicts on the way to a replaced leaf are copied; other subtrees are
  shared with `tree` (arrays are immutable).
  """
  out = dict(tree)
  by_head: dict[str, dict[tuple[str, ...], Any]] = {}
  for path, leaf in new_leaves.items():
    if len(path) == 1:
      out[path[0]] = leaf
    else:
      by_head.setdefault(path[0], {})[path[1:]] = leaf
  for head, sub in by_head.items():
    out[head] = replace_paths(tree[head], sub)
  return out


def iter_qtensors(qparams: Params) -> Iterator[tuple[tuple[str, ...], QTensor]]:
  """Yields `(path, QTensor)` for every quantized leaf of a params tree."""
  flat, _ = jax.tree_util.tree_flatten_with_path(
    qparams, is_leaf=lambda x: isinstance(x, QTensor)
  )
  for key_path, leaf in flat:
    if isinstance(leaf, QTensor):
      yield tuple(k.key for k in key_path), leaf


def quantize_params(
  config: Any,
  params: Params,
  mode: str = "int8",
  fake: bool = False,
  include_lm_head: bool = False,
  per_tensor: bool = False,
) -> Params:
  """Same tree with the projection kernels replaced by `QTensor`s.

  Args:
    config: the decoder config (kept for the contract; the layout comes from
      the tree itself).
    params: full-precision params (possibly UAQ-folded, see `fold_uaq`).
    mode: `"int8"` (W8A8, per-channel weights + dynamic per-token
      activations), `"int8_wo"` (weight-only INT8) or `"fp8"` (e4m3 W8A8).
    fake: run the matmuls as quantize-dequantize emulation in float.
    include_lm_head: also quantize `params["lm_head"]["kernel"]` (untied models
      only).
    per_tensor: FP8 only: one scale per matrix instead of per output channel.

  Returns:
    A new tree that shares no buffer with `params` (the unquantized leaves
    are copied), so a training step that donates `params` leaves it valid
    for the rollout engine; `params` is not modified.
  """
  del config
  if mode not in qtensor.MODES:
    raise ValueError(
      f"quantize_params: mode={mode!r}; expected one of {qtensor.MODES}"
    )
  paths = kernel_paths(params, include_lm_head)
  new_leaves = {}
  for path in paths:
    w = get_path(params, path)
    if isinstance(w, QTensor):
      raise TypeError(
        f"quantize_params: {'/'.join(path)} is already a QTensor; pass the "
        "full-precision params"
      )
    new_leaves[path] = quantizers.quantize(
      w, mode, fake=fake, per_tensor=per_tensor
    )
  copied = jax.tree.map(jnp.copy, params)
  return replace_paths(copied, new_leaves)
