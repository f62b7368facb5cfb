"""`VLLMSidecar`: one vLLM server as a rollout engine (see `vllm_sidecar`).

HTTP fan-out of the completions, weight sync (check, write, reload),
health checks and restart, on top of `process` and `config`.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Mapping, Sequence

import numpy as np

from rljax.rollout import weight_sync
from rljax.rollout.base import RolloutBatch
from rljax.rollout.base import SamplingConfig
from rljax.rollout.base import SyncStats
from rljax.rollout.base import check_prompts
from rljax.rollout.vllm_client import VLLMClient
from rljax.rollout.vllm_client import VLLMRequestError
from rljax.rollout.vllm_client import completion_request
from rljax.rollout.vllm_client import parse_completion
from rljax.rollout.vllm.config import SidecarError
from rljax.rollout.vllm.config import VLLMSidecarConfig
from rljax.rollout.vllm.config import _MODE_ALIASES
from rljax.rollout.vllm.config import checkpoint_quant_mode
from rljax.rollout.vllm.process import AUTH_MIDDLEWARE
from rljax.rollout.vllm.process import EXTENSION_CLASS
from rljax.rollout.vllm.process import EXTENSION_DIR
from rljax.rollout.vllm.process import _free_port
from rljax.rollout.vllm.process import _kill_process_group
from rljax.rollout.vllm.process import _shutdown
from rljax.rollout.vllm.process import guarded_command
from rljax.rollout.vllm.process import is_cpu_build
from rljax.rollout.vllm.process import server_module
from rljax.rollout.vllm.process import summarize_log
from rljax.rollout.vllm.process import vllm_version
from rljax.rollout.vllm.sync import _is_hf_state_dict
from rljax.rollout.vllm.sync import write_sync_dir


def _prompt_seed(seed: int, prompt_index: int) -> int:
  # vLLM seeds sample j of a request with seed + j; a 32-bit hash of
  # (seed, prompt index) keeps every (prompt, sample) stream distinct (up to
  # ~n / 2**32 collisions) and independent of how prompts are split into
  # requests or across sidecars.
  state = np.random.SeedSequence([seed % (1 << 64), prompt_index])
  return int(state.generate_state(1, np.uint32)[0])


class VLLMSidecar:
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
    self._proc: subprocess.Popen | None = None
    self._log_path: str | None = None
    self._launches = 0
    self._closed = False
    self._broken: str | None = None
    self._has_extension = False
    self._last_weights_dir: str | None = None
    self._sync_dirs = weight_sync.SyncDirs(
      self.config.sync_root, prefix="rljax-vllm-sync"
    )
    self.last_sync_timing: dict[str, float] = {}
    self.startup_seconds: float | None = None
    # Every server this sidecar launched (a restart adds one): close(), the
    # garbage collector or interpreter exit stop them all.
    self._launched: list[subprocess.Popen] = []
    self._finalizer = weakref.finalize(
      self, _shutdown, self._launched, self._sync_dirs
    )
    self._log_dir: str | None = None
    if url is None:
      self._api_key = self.config.api_key or secrets.token_urlsafe(32)
    else:
      self._api_key = (
        self.config.api_key or os.environ.get("VLLM_API_KEY") or None
      )
    if url is None:
      if model_dir is None:
        raise ValueError(
          "VLLMSidecar: pass model_dir (to launch a server) or "
          "url (to attach to one)"
        )
      self.model_dir = os.path.abspath(os.fspath(model_dir))
      if not os.path.isfile(os.path.join(self.model_dir, "config.json")):
        raise FileNotFoundError(
          f"VLLMSidecar: {self.model_dir!r} has no config.json; expected an "
          "HF checkpoint directory"
        )
      self._attached = False
      self._read_checkpoint()
      self._launch()
    else:
      self._attached = True
      self._url = url.rstrip("/")
      self._client = VLLMClient(
        self._url, self.config.request_timeout_s, api_key=self._api_key
      )
      self.model_dir = (
        os.path.abspath(os.fspath(model_dir)) if model_dir is not None else None
      )
      start = time.perf_counter()
      self._wait_healthy(time.perf_counter() + self.config.startup_timeout_s)
      self._handshake()
      self.startup_seconds = time.perf_counter() - start

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
    return self._url

  @property
  def api_key(self) -> str | None:
    """The bearer token this server requires (a launched sidecar's random
    run key), for other clients of it, e.g. a judge reward."""
    return self._api_key

  @property
  def pid(self) -> int | None:
    return self._proc.pid if self._proc is not None else None

  @property
  def log_path(self) -> str | None:
    return self._log_path

  @property
  def quant_mode(self) -> str:
    """Weight format the engine holds and syncs carry ("bf16", "int8", ...)."""
    return self._quant_mode

  @property
  def manifest(self) -> weight_sync.CheckpointManifest:
    return self._manifest

  def describe(self) -> str:
    if self._attached:
      return f"{self._url} (attached)"
    return f"{self._url} (pid {self.pid}, log {self._log_path})"

  def __repr__(self) -> str:
    return f"VLLMSidecar({self.describe()}, {self._quant_mode})"

  # -- process ----------------------------------------------------------------

  def _read_checkpoint(self) -> None:
    self._manifest = weight_sync.CheckpointManifest.from_dir(self.model_dir)
    self._quant_mode = checkpoint_quant_mode(self.model_dir)
    with open(os.path.join(self.model_dir, "config.json")) as f:
      self.vocab_size = json.load(f).get("vocab_size")

  def _command(self, port: int) -> list[str]:
    cfg = self.config
    cmd = [
      sys.executable,
      "-m",
      server_module(),
      "--model",
      self.model_dir,
      "--host",
      cfg.host,
      "--port",
      str(port),
      "--served-model-name",
      cfg.served_model_name,
      "--max-model-len",
      str(cfg.max_model_len),
      "--gpu-memory-utilization",
      str(cfg.gpu_memory_utilization),
      "--tensor-parallel-size",
      str(cfg.tensor_parallel_size),
      "--seed",
      str(cfg.seed),
      # behav_logp must be of the distribution sampled from (after
      # temperature / top-k / top-p), not of the raw logits.
      "--logprobs-mode",
      "processed_logprobs",
      # The checkpoint's generation_config.json must not change sampling.
      "--generation-config",
      "vllm",
      "--disable-uvicorn-access-log",
      # Every route but /health needs the per-run key (VLLM_API_KEY).
      "--middleware",
      AUTH_MIDDLEWARE,
    ]
    if cfg.enforce_eager:
      cmd.append("--enforce-eager")
    if cfg.worker_extension:
      cmd += ["--worker-extension-cls", EXTENSION_CLASS]
    chunked = (
      (not is_cpu_build())
      if cfg.chunked_prefill is None
      else (cfg.chunked_prefill)
    )
    if not chunked and not any("chunked-prefill" in a for a in cfg.extra_args):
      cmd.append("--no-enable-chunked-prefill")
      if not any(
        a.startswith("--max-num-batched-tokens") for a in cfg.extra_args
      ):
        cmd += ["--max-num-batched-tokens", str(max(cfg.max_model_len, 4096))]
    elif cfg.chunked_prefill and not any(
      "chunked-prefill" in a for a in cfg.extra_args
    ):
      cmd.append("--enable-chunked-prefill")
    return cmd + list(cfg.extra_args)

  def _environment(self) -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{self.config.cpu_kvcache_gib:g}")
    if not os.path.isfile(os.path.join(EXTENSION_DIR, "rljax_vllm_auth.py")):
      raise FileNotFoundError(
        f"VLLMSidecar: rljax's server modules are not in {EXTENSION_DIR!r} "
        "(they ship in the rljax repository, third_party/vllm_ext); use a "
        "source checkout"
      )
    if self.config.worker_extension and not os.path.isdir(
      os.path.join(EXTENSION_DIR, "rljax_vllm_ext")
    ):
      raise FileNotFoundError(
        f"VLLMSidecar: the worker extension is not at {EXTENSION_DIR!r} "
        "(it ships in the rljax repository, third_party/vllm_ext); use a "
        "source checkout or pass VLLMSidecarConfig(worker_extension=False)"
      )
    env["PYTHONPATH"] = os.pathsep.join(
      p for p in (EXTENSION_DIR, env.get("PYTHONPATH")) if p
    )
    if self.config.batch_invariant:
      if is_cpu_build():
        raise ValueError(
          "VLLMSidecarConfig.batch_invariant=True, but the installed vLLM "
          f"({vllm_version()}) is its CPU build: vLLM's batch-invariant "
          "mode needs an NVIDIA (sm80+), AMD Instinct or Intel XPU GPU; "
          "expected batch_invariant=False on CPU"
        )
      env["VLLM_BATCH_INVARIANT"] = "1"
    env.update(dict(self.config.env))
    # After config.env: the key must be the one the client sends. vLLM
    # checks it on /v1/*, rljax_vllm_auth on every other route.
    env["VLLM_API_KEY"] = self._api_key
    return env

  def _launch(self) -> None:
    cfg = self.config
    if self._log_dir is None:
      if cfg.log_dir is None:
        # Not a fixed shared dir under /tmp: a fresh owner-only one.
        self._log_dir = tempfile.mkdtemp(prefix="rljax-vllm-logs-")
      else:
        self._log_dir = os.path.abspath(cfg.log_dir)
        os.makedirs(self._log_dir, mode=0o700, exist_ok=True)
    log_dir = self._log_dir
    env = self._environment()
    start = time.perf_counter()
    attempts = 3 if cfg.port == 0 else 1
    for attempt in range(attempts):
      port = cfg.port or _free_port(cfg.host)
      self._url = f"http://{cfg.host}:{port}"
      self._client = VLLMClient(
        self._url, cfg.request_timeout_s, api_key=self._api_key
      )
      if self._log_path is None:
        # One file per sidecar, kept across its restarts; mkstemp: unique
        # even for sidecars sharing a log_dir, and owner-only.
        fd, self._log_path = tempfile.mkstemp(
          prefix=f"vllm-sidecar-{os.getpid()}-{port}-",
          suffix=".log",
          dir=log_dir,
        )
        os.close(fd)
      self._launches += 1
      command = self._command(port)
      guarded = guarded_command(
        command, os.getpid(), self._sync_dirs.glob_pattern
      )
      with open(self._log_path, "a") as log:
        log.write(
          f"\n=== rljax launch #{self._launches}: {' '.join(command)}\n"
        )
        log.flush()
        # cwd: the log dir, never a directory that could shadow packages on
        # the server's sys.path (`python -m` puts cwd first).
        self._proc = subprocess.Popen(
          guarded,
          stdout=log,
          stderr=subprocess.STDOUT,
          stdin=subprocess.DEVNULL,
          cwd=log_dir,
          env=env,
          start_new_session=True,
        )
      self._launched.append(self._proc)
      try:
        self._wait_healthy(time.perf_counter() + cfg.startup_timeout_s)
        self._handshake()
        break
      except SidecarError as e:
        port_taken = "address already in use" in self._log_tail().lower()
        _kill_process_group(self._proc)
        if not (port_taken and attempt + 1 < attempts):
          raise e
    self.startup_seconds = time.perf_counter() - start

  def _wait_healthy(self, deadline: float) -> None:
    while True:
      if self._proc is not None and self._proc.poll() is not None:
        raise self._failure("starting up", "the server process exited")
      if self._client.is_healthy(timeout_s=5.0):
        return
      if time.perf_counter() > deadline:
        if self._proc is not None:
          _kill_process_group(self._proc)
        raise self._failure(
          "starting up",
          "not healthy after "
          f"{self.config.startup_timeout_s:.0f} s (startup_timeout_s)",
        )
      time.sleep(0.5)

  def _handshake(self) -> None:
    """Checks the served model, the dev routes, the worker extension and the
    log-prob mode."""
    action = "checking the server after start-up"
    try:
      models = self._client.models()
    except VLLMRequestError as e:
      raise self._failure(action, e) from None
    card = next(
      (m for m in models if m.get("id") == self.config.served_model_name), None
    )
    if card is None:
      raise self._failure(
        action,
        (
          f"it serves {[m.get('id') for m in models]}, not "
          f"{self.config.served_model_name!r} (served_model_name)"
        ),
      )
    self.max_model_len = int(
      card.get("max_model_len") or self.config.max_model_len
    )
    if self._attached:
      if self.model_dir is None:
        root = card.get("root")
        if not (root and os.path.isdir(root)):
          raise ValueError(
            f"VLLMSidecar.attach({self._url}): the server's checkpoint "
            f"{root!r} is not readable here; pass model_dir= (a local copy) "
            "so weight syncs can be checked against it"
          )
        self.model_dir = os.path.abspath(root)
      self._read_checkpoint()
    try:
      self._client.reset_prefix_cache(timeout_s=60)
    except VLLMRequestError as e:
      if e.status == 404:
        raise self._failure(
          action,
          (
            "it has no /reset_prefix_cache route; start it with "
            "VLLM_SERVER_DEV_MODE=1 (weight syncs need the dev routes)"
          ),
        ) from None
      raise self._failure(action, e) from None
    self._has_extension = False
    if self.config.worker_extension:
      try:
        self._client.collective_rpc("rljax_extension_info", timeout_s=60)
        self._has_extension = True
      except VLLMRequestError as e:
        if not self._attached:
          raise self._failure(
            action, f"the rljax worker extension did not load: {e}"
          ) from None
    if self._quant_mode == "int8" and not self._has_extension:
      logging.warning(
        "vLLM sidecar %s runs an INT8 checkpoint without rljax's worker "
        "extension (start it with PYTHONPATH=%s --worker-extension-cls %s): "
        "on vLLM's CPU backend INT8 weight reloads then produce garbage, "
        "which the post-sync check reports",
        self.describe(),
        EXTENSION_DIR,
        EXTENSION_CLASS,
      )
    # This request also warms the server up (its first request is several
    # times slower than the next ones).
    self._probe(action)

  def _probe(self, action: str) -> None:
    """One-token generation: finite output and processed log-probs.

    With top_k=1 the distribution actually sampled from is a point mass, so
    the processed log-prob of the sampled token is exactly 0; a raw log-prob
    (vLLM's default mode) is log_softmax(logits) < 0.
    """
    probe = SamplingConfig(n=1, temperature=1.0, top_k=1, max_new_tokens=1)
    prompt = [min(1, (self.vocab_size or 2) - 1)] * 4
    try:
      answer = self._client.complete(
        completion_request(
          self.config.served_model_name, prompt, probe, seed=0
        ),
        timeout_s=self.config.request_timeout_s,
      )
      ((_, logp, _),) = parse_completion(answer, 1)
    except (VLLMRequestError, ValueError) as e:
      raise self._failure(action + " (probe generation)", _explain(e)) from None
    if not np.isfinite(logp[0]):
      raise self._failure(
        action + " (probe generation)", f"non-finite log-prob {logp[0]}"
      )
    if abs(float(logp[0])) > 1e-4:
      raise self._failure(
        action,
        (
          f"sampled-token log-prob {float(logp[0]):.4f} under top_k=1 is not "
          "0: the server does not return processed log-probs; run it with "
          "--logprobs-mode processed_logprobs"
        ),
      )

  def _log_tail(self) -> str:
    if not self._log_path or not os.path.isfile(self._log_path):
      return ""
    with open(self._log_path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 256 * 1024))
      lines = f.read().decode(errors="replace").splitlines()
    for i in range(len(lines) - 1, -1, -1):  # only this launch's lines
      if lines[i].startswith("=== rljax launch #"):
        lines = lines[i + 1 :]
        break
    return summarize_log(lines)

  def _failure(self, action: str, cause: Any) -> SidecarError:
    parts = [f"vLLM sidecar {self.describe()} failed while {action}: {cause}"]
    if self._proc is not None and self._proc.poll() is not None:
      parts.append(f"its process exited with code {self._proc.returncode}")
    tail = self._log_tail()
    if tail:
      parts.append(f"last log lines:\n{tail}")
    if self._log_path:
      parts.append(f"full log: {self._log_path}")
    return SidecarError(
      "\n".join(parts),
      url=self._url,
      pid=self.pid,
      log_path=self._log_path,
      action=action,
    )

  def _require_usable(self, action: str) -> None:
    if self._closed:
      raise RuntimeError(
        f"VLLMSidecar {self.describe()}: {action} after close()"
      )
    if self._broken:
      raise self._failure(
        action, (f"it is unusable since {self._broken}; call restart()")
      )
    if self._proc is not None and self._proc.poll() is not None:
      raise self._failure(
        action, "the server process is not running; call restart()"
      )

  def is_alive(self) -> bool:
    """True when the server answers /health (and, if launched, runs)."""
    if self._closed:
      return False
    if self._proc is not None and self._proc.poll() is not None:
      return False
    return self._client.is_healthy()

  def restart(self) -> None:
    """Relaunches the server (or, attached, waits for it to be healthy
    again), then reloads the weights of the last sync."""
    with self._lock:
      if self._closed:
        raise RuntimeError(
          f"VLLMSidecar {self.describe()}: restart after close()"
        )
      if self._attached:
        self._wait_healthy(time.perf_counter() + self.config.startup_timeout_s)
        self._handshake()
      else:
        _kill_process_group(self._proc)
        self._launch()
      self._broken = None
      if self._last_weights_dir is not None:
        self._load_dir(self._last_weights_dir)

  def close(self) -> None:
    """Stops a launched server (its whole process group) and deletes sync
    dirs; an attached server keeps running. Idempotent."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
      if self._attached:
        self._finalizer.detach()
        self._sync_dirs.cleanup()
      else:
        self._finalizer()

  def __enter__(self) -> "VLLMSidecar":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # -- generation -------------------------------------------------------------

  def generate(
    self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
  ) -> RolloutBatch:
    """Samples `sampling.n` responses per prompt (see `base.RolloutBatch`).

    Raises:
      ValueError: bad prompts, or prompt + max_new_tokens > max_model_len.
      SidecarError: the server died, timed out or failed the request.
    """
    if not isinstance(sampling, SamplingConfig):
      raise TypeError(
        f"VLLMSidecar.generate: sampling={sampling!r:.80}; "
        "expected a rljax.rollout.SamplingConfig"
      )
    prompts = check_prompts(prompt_ids, self.vocab_size)
    start = time.perf_counter()
    rows = self.generate_rows(prompts, sampling, first_index=0)
    return _to_batch(prompts, rows, sampling, time.perf_counter() - start)

  def generate_rows(
    self,
    prompts: list[list[int]],
    sampling: SamplingConfig,
    first_index: int = 0,
  ) -> list[tuple[list[int], np.ndarray, str]]:
    """(response ids, behav_logp, finish reason) for prompt-major samples.

    `first_index` is the index of prompts[0] in the whole rollout: seeds
    derive from global prompt indices, so a rollout split over sidecars
    samples exactly what one sidecar would.
    """
    with self._lock:
      self._require_usable("generating")
      limit = self.max_model_len
      for i, prompt in enumerate(prompts):
        if len(prompt) + sampling.max_new_tokens > limit:
          raise ValueError(
            f"VLLMSidecar.generate: prompt {first_index + i} has "
            f"{len(prompt)} tokens + max_new_tokens="
            f"{sampling.max_new_tokens} > max_model_len={limit}; expected "
            "shorter prompts or a larger VLLMSidecarConfig.max_model_len"
          )
      name = self.config.served_model_name
      bodies = [
        completion_request(
          name, p, sampling, _prompt_seed(sampling.seed, first_index + i)
        )
        for i, p in enumerate(prompts)
      ]
      action = (
        f"generating {len(prompts)} prompts x n={sampling.n}, "
        f"max_new_tokens={sampling.max_new_tokens}"
      )
      if self.config.fresh_prefix_cache:
        try:
          # False (nothing reset) while another client's requests hold
          # blocks: harmless, this call just may reuse their cache.
          self._client.reset_prefix_cache(timeout_s=60)
        except VLLMRequestError as e:
          raise self._failure(action, _explain(e)) from None
      workers = min(len(bodies), self.config.max_concurrent_requests)
      results: list[Any] = [None] * len(bodies)
      pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(workers, 1), thread_name_prefix="vllm-request"
      )
      try:
        futures = {
          pool.submit(self._client.complete, body): i
          for i, body in enumerate(bodies)
        }
        done = concurrent.futures.as_completed(futures)
        if self.config.show_progress:
          import tqdm  # pylint: disable=g-import-not-at-top

          done = tqdm.tqdm(
            done, total=len(futures), desc="vllm rollout", unit="prompt"
          )
        for future in done:
          i = futures[future]
          try:
            results[i] = parse_completion(future.result(), sampling.n)
          except VLLMRequestError as e:
            explained = _explain(e)
            if (
              e.status is not None
              and 400 <= e.status < 500
              and explained == str(e)
            ):
              raise ValueError(
                f"vLLM sidecar {self.describe()} rejected prompt "
                f"{first_index + i}: {e.detail}"
              ) from None
            raise self._failure(action, explained) from None
          except ValueError as e:
            raise self._failure(
              action, f"prompt {first_index + i}: {e}"
            ) from None
      finally:
        pool.shutdown(wait=False, cancel_futures=True)
      return [row for rows in results for row in rows]

  # -- weight sync ------------------------------------------------------------

  def _resolve_mode(self, quant_mode: str | None) -> str:
    if quant_mode is None:
      return self._quant_mode
    mode = _MODE_ALIASES.get(quant_mode, quant_mode)
    if mode != self._quant_mode:
      raise ValueError(
        f"VLLMSidecar {self.describe()}: update_weights(quant_mode="
        f"{quant_mode!r}) but the engine runs a {self._quant_mode} "
        f"checkpoint ({self.model_dir}); vLLM cannot change the weight "
        f"format at a sync: launch a sidecar from a {mode} export instead"
      )
    return mode

  def _rljax_model_config(self) -> Any:
    if self._model_config is None:
      from rljax import models  # pylint: disable=g-import-not-at-top

      self._model_config = models.ModelConfig.from_hf(self.model_dir)
    return self._model_config

  def prepare_weights(
    self, params: Any, quant_mode: str | None = None
  ) -> dict[str, np.ndarray]:
    """The exact tensors a sync writes: HF name -> array in checkpoint
    format, checked against the engine's checkpoint.

    Args:
      params: an HF state dict (name -> array: float tensors for a float
        engine; int8/fp8 codes + float32 `*.weight_scale` for a
        compressed-tensors engine), or an rljax params tree (docs/CONTRACTS.md;
        full precision, or `quant.quantize_params` output for an int8/fp8
        engine), converted with `models.to_hf_state_dict` /
        `models.compressed_tensors_state_dict`.
      quant_mode: None (the engine's format) or that same format.
    """
    mode = self._resolve_mode(quant_mode)
    context = f"VLLMSidecar {self.describe()} weight sync"
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
      state_dict, self._manifest, self.config.check_finite, context
    )

  def _float_dtype_name(self) -> str:
    floats = [
      s.dtype
      for s in self._manifest.specs.values()
      if weight_sync.is_float_dtype(s.dtype) and s.dtype.itemsize > 1
    ]
    names = [np.dtype(d).name for d in floats]
    return max(set(names), key=names.count) if names else "bfloat16"

  def update_weights(
    self, params: Any, quant_mode: str | None = None
  ) -> SyncStats:
    """Pushes new weights: check, write shards to tmpfs, reload, reset cache.

    Args:
      params: see `prepare_weights`.
      quant_mode: None or the engine's format (`quant_mode` property).

    Returns:
      SyncStats: wall seconds of the whole sync (conversion included) and
      bytes of weights written for the engine. The breakdown is in
      `last_sync_timing`.

    Raises:
      ValueError / TypeError: the weights do not match the engine's
        checkpoint (nothing was sent).
      SidecarError: the server failed to reload them.
    """
    with self._lock:
      self._require_usable("syncing weights")
      start = time.perf_counter()
      tensors = self.prepare_weights(params, quant_mode)
      prepared = time.perf_counter()
      path, nbytes = write_sync_dir(
        self._sync_dirs, tensors, self.config.shard_bytes
      )
      written = time.perf_counter()
      try:
        self._load_dir(path)
      finally:
        # Kept even when the reload failed: restart() re-pushes it.
        self._sync_dirs.commit(path)
      end = time.perf_counter()
      self.last_sync_timing = {
        "prepare_s": prepared - start,
        "write_s": written - prepared,
        "reload_s": end - written,
        "seconds": end - start,
        "bytes": nbytes,
      }
      return SyncStats(seconds=end - start, bytes=nbytes)

  def load_weights_dir(self, path: str) -> None:
    """Reloads weights from a checkpoint-format dir (the server must be able
    to read path), then resets the prefix cache."""
    with self._lock:
      # Recorded first: if this sidecar is down, restart() loads these.
      self._last_weights_dir = path
      self._require_usable("syncing weights")
      self._load_dir(path)

  def _load_dir(self, path: str) -> None:
    self._last_weights_dir = path
    action = f"reloading weights from {path!r}"
    method = "rljax_reload_weights" if self._has_extension else "reload_weights"
    try:
      self._client.collective_rpc(
        method, {"weights_path": path}, timeout_s=self.config.sync_timeout_s
      )
    except VLLMRequestError as e:
      # A failed in-place reload leaves layers without data.
      self._broken = f"a failed weight reload from {path!r}"
      raise self._failure(
        action, f"{e}; the engine is unusable until restart()"
      ) from None
    for _ in range(20):
      try:
        if self._client.reset_prefix_cache(timeout_s=60):
          break
      except VLLMRequestError as e:
        raise self._failure(
          "resetting the prefix cache after a weight sync", e
        ) from None
      time.sleep(0.1)  # refused while blocks are still held by requests
    else:
      self._broken = "a prefix-cache reset that kept failing after a sync"
      raise self._failure(
        "resetting the prefix cache after a weight sync",
        "the server kept answering success=false",
      )
    if self.config.verify_after_sync:
      try:
        self._probe(f"checking the engine after {action}")
      except SidecarError:
        self._broken = f"weights from {path!r} that break the engine"
        raise


def _explain(error: Exception) -> str:
  text = str(error)
  if "Out of range float values" in text:
    return (
      f"{text} (the engine produced NaN/inf log-probs: its weights or "
      "kernels are broken)"
    )
  return text


def _to_batch(
  prompts: list[list[int]],
  rows: list[tuple[list[int], np.ndarray, str]],
  sampling: SamplingConfig,
  seconds: float,
) -> RolloutBatch:
  tokens = sum(len(ids) for ids, _, _ in rows)
  return RolloutBatch(
    prompt_ids=prompts,
    response_ids=[ids for ids, _, _ in rows],
    behav_logp=[logp for _, logp, _ in rows],
    finish_reason=[reason for _, _, reason in rows],
    n=sampling.n,
    timing={
      "seconds": seconds,
      "tokens": float(tokens),
      "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
      "prompt_tokens": float(sum(len(p) for p in prompts)),
    },
  )
