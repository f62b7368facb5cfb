"""vLLM worker extension used by rljax's vLLM sidecar (runs inside vLLM).

vLLM mixes this class into its worker class when the server is started with
`--worker-extension-cls rljax_vllm_ext.RljaxWorkerExtension`; its methods are
then reachable over HTTP through `POST /collective_rpc` (dev mode), like
vLLM's own `reload_weights`.

Why it exists: in vLLM 0.32 (CPU backend), an in-place `reload_weights` of a
W8A8 INT8 compressed-tensors model leaves every oneDNN int8 GEMM handler
pointing at the *previous* (freed) `weight_scale` tensors: layerwise reload
copies the new values into the original parameter storage, but the handlers
were created, during re-processing, from the temporary tensors. The reloaded
model then computes garbage (inf/NaN logits; greedy decoding emits token 0).
`rljax_reload_weights` runs vLLM's reload and then rebuilds those handlers
from the live scale parameters and the new int8 codes, which restores
bit-identical outputs for identical weights (see README.md). It also
rebuilds the oneDNN handler of an LM head tied to the embeddings, which
vLLM's reload leaves packed with the old embedding.

`rljax_apply_shared_weights` is the fast path (`shared_weights.py`): it
updates the live parameters and handlers in place from a shared-memory
safetensors file, only for modules whose tensors changed, and answers
`{"unsupported": reason}` (having changed nothing) where it cannot, so that
the sidecar falls back to `rljax_reload_weights` on the same file.

Only imports vLLM and torch: this file must not import rljax or JAX.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from rljax_vllm_ext import shared_weights

# 2: rljax_apply_shared_weights; tied LM heads rebuilt after a reload.
EXTENSION_VERSION = 2


def _weight_files(weights_path: str) -> dict[str, str]:
  """Tensor name -> safetensors file, for a checkpoint directory."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  index = os.path.join(weights_path, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    return {name: os.path.join(weights_path, file)
            for name, file in weight_map.items()}
  where = {}
  for file in sorted(os.listdir(weights_path)):
    if file.endswith(".safetensors"):
      path = os.path.join(weights_path, file)
      with safe_open(path, "pt") as handle:
        for name in handle.keys():
          where[name] = path
  return where


def _onednn_int8_layers(model) -> list[tuple[str, Any, Any]]:
  """(module name, module, kernel) of every INT8 linear on the oneDNN path."""
  layers = []
  for name, module in model.named_modules():
    kernel = shared_weights.onednn_int8_kernel(module)
    if kernel is not None:
      layers.append((name, module, kernel))
  return layers


def rebuild_onednn_int8_handlers(model, weights_path: str, out_dtype,
                                 tp_size: int = 1) -> int:
  """Recreates the oneDNN GEMM handler of every INT8 linear layer from the
  layer's live `weight_scale` and the int8 codes in weights_path.

  Returns:
    Number of handlers rebuilt.
  """
  import torch  # pylint: disable=g-import-not-at-top
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  layers = _onednn_int8_layers(model)
  if not layers:
    return 0
  if tp_size != 1:
    raise NotImplementedError(
        "rljax_reload_weights: rebuilding oneDNN INT8 handlers is implemented "
        f"for tensor_parallel_size=1; this server runs {tp_size}")
  files = _weight_files(weights_path)
  packed = getattr(model, "packed_modules_mapping", {}) or {}
  for name, module, kernel in layers:
    parent, _, leaf = name.rpartition(".")
    parts = packed.get(leaf, [leaf])
    codes = []
    for part in parts:
      tensor_name = f"{parent}.{part}.weight"
      if tensor_name not in files:
        raise KeyError(
            f"rljax_reload_weights: {weights_path!r} has no {tensor_name!r} "
            f"(needed to rebuild the INT8 GEMM of {name!r})")
      with safe_open(files[tensor_name], "pt") as handle:
        codes.append(handle.get_tensor(tensor_name))
    weight = torch.cat(codes, dim=0) if len(codes) > 1 else codes[0]
    if weight.dtype != torch.int8:
      raise TypeError(f"rljax_reload_weights: {name!r} codes have dtype "
                      f"{weight.dtype}; expected torch.int8")
    _, scale_name, _, _, _ = kernel.layer_param_names
    scale = getattr(module, scale_name)
    if weight.shape[0] != scale.shape[0]:
      raise ValueError(
          f"rljax_reload_weights: {name!r} has {weight.shape[0]} output "
          f"channels in {weights_path!r} but {scale.shape[0]} scales loaded")
    # The handler wants [K, N] with unit stride along K, i.e. the transpose of
    # the contiguous [N, K] checkpoint tensor (as vLLM's own processing does).
    shared_weights.build_int8_handler(module, kernel, weight.contiguous(),
                                      scale, out_dtype)
  return len(layers)


