"""Weight sync directories: converted tensors written as safetensors
shards to a fresh tmpfs dir that the server reloads from."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from rljax.models import safetensors_io
from rljax.rollout import weight_sync


def _is_hf_state_dict(params: Any) -> bool:
  return (
    isinstance(params, Mapping)
    and bool(params)
    and all(
      isinstance(k, str) and hasattr(v, "shape") for k, v in params.items()
    )
  )


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
