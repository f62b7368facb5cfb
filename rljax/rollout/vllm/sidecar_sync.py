"""The weight-sync half of `VLLMSidecar` (its base class `SidecarSync`):
new weights for the running server.

  prepare_weights   params -> the exact tensors of a sync, in the checkpoint's
                    format (`sync.WeightSync.prepare`)
  update_weights    the changed tensors into the shared weights file in tmpfs
                    (`sync.SharedWeights`), applied in place by rljax's worker
                    extension, or by vLLM's reload where it cannot; prefix
                    cache reset and probe (`client.EngineClient.settle`)
  _apply_in_flight  the same while generation is paused with requests kept
                    (`generate_inflight`, `inflight`)
  load_weights_dir  a reload from a checkpoint-format dir

The server's launch, health and restart and the generation requests are
`sidecar`'s (`VLLMSidecar`); the requests themselves are `client`'s.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from rljax.rollout.base import SyncStats
from rljax.rollout.vllm.sync import SharedWeights
from rljax.rollout.vllm.sync import timed_shared_sync


class SidecarSync:
  """The weight syncs of `VLLMSidecar` (its base class).

  They run under the sidecar's `_lock` through its `_client`, check weights
  with its `_weights` (`sync.WeightSync`), and keep the sync state that
  `VLLMSidecar.__init__` sets up and `restart` reads: `_shared` (the
  weights file, made at the first sync), `_last_weights_dir` (what a
  restart reloads), `fast_sync_unsupported` and `last_sync_timing`.
  """

  def prepare_weights(self, params: Any) -> dict[str, np.ndarray]:
    """The exact tensors a sync writes: HF name -> array in checkpoint
    format, checked against the engine's checkpoint and its weight format
    (`quant_mode`; see `sync.WeightSync.prepare`)."""
    return self._weights.prepare(params, f"VLLMSidecar {self.describe()}")

  def update_weights(self, params: Any) -> SyncStats:
    """Pushes new weights: check, copy the tensors that changed into the
    sidecar's weights file in tmpfs, have the engine apply them, reset the
    prefix cache.

    The engine applies them in place with rljax's worker extension
    (`rljax_apply_shared_weights`: no loader, only the modules whose tensors
    changed); where the extension is older or answers that it cannot (see
    `fast_sync_unsupported`), it reloads the same file with vLLM's reload.

    Args:
      params: prepared rollout weights (`quant.prepare_rollout_weights` for
        this engine's `quant_mode`) or an HF state dict; see
        `prepare_weights`.

    Returns:
      SyncStats: wall seconds of the whole sync (conversion included) and
      bytes of weights written for the engine (the tensors that changed
      since the last sync it applied; all of them at the first). The
      breakdown is in `last_sync_timing`.

    Raises:
      ValueError / TypeError: the weights do not match the engine's
        checkpoint (nothing was sent).
      SidecarError: the server failed to reload them.
    """
    with self._lock:
      self._require_usable("syncing weights")
      if self._shared is None:
        self._shared = SharedWeights(self._sync_dirs, self._weights.manifest)
      stats, self.last_sync_timing = timed_shared_sync(
        lambda: self.prepare_weights(params), self._shared, self._apply_shared
      )
      return stats

  def _apply_in_flight(self, tensors: dict[str, np.ndarray]) -> dict:
    """Applies prepared tensors while generation is paused with requests
    kept: no prefix-cache reset (their blocks are held) and no probe (it
    would wait for the resume); `generate_inflight` settles at its end."""
    if self._shared is None:
      self._shared = SharedWeights(self._sync_dirs, self._weights.manifest)
    stats, timing = timed_shared_sync(
      lambda: tensors,
      self._shared,
      lambda changed: self._apply_shared(changed, settle=False),
    )
    self.last_sync_timing = timing
    return {"seconds": stats.seconds, "bytes": stats.bytes}

  def _apply_shared(
    self, changed: list[str], settle: bool = True
  ) -> dict[str, Any]:
    """The engine takes the shared file's weights: in place where the worker
    extension can, else by vLLM's reload of the file. settle: reset the
    prefix cache and probe after (`EngineClient.settle`)."""
    shared = self._shared
    # Recorded first: if this sidecar is down, restart() loads these.
    self._last_weights_dir = shared.path
    client = self._client
    if client.extension_version >= 2 and self.fast_sync_unsupported is None:
      report = client.apply_shared(shared.file, changed, settle)
      if "unsupported" not in report:
        return report
      self.fast_sync_unsupported = str(report["unsupported"])
      logging.warning(
        "vLLM sidecar %s: in-place weight sync unsupported (%s); reloading "
        "through vLLM's loader instead (slower)",
        self.describe(),
        self.fast_sync_unsupported,
      )
    client.reload(shared.path, settle)
    return {"vllm_reload": 1}

  def load_weights_dir(self, path: str) -> None:
    """Reloads weights from a checkpoint-format dir (the server must be able
    to read path), then resets the prefix cache."""
    with self._lock:
      # Recorded first: if this sidecar is down, restart() loads these.
      self._last_weights_dir = path
      self._require_usable("syncing weights")
      if self._shared is not None:
        # The engine then runs what it reloads (the shared file's bytes
        # only when that is the path).
        self._shared.in_sync = False
      self._client.reload(path)
      if self._shared is not None and path == self._shared.path:
        self._shared.in_sync = True
