"""Compile time in the test suite: XLA's flags for fast compiles, and the
persistent JAX compilation cache that one test run shares.

The suite compiles thousands of small programs and runs each a few times,
so LLVM's -O2 costs more than it saves: `FAST_COMPILE_XLA_FLAGS` turns the
backend's optimization level down. XLA's own HLO passes (fusion, layout,
simplification) still run, so the programs tested are the ones the library
builds; only their machine code is less tuned. Measured alone on the AMX
Xeon (2 cores): test_trainer 128 -> 100 s, test_jax_sampler 96 -> 70 s,
test_update 126 -> 107 s.

Many test files, and the scripts they start as subprocesses, compile the
same tiny model's programs (the rollout, the update step, the evaluation),
and `tests/conftest.py` drops every compiled program after each file to
bound a worker's memory. `start_suite_cache` gives the run one cache
directory on disk instead: the first process that compiles a program
writes it there, and every later file, xdist worker and script loads it.
The cache is new and empty for each run (nothing stale is read), removed
at its end, and uncapped: JAX then takes no file lock on it (a size cap
turns on its LRU eviction, which locks the directory around every read
and write; such a capped cache once left a CI run hanging, BUILD_NOTES,
"The suite's guards"). Without the lock two processes may write the same
entry at once, or a killed one may leave an entry cut short; JAX reads
such an entry as a miss (a warning) and compiles the program itself.
`env` gives one test file's scripts a cache of their own instead (the
fault tests, whose workers are killed mid-run on purpose).

The run's cache directory also keeps the tiny model's tokenizer in its
saved form (`rljax.models.pretrained.TOKENIZER_CACHE_ENV`): every process
that loads the tiny model would otherwise rebuild it from the GGUF file's
metadata (~4 s of CPU each).
"""

from __future__ import annotations

import os
import tempfile

FAST_COMPILE_XLA_FLAGS = "--xla_backend_optimization_level=0"

# Set to 0 to run the suite without its shared caches.
SUITE_CACHE_SWITCH = "RLJAX_TEST_COMPILE_CACHE"
# rljax.models.pretrained.TOKENIZER_CACHE_ENV (not imported: this module is
# read before JAX may be).
TOKENIZER_CACHE_ENV = "RLJAX_TOKENIZER_CACHE"


def env(directory: str | os.PathLike) -> dict[str, str]:
  """Environment variables that point a script's JAX at `directory` and
  cache every compiled program there, however small or quick to compile."""
  return {
    "JAX_COMPILATION_CACHE_DIR": str(directory),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
  }


def start_suite_cache(environ=os.environ) -> str | None:
  """Points this process, and every process it starts after this call, at
  a new, empty directory for the run's caches (compiled programs under
  `jax/`, the tiny tokenizer under `tokenizer/`), and returns it (the
  caller removes it when the run ends).

  Returns None and changes nothing in a process that inherited the run's
  cache (an xdist worker), where the user named a cache of their own
  (`JAX_COMPILATION_CACHE_DIR`), or where `RLJAX_TEST_COMPILE_CACHE=0`.
  """
  if environ.get(SUITE_CACHE_SWITCH, "1") == "0":
    return None
  if environ.get("JAX_COMPILATION_CACHE_DIR"):
    return None
  directory = tempfile.mkdtemp(prefix="rljax-test-cache-")
  environ.update(env(os.path.join(directory, "jax")))
  environ.setdefault(TOKENIZER_CACHE_ENV, os.path.join(directory, "tokenizer"))
  return directory
