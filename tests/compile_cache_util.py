"""A persistent JAX compilation cache private to one test file's scripts.

Scripts a test file starts as subprocesses each compile the same tiny
model's programs from scratch; a cache directory shared by those processes
lets the second and later ones load them instead. It is private to the file
(one xdist worker runs a whole file under `--dist loadfile`) and uncapped,
so JAX takes no file lock on it: a suite-wide, size-capped cache once left a
CI run hanging (BUILD_NOTES, "The suite's guards").
"""

from __future__ import annotations

import os


def env(directory: str | os.PathLike) -> dict[str, str]:
  """Environment variables that point a script's JAX at `directory` and
  cache every compiled program there, however small or quick to compile."""
  return {
    "JAX_COMPILATION_CACHE_DIR": str(directory),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
  }
