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
import platform

import pytest

from rljax import hostmem

os.environ.setdefault(
  "XLA_FLAGS",
  "--xla_force_host_platform_device_count=8"
  " --xla_cpu_collective_call_terminate_timeout_seconds=1800"
  " --xla_cpu_collective_timeout_seconds=1800",
)
# Huge pages for XLA's buffers (rljax.hostmem), which the scripts re-execute
# themselves to get. Set here, before xdist starts its workers, it reaches
# the workers and every subprocess a test starts (pytest without -n keeps
# its own process as it started). Two test files took 296 -> 275 s with it,
# at the same peak RSS.
_huge_pages_env = hostmem.huge_pages_env(
  dict(os.environ), platform.libc_ver(), hostmem.thp_mode()
)
if _huge_pages_env is not None:
  os.environ["GLIBC_TUNABLES"] = _huge_pages_env["GLIBC_TUNABLES"]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _return_freed_memory_to_the_os() -> None:
  """glibc keeps freed heap pages in its arenas; `malloc_trim` hands them
  back, so that a worker's RSS reflects what it still holds."""
  import ctypes  # pylint: disable=g-import-not-at-top

  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):  # not glibc
    pass


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops every compiled program after each test file.

  An xdist worker lives for the whole suite (~700 tests each under
  `-n 2`), and JAX keeps every executable it compiled, and the buffers
  those hold, for the life of the process: a worker grew past 10 GiB RSS by
  the end of the suite, and two such workers with other jobs beside them
  exhausted the 24 GiB machine (the kernel's OOM killer ended a worker at
  99%). Each file starts from an empty cache: a file that calls a program
  an earlier file compiled compiles it again; within a file nothing changes.
  """
  yield
  import gc  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  jax.clear_caches()
  gc.collect()
  _return_freed_memory_to_the_os()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  """Prints the files that took longest (setup + call + teardown of all
  their tests).

  Under `--dist loadfile` a file is the unit a worker takes, so the suite
  can end no sooner than its slowest file; this is the list to read when
  the suite grows past its time budget (see BUILD_NOTES, "Slow tests").
  """
  del exitstatus, config
  seconds: dict[str, float] = {}
  for reports in terminalreporter.stats.values():
    for report in reports:
      nodeid = getattr(report, "nodeid", "")
      duration = getattr(report, "duration", None)
      if not nodeid or duration is None:
        continue
      path = nodeid.split("::", 1)[0]
      seconds[path] = seconds.get(path, 0.0) + duration
  if len(seconds) < 2:
    return
  total = sum(seconds.values())
  terminalreporter.write_sep("=", "slowest test files (summed test time)")
  for path, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:15]:
    terminalreporter.write_line(f"{s:8.1f} s  {100 * s / total:5.1f}%  {path}")
  terminalreporter.write_line(
    f"{total:8.1f} s  total over {len(seconds)} files"
  )
