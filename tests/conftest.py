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

os.environ.setdefault(
  "XLA_FLAGS",
  "--xla_force_host_platform_device_count=8"
  " --xla_cpu_collective_call_terminate_timeout_seconds=1800"
  " --xla_cpu_collective_timeout_seconds=1800",
)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
