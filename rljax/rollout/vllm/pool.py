"""`VLLMSidecarPool`: one rollout over several sidecars."""

from __future__ import annotations

import concurrent.futures
import time
import weakref
from typing import Any, Sequence

import numpy as np

from rljax.rollout import weight_sync
from rljax.rollout.base import RolloutBatch
from rljax.rollout.base import SamplingConfig
from rljax.rollout.base import SyncStats
from rljax.rollout.base import check_prompts
from rljax.rollout.vllm.client import prompt_limits
from rljax.rollout.vllm.client import to_batch
from rljax.rollout.vllm.sidecar import VLLMSidecar
from rljax.rollout.vllm.sync import timed_sync


class VLLMSidecarPool:
  """Several sidecars serving one trainer (`base.RolloutEngine`).

  A rollout is split into contiguous prompt chunks, one per sidecar, run
  concurrently; seeds follow global prompt indices, so the result does not
  depend on the split. A sync writes the weights once and every sidecar
  reloads them from that dir (so `sync_root` must be visible to all: same
  host or a shared filesystem). All sidecars must run the same checkpoint
  format.
  """

  def __init__(
    self,
    sidecars: Sequence[VLLMSidecar],
    sync_root: str | None = None,
    shard_bytes: int = 1 << 30,
  ):
    sidecars = list(sidecars)
    if not sidecars or not all(isinstance(s, VLLMSidecar) for s in sidecars):
      raise TypeError(
        f"VLLMSidecarPool: sidecars={sidecars!r:.120}; "
        "expected a non-empty list of VLLMSidecar"
      )
    first = sidecars[0]
    for s in sidecars[1:]:
      if dict(s.manifest.specs) != dict(first.manifest.specs):
        raise ValueError(
          f"VLLMSidecarPool: {s.describe()} runs a checkpoint "
          f"({s.model_dir}) with other tensors than {first.describe()} "
          f"({first.model_dir}); expected the same model and format"
        )
    self.sidecars = sidecars
    self.shard_bytes = shard_bytes
    self._sync_dirs = weight_sync.SyncDirs(
      sync_root if sync_root is not None else first.config.sync_root,
      prefix="rljax-vllm-pool-sync",
    )
    self._finalizer = weakref.finalize(self, self._sync_dirs.cleanup)
    self.last_sync_timing: dict[str, float] = {}

  @property
  def quant_mode(self) -> str:
    return self.sidecars[0].quant_mode

  def _run_all(self, calls) -> list[Any]:
    """Runs (fn, args) pairs concurrently; raises the first error after all
    finished, noting how many others failed."""
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
      futures = [pool.submit(fn, *args) for fn, args in calls]
      concurrent.futures.wait(futures)
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
      if len(errors) > 1:
        errors[0].add_note(f"({len(errors) - 1} other sidecar(s) failed too)")
      raise errors[0]
    return [f.result() for f in futures]

  def generate(
    self,
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    max_new_tokens_per_sample: Sequence[int] | None = None,
  ) -> RolloutBatch:
    """`VLLMSidecar.generate` with the prompts split over the sidecars."""
    if not isinstance(sampling, SamplingConfig):
      raise TypeError(
        f"VLLMSidecarPool.generate: sampling={sampling!r:.80}; "
        "expected a rljax.rollout.SamplingConfig"
      )
    prompts = check_prompts(prompt_ids, self.sidecars[0].vocab_size)
    limits = prompt_limits(max_new_tokens_per_sample, len(prompts), sampling)
    bounds = np.linspace(0, len(prompts), len(self.sidecars) + 1).astype(int)
    calls = [
      (
        s.generate_rows,
        (
          prompts[lo:hi],
          sampling,
          int(lo),
          None if limits is None else limits[lo:hi],
        ),
      )
      for s, lo, hi in zip(self.sidecars, bounds[:-1], bounds[1:])
      if hi > lo
    ]
    start = time.perf_counter()
    chunks = self._run_all(calls)
    rows = [row for chunk in chunks for row in chunk]
    return to_batch(prompts, rows, sampling, time.perf_counter() - start)

  def update_weights(self, params: Any) -> SyncStats:
    """Converts and writes once, then every sidecar reloads concurrently."""
    stats, self.last_sync_timing = timed_sync(
      lambda: self.sidecars[0].prepare_weights(params),
      self._sync_dirs,
      self.shard_bytes,
      lambda path: self._run_all(
        [(s.load_weights_dir, (path,)) for s in self.sidecars]
      ),
    )
    return stats

  def restart(self) -> None:
    """`VLLMSidecar.restart` for the pool: relaunches the members that are
    not healthy, each reloading the weights of the last sync."""
    self.restart_dead()

  def restart_dead(self) -> list[VLLMSidecar]:
    """Restarts every sidecar that is not healthy; returns them."""
    dead = [s for s in self.sidecars if not s.is_alive()]
    for s in dead:
      s.restart()
    return dead

  def close(self) -> None:
    for s in self.sidecars:
      s.close()
    self._finalizer()

  def __enter__(self) -> "VLLMSidecarPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
