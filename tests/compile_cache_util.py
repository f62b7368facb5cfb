"""Compile time in the test suite: XLA's flags for fast compiles, and a
persistent JAX compilation cache private to one test file's scripts.

The suite compiles thousands of small programs and runs each a few times,
so LLVM's -O2 costs more than it saves: `FAST_COMPILE_XLA_FLAGS` turns the
backend's optimization level down. XLA's own HLO passes (fusion, layout,
simplification) still run, so the programs tested are the ones the library
builds; only their machine code is less tuned. Measured alone on the AMX
Xeon (2 cores): test_trainer 128 -> 100 s, test_jax_sampler 96 -> 70 s,
test_update 126 -> 107 s.

Scripts a test file starts as subprocesses each compile the same tiny
model's programs from scratch; a cache directory shared by those processes
lets the second and later ones load them instead. It is private to the file
(one xdist worker runs a whole file under `--dist loadfile`) and uncapped,
so JAX takes no file lock on it: a suite-wide, size-capped cache once left a
CI run hanging (BUILD_NOTES, "The suite's guards").
"""

from __future__ import annotations

import os

FAST_COMPILE_XLA_FLAGS = "--xla_backend_optimization_level=0"


def env(directory: str | os.PathLike) -> dict[str, str]:
  """Environment variables that point a script's JAX at `directory` and
  cache every compiled program there, however small or quick to compile."""
  return {
    "JAX_COMPILATION_CACHE_DIR": str(directory),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
  }
