"""Builds and loads the rollout's C++ custom calls (XLA FFI) on the host.

A kernel ships as C++ source beside its Python module (e.g.
`paged_attention.cc`). On first use in a process, `load(source, symbols)`
compiles it with the host's C++ compiler against jaxlib's FFI headers
(`jax.ffi.include_dir()`), `-O3 -march=native`, into a shared library kept
in a cache directory, loads it and registers each handler symbol as an XLA
custom-call target on the CPU platform. A later process, or a second call,
reuses the library: nothing is rebuilt unless the source, the compiler,
jaxlib or the CPU changed (all are in the library's file name).

  RLJAX_KERNEL_CACHE   the cache directory (default ~/.cache/rljax/kernels)
  CXX                  the compiler (default g++)

Why a build at run time rather than a wheel: the kernels are a few hundred
lines, `-march=native` makes them use the vector units the host has
(AVX-512 on one CPU, AVX2 on another), and the project installs from
source with two commands. When no compiler is found or the build fails,
`load` returns None (the reason in `last_error`, and one warning), and the
callers run their XLA reference instead: slower, same results.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from typing import Sequence

import jax

_FLAGS = (
  "-O3",
  "-march=native",
  "-std=c++17",
  "-shared",
  "-fPIC",
  # jaxlib's FFI headers warn under GCC; the kernels' own code does not.
  "-Wno-attributes",
  "-Wno-return-type",
  "-Wno-psabi",
)

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
last_error: dict[str, str] = {}


def cache_dir() -> str:
  return os.environ.get("RLJAX_KERNEL_CACHE") or os.path.join(
    os.path.expanduser("~"), ".cache", "rljax", "kernels"
  )


def _cpu_flags() -> str:
  """The host CPU's feature flags (what -march=native compiles for)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith(("flags", "Features")):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def _compiler_version(cxx: str) -> str:
  try:
    out = subprocess.run(
      [cxx, "--version"], capture_output=True, text=True, timeout=30
    )
    return out.stdout.splitlines()[0] if out.stdout else ""
  except (OSError, subprocess.SubprocessError):
    return ""


def library_path(source: str, cxx: str) -> str:
  """Where the library of `source` built by `cxx` for this host lives."""
  with open(source, "rb") as f:
    text = f.read()
  key = hashlib.sha256()
  for part in (
    text,
    " ".join(_FLAGS).encode(),
    _compiler_version(cxx).encode(),
    jax.__version__.encode(),
    platform.machine().encode(),
    _cpu_flags().encode(),
  ):
    key.update(part)
    key.update(b"\0")
  name = os.path.splitext(os.path.basename(source))[0]
  return os.path.join(cache_dir(), f"{name}-{key.hexdigest()[:16]}.so")


def _build(source: str, out: str, cxx: str) -> None:
  """Compiles `source` to `out` (atomically: a temporary file renamed)."""
  os.makedirs(os.path.dirname(out), exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(out))
  os.close(fd)
  try:
    cmd = [cxx, *_FLAGS, f"-I{jax.ffi.include_dir()}", source, "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode:
      raise RuntimeError(
        f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}"
      )
    os.replace(tmp, out)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def load(source: str, symbols: Sequence[str]) -> ctypes.CDLL | None:
  """The loaded library of `source` with `symbols` registered as CPU
  custom-call targets of the same names, or None where it cannot be built
  (the reason in `last_error[source]`)."""
  with _lock:
    if source in _loaded:
      return _loaded[source]
    lib = None
    try:
      cxx = os.environ.get("CXX", "g++")
      if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler {cxx!r} on PATH (set CXX)")
      path = library_path(source, cxx)
      if not os.path.exists(path):
        _build(source, path, cxx)
      lib = ctypes.cdll.LoadLibrary(path)
      for name in symbols:
        jax.ffi.register_ffi_target(
          name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu"
        )
    # Anything (no compiler, a flag or header this host's compiler lacks,
    # a library that does not load or register) leaves the XLA reference.
    except Exception as e:  # pylint: disable=broad-exception-caught
      last_error[source] = str(e)
      logging.warning(
        "rljax: the native kernel %s is not available (%s); running its "
        "XLA reference instead",
        os.path.basename(source),
        e,
      )
      lib = None
    _loaded[source] = lib
    return lib
