"""`VLLMSidecar`: one vLLM server as a rollout engine (see `vllm_sidecar`).

A thin façade over `process` (the server: launch, supervise, stop),
`client` (requests: start-up checks, rollout fan-out, reloads) and `sync`
(weights in the checkpoint's format); it serializes calls and keeps the
state a restart needs (the weights of the last sync). This module holds the
server's lifecycle (launch or attach, health, restart, close) and the
generation requests; the weight syncs are its base class's
(`sidecar_sync.SidecarSync`).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import threading
import time
import weakref
from typing import Any, Sequence

from rljax.rollout import weight_sync
from rljax.rollout.base import RolloutBatch
from rljax.rollout.base import SamplingConfig
from rljax.rollout.base import check_prompts
from rljax.rollout.vllm import guard
from rljax.rollout.vllm import inflight
from rljax.rollout.vllm.client import EngineClient
from rljax.rollout.vllm.client import Row
from rljax.rollout.vllm.client import prompt_limits
from rljax.rollout.vllm.client import to_batch
from rljax.rollout.vllm.config import INFLIGHT_KV_MODES
from rljax.rollout.vllm.config import VLLMSidecarConfig
from rljax.rollout.vllm.process import LaunchedServer
from rljax.rollout.vllm.process import Server
from rljax.rollout.vllm.sidecar_sync import SidecarSync
from rljax.rollout.vllm.sync import SharedWeights
from rljax.rollout.vllm.sync import WeightSync


class VLLMSidecar(SidecarSync):
  """One vLLM server used as a rollout engine (`base.RolloutEngine`).

  Construct with an HF checkpoint dir to launch a server (bf16, or an INT8 /
  FP8 compressed-tensors export); `VLLMSidecar.attach(url, ...)` uses a running
  one. Thread-safe: generation and weight syncs are serialized.

  Reproducibility (vLLM 0.32). Every prompt's request carries its own seed
  (derived from `SamplingConfig.seed` and the prompt's global index), and
  vLLM draws a request's sampling noise from that seed alone: on the CPU
  backend, one 64-bit seed per decoding step from the request's generator
  feeds a per-(seed, token) Gumbel-max kernel; on GPUs, the request's
  generator fills its own row of exponential noise. The noise is therefore
  independent of the batch. The logits are not: vLLM only promises
  batch-invariant numerics with `VLLM_BATCH_INVARIANT=1`, on GPUs
  (`batch_invariant=True`), and a server batches concurrent requests as they
  arrive. On CPUs whose matmul kernels depend on the batch (Intel AMX: vLLM
  routes small bf16 projections to a kernel that switches from AVX-512 to
  AMX tiles above 4 rows, larger ones to oneDNN), the same seeded request can
  sample other tokens when it shares the engine with other requests or hits
  cached prefix blocks. What holds everywhere: a seeded request that runs
  alone on the engine (one prompt, n=1, nothing else in flight) reproduces
  its tokens; `fresh_prefix_cache` (default) makes repeated calls start from
  the same cache state. On AVX-512 machines without AMX, batched seeded
  rollouts have been seen to reproduce too, but nothing guarantees it.

  Composed of one object per concern: the server's process
  (`process.LaunchedServer`, or `process.Server` when attached), the
  requests to it (`client.EngineClient`) and the conversion of weights to
  its checkpoint (`sync.WeightSync`).

  Attributes:
    config: launch and request settings.
    model_dir, vocab_size, quant_mode, manifest: the checkpoint the server
      runs (dir, vocabulary, weight format "bf16"/"int8"/..., tensors);
      syncs must match it.
    api_key: the bearer token the server requires (a launched sidecar's
      random run key), for other clients of it, e.g. a judge reward.
    max_model_len: longest prompt + response the server accepts.
    startup_seconds: wall time of the last (re)start until healthy.
    last_sync_timing: phases of the last `update_weights`.
    fast_sync_unsupported: why the running server's worker extension cannot
      apply shared weights in place (syncs then use vLLM's reload), or None.
  """

  def __init__(
    self,
    model_dir: str | os.PathLike | None = None,
    config: VLLMSidecarConfig | None = None,
    *,
    url: str | None = None,
    model_config: Any = None,
  ):
    """Launches a sidecar on model_dir, or attaches to url.

    Args:
      model_dir: HF checkpoint dir the server starts from. When attaching,
        optional: a local copy of the server's checkpoint (default: the
        `root` the server reports, if readable here).
      config: launch and request settings.
      url: attach to this running server (http://host:port) instead.
      model_config: `rljax.models.ModelConfig` used to convert params trees
        at sync; default read from model_dir.

    Raises:
      SidecarError: the server did not come up healthy, or lacks what the
        sidecar needs (dev routes, processed log-probs).
    """
    self.config = config if config is not None else VLLMSidecarConfig()
    if not isinstance(self.config, VLLMSidecarConfig):
      raise TypeError(
        f"config={self.config!r:.80}; expected a VLLMSidecarConfig"
      )
    self._model_config = model_config
    self._lock = threading.RLock()
    self._closed = False
    self._last_weights_dir: str | None = None
    # The weights file the engine syncs from (made at the first sync).
    self._shared: SharedWeights | None = None
    self.fast_sync_unsupported: str | None = None
    self._sync_dirs = weight_sync.SyncDirs(
      self.config.sync_root, prefix="rljax-vllm-sync"
    )
    self.last_sync_timing: dict[str, float] = {}
    self.startup_seconds: float | None = None
    self.max_model_len = self.config.max_model_len
    self.model_dir = self.vocab_size = self.quant_mode = self.manifest = None
    self._weights: WeightSync | None = None
    if url is None:
      if model_dir is None:
        raise ValueError(
          "VLLMSidecar: pass model_dir (to launch a server) or "
          "url (to attach to one)"
        )
      self.api_key = self.config.api_key or secrets.token_urlsafe(32)
      model_dir = os.path.abspath(os.fspath(model_dir))
      if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise FileNotFoundError(
          f"VLLMSidecar: {model_dir!r} has no config.json; expected an "
          "HF checkpoint directory"
        )
      self._weights = WeightSync(
        model_dir, self.config.check_finite, model_config
      )
      self._server = LaunchedServer(
        model_dir, self.config, self.api_key, self._sync_dirs.glob_pattern
      )
    else:
      self.api_key = (
        self.config.api_key or os.environ.get("VLLM_API_KEY") or None
      )
      self._server = Server(url)
      if model_dir is not None:
        self.model_dir = os.path.abspath(os.fspath(model_dir))
    self._client: EngineClient  # of the server's current launch: _connect
    # Every server this sidecar launched (a restart adds one): close(), the
    # garbage collector or interpreter exit stop them all.
    self._finalizer = weakref.finalize(
      self, guard.shutdown, self._server.launched, self._sync_dirs
    )
    start = time.perf_counter()
    self._server.start(self._connect)
    self.startup_seconds = time.perf_counter() - start
    weights = self._weights
    self.model_dir, self.vocab_size = weights.model_dir, weights.vocab_size
    self.quant_mode, self.manifest = weights.quant_mode, weights.manifest

  @classmethod
  def attach(
    cls,
    url: str,
    model_dir: str | os.PathLike | None = None,
    config: VLLMSidecarConfig | None = None,
    model_config: Any = None,
  ) -> "VLLMSidecar":
    """Uses a vLLM server that is already running at url (not owned: close()
    leaves it running). It must run with `VLLM_SERVER_DEV_MODE=1` and
    `--logprobs-mode processed_logprobs`."""
    return cls(model_dir, config, url=url, model_config=model_config)

  # -- identity ---------------------------------------------------------------

  @property
  def url(self) -> str:
    return self._server.url

  @property
  def pid(self) -> int | None:
    return self._server.pid

  @property
  def log_path(self) -> str | None:
    return self._server.log_path

  def describe(self) -> str:
    return self._server.describe()

  def __repr__(self) -> str:
    return f"VLLMSidecar({self.describe()}, {self.quant_mode})"

  # -- lifecycle --------------------------------------------------------------

  def _connect(self) -> None:
    """Waits until the server is healthy and checks that it serves what the
    sidecar needs; then routes requests through a fresh client."""
    client = EngineClient(self._server, self.config, self.api_key)
    client.wait_healthy(time.perf_counter() + self.config.startup_timeout_s)
    card = client.model_card()
    self.max_model_len = int(
      card.get("max_model_len") or self.config.max_model_len
    )
    if self._weights is None:  # attached: the checkpoint it reports
      root = self.model_dir or card.get("root")
      if not (root and os.path.isdir(root)):
        raise ValueError(
          f"VLLMSidecar.attach({self.url}): the server's checkpoint "
          f"{root!r} is not readable here; pass model_dir= (a local copy) "
          "so weight syncs can be checked against it"
        )
      self._weights = WeightSync(
        os.path.abspath(root), self.config.check_finite, self._model_config
      )
    client.check_server(
      self._weights.quant_mode,
      self._weights.vocab_size,
      attached=not isinstance(self._server, LaunchedServer),
    )
    self._client = client

  def _require_usable(self, action: str) -> None:
    if self._closed:
      raise RuntimeError(
        f"VLLMSidecar {self.describe()}: {action} after close()"
      )
    if self._client.broken:
      raise self._server.failure(
        action, f"it is unusable since {self._client.broken}; call restart()"
      )
    if self._server.exited():
      raise self._server.failure(
        action, "the server process is not running; call restart()"
      )

  def is_alive(self) -> bool:
    """True when the server answers /health (and, if launched, runs)."""
    if self._closed or self._server.exited():
      return False
    return self._client.http.is_healthy()

  def restart(self) -> None:
    """Relaunches the server (or, attached, waits for it to be healthy
    again), then reloads the weights of the last sync."""
    with self._lock:
      if self._closed:
        raise RuntimeError(
          f"VLLMSidecar {self.describe()}: restart after close()"
        )
      self._server.stop()
      if self._shared is not None:
        self._shared.in_sync = False  # the new engine runs model_dir
      start = time.perf_counter()
      self._server.start(self._connect)
      self.startup_seconds = time.perf_counter() - start
      self.fast_sync_unsupported = None
      if self._last_weights_dir is not None:
        self._client.reload(self._last_weights_dir)
        if self._shared is not None:
          self._shared.in_sync = self._last_weights_dir == self._shared.path

  def close(self) -> None:
    """Stops a launched server (its whole process group) and deletes sync
    dirs; an attached server keeps running. Idempotent."""
    with self._lock:
      if not self._closed:
        self._closed = True
        if self._shared is not None:
          self._shared.close()
        self._finalizer()

  def __enter__(self) -> "VLLMSidecar":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # -- generation -------------------------------------------------------------

  def generate(
    self,
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    max_new_tokens_per_sample: Sequence[int] | None = None,
    *,
    weight_updates: Any = None,
    version: int = 0,
  ) -> RolloutBatch:
    """Samples `sampling.n` responses per prompt (see `base.RolloutBatch`).

    `max_new_tokens_per_sample` (P·n ints in [1, max_new_tokens], row
    order) caps each sample, as `JaxSampler.generate`'s; a prompt's n
    samples are one request here, so they must share their cap.

    With `weight_updates`: `generate_inflight` (the keywords of
    `JaxSampler.generate`, so `Actor.generate_inflight` drives either).

    Raises:
      ValueError: bad prompts, caps, or prompt + max_new_tokens >
        max_model_len.
      SidecarError: the server died, timed out or failed the request.
    """
    if weight_updates is not None:
      if max_new_tokens_per_sample is not None:
        raise ValueError(
          "VLLMSidecar.generate: max_new_tokens_per_sample with "
          "weight_updates; expected one or the other"
        )
      return self.generate_inflight(
        prompt_ids, sampling, weight_updates, version=version
      )
    prompts = self._checked_prompts(prompt_ids, sampling, "generate")
    limits = prompt_limits(max_new_tokens_per_sample, len(prompts), sampling)
    start = time.perf_counter()
    rows = self.generate_rows(prompts, sampling, 0, limits)
    return to_batch(prompts, rows, sampling, time.perf_counter() - start)

  def generate_inflight(
    self,
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    weight_updates: Any,
    version: int = 0,
    inflight_kv: str | None = None,
  ) -> RolloutBatch:
    """Samples as `generate`, taking new weights while requests run.

    `weight_updates` is polled every `config.inflight_poll_s` while
    requests are unfinished: None, or (params, new_version >= the current
    one), params as `update_weights` takes them. The sidecar converts them
    while the engine generates, then pauses generation keeping the requests
    (vLLM's `/pause?mode=keep`), applies the weights in place, labels them
    `new_version` and resumes; running requests keep or recompute their KV
    (`config.inflight_kv`). The engine keeps the last weights taken.

    Args:
      prompt_ids: prompts (token ids).
      sampling: how to sample.
      weight_updates: the hook (see above).
      version: the version of the weights the engine runs now.
      inflight_kv: "keep" or "recompute"; default `config.inflight_kv`.

    Returns:
      The batch with `policy_version` (each token's version, as vLLM's
      per-token `weight_versions` spans report it) and timing figures
      `weight_swaps`, `swap_requests_in_flight`, `swap_pause_seconds`,
      `swap_prepare_seconds`, `final_version`.

    Raises:
      ValueError / TypeError: bad prompts, hook, update or version.
      SidecarError: the server failed, or does not serve the
        `/inference/v1/generate` route (`config.inflight_routes`).
    """
    prompts = self._checked_prompts(prompt_ids, sampling, "generate_inflight")
    hook = inflight.check_hook(weight_updates)
    kv = self._inflight_kv(inflight_kv, "generate_inflight")
    with self._lock:
      self._require_usable("generating with in-flight updates")
      self._check_lengths(prompts, sampling, 0)
      run = inflight.InflightRun(self._client, version, kv)
      start = time.perf_counter()
      rows = inflight.generate(
        run,
        prompts,
        sampling,
        0,
        hook,
        self.prepare_weights,
        self._apply_in_flight,
      )
      seconds = time.perf_counter() - start
      if run.swap_requests_in_flight:
        # Blocks of the old weights stay cached; the probe checks the
        # engine as after every sync.
        self._client.settle("in-flight weight updates", self._shared.path)
    batch = to_batch(prompts, [r[:3] for r in rows], sampling, seconds)
    return dataclasses.replace(
      batch,
      timing={**batch.timing, **run.stats()},
      policy_version=[r[3] for r in rows],
    )

  def generate_stream(
    self,
    feed: Any,
    shape_prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    *,
    weight_updates: Any = None,
    version: int = 0,
    inflight_kv: str | None = None,
  ) -> dict[str, Any]:
    """A streamed run (`rljax.rollout.prompt_feed`), as
    `JaxSampler.generate_stream` runs one: each prompt `feed.poll` admits
    is sent as its own request at once (vLLM's scheduler batches running
    requests, so it joins while others decode), each prompt's n rows go to
    `feed.done` as its request ends, with the finish reasons and per-token
    weight versions vLLM reports, and new weights from `weight_updates`
    are taken in flight as `generate_inflight` takes them. Returns when the
    feed has nothing more and every request ended (or `feed.stopped()`),
    with the run's swap figures and `final_version`. `shape_prompts` is
    checked, not used (vLLM has no shapes to fix); `sampling.seed` is
    unused: each prompt brings its request's seed."""
    self._checked_prompts(shape_prompts, sampling, "generate_stream")
    hook = inflight.check_hook(
      (lambda: None) if weight_updates is None else weight_updates
    )
    kv = self._inflight_kv(inflight_kv, "generate_stream")
    with self._lock:
      self._require_usable("streaming with in-flight updates")
      run = inflight.InflightRun(self._client, version, kv)
      start = time.perf_counter()
      inflight.stream(
        run, feed, sampling, self.max_model_len - sampling.max_new_tokens,
        hook, self.prepare_weights, self._apply_in_flight,
      )  # fmt: skip
      if run.swap_requests_in_flight:
        self._client.settle("in-flight weight updates", self._shared.path)
    return {
      **run.stats(),
      "requests": len(run.sent),
      "seconds": time.perf_counter() - start,
    }

  def _inflight_kv(self, inflight_kv: str | None, what: str) -> str:
    """The call's KV rule: `inflight_kv`, else the config's; checked."""
    kv = self.config.inflight_kv if inflight_kv is None else inflight_kv
    if kv not in INFLIGHT_KV_MODES:
      raise ValueError(
        f"VLLMSidecar.{what}: inflight_kv={kv!r}; expected one of "
        f"{INFLIGHT_KV_MODES}"
      )
    return kv

  def _checked_prompts(self, prompt_ids, sampling, what) -> list[list[int]]:
    if not isinstance(sampling, SamplingConfig):
      raise TypeError(
        f"VLLMSidecar.{what}: sampling={sampling!r:.80}; "
        "expected a rljax.rollout.SamplingConfig"
      )
    return check_prompts(prompt_ids, self.vocab_size)

  def _check_lengths(self, prompts, sampling, first_index) -> None:
    limit = self.max_model_len
    for i, prompt in enumerate(prompts):
      if len(prompt) + sampling.max_new_tokens > limit:
        raise ValueError(
          f"VLLMSidecar.generate: prompt {first_index + i} has "
          f"{len(prompt)} tokens + max_new_tokens="
          f"{sampling.max_new_tokens} > max_model_len={limit}; expected "
          "shorter prompts or a larger VLLMSidecarConfig.max_model_len"
        )

  def generate_rows(
    self,
    prompts: list[list[int]],
    sampling: SamplingConfig,
    first_index: int = 0,
    limits: Sequence[int] | None = None,
  ) -> list[Row]:
    """(response ids, behav_logp, finish reason) for prompt-major samples.

    `first_index` is the index of prompts[0] in the whole rollout: seeds
    derive from global prompt indices, so a rollout split over sidecars
    samples exactly what one sidecar would. `limits`: each prompt's
    max_new_tokens (None: sampling's).
    """
    with self._lock:
      self._require_usable("generating")
      self._check_lengths(prompts, sampling, first_index)
      return self._client.generate_rows(prompts, sampling, first_index, limits)