class RljaxWorkerExtension:
  """Methods added to vLLM's worker (every attribute is `rljax_`-prefixed so
  that none can shadow a worker attribute)."""

  def rljax_extension_info(self) -> dict[str, Any]:
    """What the sidecar checks at start-up: the extension is loaded."""
    import vllm  # pylint: disable=g-import-not-at-top
    return {"extension_version": EXTENSION_VERSION,
            "vllm_version": getattr(vllm, "__version__", None)}

  def rljax_reload_weights(self, weights_path: str) -> dict[str, Any]:
    """vLLM's in-place `reload_weights` from a checkpoint-format directory,
    plus the repairs the installed vLLM needs afterwards."""
    self.reload_weights(weights_path=weights_path)
    config = self.vllm_config  # pylint: disable=no-member
    model = self.model_runner.model  # pylint: disable=no-member
    rebuilt = rebuild_onednn_int8_handlers(
        model, weights_path, config.model_config.dtype,
        config.parallel_config.tensor_parallel_size)
    heads = _rebuild_heads_on_cpu(model)
    return {"rebuilt_int8_handlers": rebuilt, "rebuilt_lm_heads": heads}

  def rljax_apply_shared_weights(self, path: str,
                                 changed: str | list[str] | None = None
                                 ) -> dict[str, Any]:
    """Updates the weights in place from the safetensors file `path`
    (rewritten in place by the sidecar at every sync).

    Args:
      path: the file.
      changed: names of the tensors that differ from what the engine runs,
        as a list or its JSON text (the HTTP route passes strings); None:
        all. Modules none of whose tensors changed are left as they
        are: their state was built from the same bytes.

    Returns:
      {"modules", "handlers", "skipped_modules", "seconds"} ("handlers":
      oneDNN GEMM handlers built plus SGL INT8 weights re-packed), or
      {"unsupported": reason} when this engine or file is not one the fast
      path handles; nothing was changed then.
    """
    start = time.perf_counter()
    config = self.vllm_config  # pylint: disable=no-member
    model = self.model_runner.model  # pylint: disable=no-member
    try:
      shared_weights.check_engine(config)
      shared = shared_weights.open_shared(path)
      steps = shared_weights.plan(model, shared)
    except shared_weights.Unsupported as e:
      return {"unsupported": str(e)}
    if isinstance(changed, str):
      changed = json.loads(changed)
    if changed is not None:
      unknown = sorted(set(changed) - set(shared.entries))
      if unknown:
        raise ValueError(
            f"rljax_apply_shared_weights: changed={unknown[:3]} are not "
            f"tensors of {path!r}; expected names from its header")
    counts = shared_weights.apply(model, shared, steps, changed,
                                  config.model_config.dtype)
    for reset in ("reset_encoder_cache", "reset_mm_cache"):
      getattr(self.model_runner, reset, lambda: None)()  # pylint: disable=no-member
    counts["seconds"] = time.perf_counter() - start
    return counts


def _rebuild_heads_on_cpu(model) -> int:
  from vllm.platforms import current_platform  # pylint: disable=g-import-not-at-top
  if not current_platform.is_cpu():
    return 0
  return shared_weights.rebuild_lm_heads(model)
