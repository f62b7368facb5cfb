"""JAX's persistent compilation cache for the rollout engine (and whatever
else the process compiles after it).

The continuous engine compiles a program per row bucket and prefill size,
each a 30-layer unrolled decoder for SmolLM2: minutes of XLA on a loaded
2-core CPU before the first token, every time a process starts
(docs/performance.md, "Compile cost"). With the persistent cache, a second
process with the same shapes loads the compiled programs from disk.

`enable()` turns it on once per process, unless the process already set
`jax_compilation_cache_dir` (then that one is used) or RLJAX_COMPILE_CACHE
is "0"/"off". The directory is RLJAX_COMPILE_CACHE when it names one, else
~/.cache/rljax/jax/<key>, the key covering the JAX version and the host
CPU's flags: XLA:CPU compiles for the CPU it runs on (-march=native
semantics), so a cache shared with another CPU must not be read.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform

import jax

ENV = "RLJAX_COMPILE_CACHE"
_OFF = ("0", "off", "false", "no")
# Programs that compile faster than this are not written (the cache would
# fill with the many small jits of a process for no time saved).
MIN_COMPILE_SECONDS = 1.0
_enabled: str | None = None


def _cpu_key() -> str:
  flags = platform.processor()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith(("flags", "Features", "model name")):
          flags += line
  except OSError:
    pass
  text = f"{jax.__version__}|{platform.machine()}|{flags}"
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def directory() -> str | None:
  """Where the cache lives for this process (None: off)."""
  setting = os.environ.get(ENV, "").strip()
  if setting.lower() in _OFF:
    return None
  if setting:
    return setting
  return os.path.join(
    os.path.expanduser("~"), ".cache", "rljax", "jax", _cpu_key()
  )


def enable() -> str | None:
  """Turns the persistent cache on (once); returns its directory or None."""
  global _enabled
  if _enabled is not None:
    return _enabled or None
  current = jax.config.jax_compilation_cache_dir
  path = current or directory()
  _enabled = path or ""
  if path and not current:
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      logging.warning("rljax: no compilation cache at %s (%s)", path, e)
      _enabled = ""
      return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update(
      "jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS
    )
  return path
