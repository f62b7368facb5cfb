"""Test-wide set-up: 8 fake CPU devices for the sharding tests, and fast
compiles (`compile_cache_util.FAST_COMPILE_XLA_FLAGS`).

XLA reads these flags once, when the backend starts, so they must be set
before any test imports jax.

The fake devices are threads of one process, and a collective waits until
all 8 have arrived. On a loaded 2-core machine (pytest -n 2 beside a vLLM
engine) one device thread can be starved for longer than XLA's default
collective termination timeout, and XLA then aborts the whole process
("Exiting to ensure a consistent program state"): a crashed xdist worker,
not a wrong number. The timeouts are raised for the tests only.

One persistent compilation cache serves the whole run: every xdist worker
and every script a test starts loads what another already compiled
(`compile_cache_util.start_suite_cache`).
"""

import os
import platform
import shutil
import sys

import pytest

import compile_cache_util
from rljax import hostmem

os.environ.setdefault(
  "XLA_FLAGS",
  "--xla_force_host_platform_device_count=8"
  " --xla_cpu_collective_call_terminate_timeout_seconds=1800"
  " --xla_cpu_collective_timeout_seconds=1800 "
  + compile_cache_util.FAST_COMPILE_XLA_FLAGS,
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
# Made by the process that starts the run (the xdist controller, or pytest
# without -n), before any worker starts: the workers and every script the
# tests start inherit it. Removed in `pytest_unconfigure`.
_SUITE_CACHE_DIR = compile_cache_util.start_suite_cache()
if _SUITE_CACHE_DIR is not None and "jax" in sys.modules:
  # JAX reads these variables when it is imported; a plugin was first.
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update(
    "jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"]
  )
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


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
  99%). Each file starts from an empty in-memory cache: a program an
  earlier file compiled is loaded from the run's compilation cache on disk
  (`compile_cache_util.start_suite_cache`); within a file nothing changes.
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
  for path, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:20]:
    terminalreporter.write_line(f"{s:8.1f} s  {100 * s / total:5.1f}%  {path}")
  terminalreporter.write_line(
    f"{total:8.1f} s  total over {len(seconds)} files"
  )
  terminalreporter.write_line(_machine_line())


# The files that took longest in CI (summed test time, AMX Xeon, 2 cores,
# 2026-11-27: 235 s down to 93 s), heaviest first. xdist hands a file to
# whichever worker is free, in queue order; by default it queues files by
# their number of tests, which put the engine and trainer files (few tests,
# minutes each) last, and one worker then ran them alone while the other sat
# idle. Heaviest first (and the many short files after) lets the two
# workers finish together. A file missing here only runs later; nothing
# else depends on the order.
_HEAVIEST_FILES = (
  "rollout/test_vllm_sidecar.py",
  "train/test_trainer.py",
  "rewards/test_reward_experiments.py",
  "train/test_trainer_vllm.py",
  "train/test_update.py",
  "experiments/test_ablate_script.py",
  "train/test_faults.py",
  "rollout/test_jax_sampler.py",
  "rollout/test_jax_sampler_weights.py",
  "rollout/test_spec_decoding.py",
  "experiments/test_qurl_scripts.py",
  "experiments/test_ablate_algorithms.py",
  "rollout/test_continuous_batching.py",
  "experiments/test_gpu_kit.py",
  "train/test_critic_pretrain.py",
  "train/test_streaming.py",
  "rollout/test_inflight_updates.py",
  "envs/test_multiturn.py",
  "experiments/test_qurl_replay.py",
  "experiments/test_count_compiles.py",
  # After the bf16 sidecar file: two vLLM engines at once crowd 2 cores.
  "rollout/test_vllm_sidecar_int8.py",
)


def _machine_line() -> str:
  """The machine the suite runs on: its timings (the slowest tests and
  files) mean nothing without it."""
  from rljax.quant import cpu as cpu_lib  # pylint: disable=g-import-not-at-top

  info = cpu_lib.host_cpu()
  flags = [
    f
    for f in ("avx2", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
    if info.has(f)
  ]
  load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
  return (
    f"machine: {info.model}; {os.cpu_count()} cores; "
    f"dot flags: {' '.join(flags) or 'none'}; load average: {load}"
  )


def pytest_report_header(config):
  del config
  return _machine_line()


def pytest_unconfigure(config):
  del config
  if _SUITE_CACHE_DIR is not None:
    shutil.rmtree(_SUITE_CACHE_DIR, ignore_errors=True)


def pytest_configure(config):
  # Keep the queue in collection order (see pytest_collection_modifyitems);
  # the option exists only where pytest-xdist is installed.
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
  """Puts the `_HEAVIEST_FILES` first, in their order; every other file
  keeps its place, and every file its tests' order."""
  del config
  tests_dir = os.path.dirname(os.path.abspath(__file__))
  rank = {name: i for i, name in enumerate(_HEAVIEST_FILES)}

  def file_rank(item):
    path = os.path.relpath(str(item.path), tests_dir).replace(os.sep, "/")
    return rank.get(path, len(rank))

  items.sort(key=file_rank)
