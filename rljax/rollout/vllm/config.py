"""vLLM sidecar configuration and its failure type.

`VLLMSidecarConfig` (validated at construction), `SidecarError` and the
weight format a checkpoint directory declares (`checkpoint_quant_mode`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import os
import socket
import urllib.parse
from typing import Mapping

from rljax.core import _validation as v
from rljax.rollout.base import EngineFailure


# The health wait of an attached (already running) server: it is up or it is
# not; the launch's 600 s are for a server still loading its weights.
ATTACH_HEALTH_TIMEOUT_S = 60.0


def check_engine_urls(urls: str, allow_remote: bool = False) -> list[str]:
  """The URLs of `--rollout.vllm_urls` (comma-separated), each checked.

  An attached engine receives the run's bearer key on every request and can
  be told to reload weights from any path, so an address that does not
  resolve to loopback only is refused unless `allow_remote`
  (`--rollout.vllm_allow_remote`). Raises ValueError naming the URL.
  """
  out = []
  for url in (u.strip() for u in urls.split(",")):
    if not url:
      continue
    parsed = urllib.parse.urlsplit(url)
    try:
      port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:  # a port that is not a number
      port = None
    if (
      parsed.scheme not in ("http", "https") or not parsed.hostname or not port
    ):
      raise ValueError(f"{url!r} is not a URL; expected http://host:port")
    if not allow_remote:
      try:
        infos = socket.getaddrinfo(
          parsed.hostname, port, proto=socket.IPPROTO_TCP
        )
      except socket.gaierror as e:
        raise ValueError(
          f"{url!r}: cannot resolve {parsed.hostname!r} ({e})"
        ) from None
      remote = sorted(
        {
          a
          for a in (info[4][0] for info in infos)
          if not ipaddress.ip_address(a.split("%")[0]).is_loopback
        }
      )
      if remote:
        raise ValueError(
          f"{url!r} resolves to non-loopback address(es) {remote}, which "
          "would receive the run's API key"
        )
    out.append(url)
  return out


# Checkpoint `quantization_config.format` of compressed-tensors -> mode.
_COMPRESSED_FORMATS = {"int-quantized": "int8", "float-quantized": "fp8"}


_FLOAT_MODES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


class SidecarError(EngineFailure):
  """A vLLM sidecar died, hung, or rejected a request it should accept.

  The message names the sidecar (URL, pid, log file), what it was doing, and
  the last lines of its log. Attributes `url`, `pid`, `log_path` and `action`
  carry the same facts.
  """

  def __init__(
    self,
    message: str,
    *,
    url: str,
    pid: int | None,
    log_path: str | None,
    action: str,
  ):
    super().__init__(message)
    self.url, self.pid, self.log_path, self.action = url, pid, log_path, action


# What an in-flight weight update (`VLLMSidecar.generate_inflight`) does to
# the requests it finds running (the JAX engine's `inflight.INFLIGHT_KV_MODES`).
INFLIGHT_KV_MODES = ("keep", "recompute")


_POSITIVE_INT = v.expect(
  v.all_of(v.is_int, v.in_range(0, math.inf, lo_open=True)), "a positive int"
)
_POSITIVE = v.expect(
  v.all_of(v.is_real, v.in_range(0, math.inf, lo_open=True)),
  "a positive number",
)
# (field, rule) in check order; every failure is a ValueError.
_FIELD_RULES = (
  ("host", v.expect(v.non_empty_str, "a host name or IP address")),
  (
    "port",
    v.expect(
      v.all_of(v.is_int, v.in_range(0, 65535)),
      "0 (a free port) or a port number < 65536",
    ),
  ),
  ("served_model_name", v.non_empty_str),
  ("max_model_len", _POSITIVE_INT),
  ("tensor_parallel_size", _POSITIVE_INT),
  ("shard_bytes", _POSITIVE_INT),
  ("max_concurrent_requests", _POSITIVE_INT),
  ("cpu_kvcache_gib", _POSITIVE),
  ("startup_timeout_s", _POSITIVE),
  ("request_timeout_s", _POSITIVE),
  ("sync_timeout_s", _POSITIVE),
  ("inflight_poll_s", _POSITIVE),
  (
    "inflight_kv",
    v.expect(
      v.one_of(*INFLIGHT_KV_MODES),
      f"one of {INFLIGHT_KV_MODES} (keep: running requests keep their KV "
      "of the old weights, PipelineRL; recompute: vLLM preempts them and "
      "recomputes it with the new ones, AReaL)",
    ),
  ),
  ("inflight_routes", v.is_bool),
  (
    "gpu_memory_utilization",
    v.expect(
      v.all_of(v.is_real, v.in_range(0.0, 1.0, lo_open=True)),
      "a fraction in (0, 1]",
    ),
  ),
)


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
    shard_bytes: safetensors shard size of a weight sync written as a
      directory of shards (`VLLMSidecarPool`); a sidecar's own syncs rewrite
      one file in place (`sync.SharedWeights`).
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
    inflight_routes: launch the server with `--enable-scale-out`, which
      serves `/inference/v1/generate`, the one route of vLLM 0.32 that
      returns each token's weight version (`generate_inflight` needs it).
    inflight_kv: what an in-flight weight update does to the requests it
      finds running: "keep" their KV cache, made by the old weights
      (PipelineRL), or "recompute" it with the new ones (AReaL: vLLM's
      pause preempts them, `clear_cache=true`); see docs/async_vllm.md.
    inflight_poll_s: `generate_inflight` polls its `weight_updates` hook
      this often (seconds) while requests are in flight.
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
  inflight_routes: bool = True
  inflight_kv: str = "keep"
  inflight_poll_s: float = 0.05
  api_key: str | None = dataclasses.field(default=None, repr=False)

  def __post_init__(self):
    for name, rule in _FIELD_RULES:
      v.check_field("VLLMSidecarConfig", name, getattr(self, name), rule)
    if isinstance(self.extra_args, str) or not all(
      isinstance(a, str) for a in self.extra_args
    ):
      raise TypeError(
        v.field_message(
          "VLLMSidecarConfig.extra_args",
          self.extra_args,
          "a tuple of strings (one per argv item)",
        )
      )
    object.__setattr__(self, "extra_args", tuple(self.extra_args))
    env = tuple(
      tuple(kv)
      for kv in (
        self.env.items() if isinstance(self.env, Mapping) else self.env
      )
    )
    if not all(
      len(kv) == 2 and all(isinstance(x, str) for x in kv) for kv in env
    ):
      raise TypeError(
        v.field_message(
          "VLLMSidecarConfig.env", self.env, "(name, value) string pairs"
        )
      )
    object.__setattr__(self, "env", env)
    # Not check_field: the message must not quote a secret.
    if self.api_key is not None and (
      not isinstance(self.api_key, str) or not self.api_key.strip()
    ):
      raise ValueError(
        "VLLMSidecarConfig.api_key: expected None (a random "
        "per-run key) or a non-empty string"
      )


def checkpoint_quant_mode(model_dir: str | os.PathLike) -> str:
  """Weight format of an HF checkpoint dir: "bf16", "f16", "f32", "int8", "fp8".

  "int8"/"fp8" are compressed-tensors W8A8 checkpoints (see
  `rljax.models.export_compressed_tensors_int8`); their syncs carry quantized
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
      raise ValueError(
        f"{path}: compressed-tensors format {fmt!r}; expected "
        f"one of {sorted(_COMPRESSED_FORMATS)}"
      )
    raise ValueError(
      f"{path}: quant_method={method!r}; the sidecar syncs "
      "float or compressed-tensors checkpoints"
    )
  dtype = config.get("torch_dtype") or config.get("dtype") or "float32"
  if dtype not in _FLOAT_MODES:
    raise ValueError(
      f"{path}: torch_dtype={dtype!r}; expected one of {sorted(_FLOAT_MODES)}"
    )
  return _FLOAT_MODES[dtype]
