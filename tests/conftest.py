"""Test-wide set-up: 8 fake CPU devices for the sharding tests.

XLA reads this flag once, when the backend starts, so it must be set before
any test imports jax.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
