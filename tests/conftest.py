"""Test-wide set-up: 8 fake CPU devices for the sharding tests.

XLA reads these flags once, when the backend starts, so they must be set
before any test imports jax.

The fake devices are threads of one process, and a collective waits until
all 8 have arrived. On a loaded 2-core machine (pytest -n 2 beside a vLLM
engine) one device thread can be starved for longer than XLA's default
collective termination timeout, and XLA then aborts the whole process
("Exiting to ensure a consistent program state"): a crashed xdist worker,
not a wrong number. The timeouts are raised for the tests only.
"""

import os
import tempfile

os.environ.setdefault(
  "XLA_FLAGS",
  "--xla_force_host_platform_device_count=8"
  " --xla_cpu_collective_call_terminate_timeout_seconds=1800"
  " --xla_cpu_collective_timeout_seconds=1800",
)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# One persistent XLA compilation cache for the whole run, both xdist
# workers and the scripts the tests start: many tests compile the same
# tiny-model programs (update steps, samplers) in new Trainers, and a
# cache hit skips XLA's compile (tests/train/test_trainer.py alone: 179 ->
# 140 s from an empty cache; the whole suite from an empty cache, 2 cores:
# 23:18 -> 23:10, no gain beyond noise, since most of its time is vLLM
# engines and scripts). Keyed by the program, jax version and flags, so a
# stale entry is never used; capped at 2 GB.
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR",
  os.path.join(tempfile.gettempdir(), f"rljax-tests-jax-cache-{os.getuid()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 * 10**9))
