"""Weight syncs into a vLLM server's checkpoint format.

`WeightSync` holds what a server's checkpoint dir declares (its tensors,
weight format and vocabulary) and turns new weights into exactly those
tensors; `timed_sync` writes them as safetensors shards to a fresh tmpfs
dir, has the server(s) reload it and times each phase.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Mapping

import numpy as np

from rljax.models import safetensors_io
from rljax.rollout import weight_sync
from rljax.rollout.base import SyncStats
from rljax.rollout.vllm.config import _MODE_ALIASES
from rljax.rollout.vllm.config import checkpoint_quant_mode


def _is_hf_state_dict(params: Any) -> bool:
  return (
    isinstance(params, Mapping)
    and bool(params)
    and all(
      isinstance(k, str) and hasattr(v, "shape") for k, v in params.items()
    )
  )


class WeightSync:
  """New weights as the tensors of the checkpoint one server runs.

  Attributes:
    model_dir: the HF checkpoint dir.
    manifest: its tensors (name, shape, dtype): what a sync must match.
    quant_mode: its weight format ("bf16", "f16", "f32", "int8", "fp8").
    vocab_size: from its config.json (None if absent).
  """

  def __init__(
    self, model_dir: str, check_finite: bool = True, model_config: Any = None
  ):
    """Reads the checkpoint dir.

    Args:
      model_dir: the HF checkpoint dir the server runs.
      check_finite: refuse NaN/inf weights.
      model_config: `rljax.models.ModelConfig` that converts params trees;
        default read from model_dir when first needed.
    """
    self.model_dir = model_dir
    self.manifest = weight_sync.CheckpointManifest.from_dir(model_dir)
    self.quant_mode = checkpoint_quant_mode(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
      self.vocab_size = json.load(f).get("vocab_size")
    self._check_finite = check_finite
    self._model_config = model_config

  def prepare(
    self, params: Any, quant_mode: str | None, engine: str
  ) -> dict[str, np.ndarray]:
    """HF name -> array in checkpoint format, checked against the manifest.

    Args:
      params: an HF state dict (name -> array: float tensors for a float
        checkpoint; int8/fp8 codes + float32 `*.weight_scale` for a
        compressed-tensors one), or an rljax params tree (full precision, or
        `quant.quantize_params` output for int8/fp8), converted with
        `models.to_hf_state_dict` / `models.compressed_tensors_state_dict`.
      quant_mode: None (the checkpoint's format) or that same format.
      engine: the engine, as error messages name it.
    """
    mode = self._resolve_mode(quant_mode, engine)
    context = f"{engine} weight sync"
    if _is_hf_state_dict(params):
      state_dict = params
    elif isinstance(params, Mapping):
      config = self._rljax_model_config()
      from rljax import models  # pylint: disable=g-import-not-at-top

      if mode in ("int8", "fp8"):
        state_dict = models.compressed_tensors_state_dict(
          config, params, mode=mode, dtype=self._float_dtype_name()
        )
      else:
        state_dict = models.to_hf_state_dict(config, params)
    else:
      raise TypeError(
        f"{context}: params is a {type(params).__name__}; "
        "expected an HF state dict or an rljax params tree"
      )
    return weight_sync.prepare_tensors(
      state_dict, self.manifest, self._check_finite, context
    )

  def _resolve_mode(self, quant_mode: str | None, engine: str) -> str:
    if quant_mode is None:
      return self.quant_mode
    mode = _MODE_ALIASES.get(quant_mode, quant_mode)
    if mode != self.quant_mode:
      raise ValueError(
        f"{engine}: update_weights(quant_mode="
        f"{quant_mode!r}) but the engine runs a {self.quant_mode} "
        f"checkpoint ({self.model_dir}); vLLM cannot change the weight "
        f"format at a sync: launch a sidecar from a {mode} export instead"
      )
    return mode

  def _rljax_model_config(self) -> Any:
    if self._model_config is None:
      from rljax import models  # pylint: disable=g-import-not-at-top

      self._model_config = models.ModelConfig.from_hf(self.model_dir)
    return self._model_config

  def _float_dtype_name(self) -> str:
    floats = [
      s.dtype
      for s in self.manifest.specs.values()
      if weight_sync.is_float_dtype(s.dtype) and s.dtype.itemsize > 1
    ]
    names = [np.dtype(d).name for d in floats]
    return max(set(names), key=names.count) if names else "bfloat16"


def write_sync_dir(
  sync_dirs: weight_sync.SyncDirs,
  tensors: Mapping[str, np.ndarray],
  shard_bytes: int,
) -> tuple[str, int]:
  """Writes tensors to a fresh sync dir; returns (path, bytes)."""
  nbytes = sum(a.nbytes for a in tensors.values())
  path = sync_dirs.new(nbytes)
  try:
    written = safetensors_io.write_checkpoint(tensors, path, shard_bytes)
  except BaseException:
    sync_dirs.discard(path)
    raise
  return path, written


def timed_sync(
  prepare: Callable[[], Mapping[str, np.ndarray]],
  sync_dirs: weight_sync.SyncDirs,
  shard_bytes: int,
  reload: Callable[[str], None],
) -> tuple[SyncStats, dict[str, float]]:
  """prepare() -> write a sync dir -> reload(path); returns the sync's
  stats and its phases (prepare_s, write_s, reload_s, seconds, bytes).

  The dir is kept as the current one even when the reload failed: a
  restarted engine re-reads it.
  """
  start = time.perf_counter()
  tensors = prepare()
  prepared = time.perf_counter()
  path, nbytes = write_sync_dir(sync_dirs, tensors, shard_bytes)
  written = time.perf_counter()
  try:
    reload(path)
  finally:
    sync_dirs.commit(path)
  end = time.perf_counter()
  timing = {
    "prepare_s": prepared - start,
    "write_s": written - prepared,
    "reload_s": end - written,
    "seconds": end - start,
    "bytes": nbytes,
  }
  return SyncStats(seconds=end - start, bytes=nbytes), timing
