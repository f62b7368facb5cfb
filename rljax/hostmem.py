"""Host memory: large buffers on transparent huge pages (Linux, glibc).

XLA's CPU backend gives every program fresh output and temporary buffers
from malloc. glibc serves a large one with its own mmap, and the first write
to each of its 4 KiB pages faults into the kernel: on a Zen 3 core pair a
113 MB copy into fresh pages took 68 ms, onto fresh huge pages 18.5 ms.
Where transparent huge pages are set to `madvise` (the common default), the
glibc tunable `glibc.malloc.hugetlb=1` (glibc >= 2.35) has malloc ask for
2 MiB pages, and the faults drop 512-fold. Measured alternately on that
machine: the trainer's INT8 weight sync 0.47 -> 0.37 s, the update step
(SmolLM2-135M, 16 x 256) 78.9 / 81.9 -> 89.2 / 87.4 tokens/s
(docs/performance.md, "The sync's copy in place, and huge pages for XLA's
buffers").

glibc reads its tunables once, when the process starts, so the scripts
re-execute themselves with it set (`relaunch_with_huge_pages`), before they
parse flags. RLJAX_HUGE_PAGES=0 keeps the process as it is (A/B timings).
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "RLJAX_HUGE_PAGES"
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = THP_MODE) -> str:
  """The kernel's transparent huge page mode: "always", "madvise",
  "never", or "" where the file is missing (not Linux, or no THP)."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return ""
  start, end = text.find("["), text.find("]")
  return text[start + 1 : end] if 0 <= start < end else ""


def _glibc_at_least(version: str, major: int, minor: int) -> bool:
  try:
    got = tuple(int(x) for x in version.split(".")[:2])
  except ValueError:
    return False
  return got >= (major, minor)


def huge_pages_env(
  env: dict[str, str],
  libc: tuple[str, str],
  mode: str,
) -> dict[str, str] | None:
  """The environment to re-execute with, or None where nothing would change.

  Args:
    env: the current environment.
    libc: `platform.libc_ver()`, e.g. ("glibc", "2.36").
    mode: `thp_mode()`.

  Returns:
    `env` with TUNABLE added to GLIBC_TUNABLES when all of these hold: the
    C library is glibc >= 2.35 (older ones ignore the tunable); the kernel's
    THP mode is "madvise" ("always" needs no request, "never" grants none);
    RLJAX_HUGE_PAGES is not "0"; and the tunable is not set already (which
    also ends the re-execution after one round).
  """
  if env.get(OPT_OUT, "1") == "0":
    return None
  name, version = libc
  if name != "glibc" or not _glibc_at_least(version, 2, 35):
    return None
  if mode != "madvise":
    return None
  tunables = env.get("GLIBC_TUNABLES", "")
  if "glibc.malloc.hugetlb" in tunables:
    return None
  out = dict(env)
  out["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}" if tunables else TUNABLE
  return out


def relaunch_with_huge_pages() -> None:
  """Re-executes this Python process with glibc's huge-page tunable, where it
  would take effect and is not set yet; returns only where nothing changes.

  Call it first thing under `if __name__ == "__main__":`, before threads or
  child processes start: exec keeps the process id, the command line
  (`sys.orig_argv`) and open standard streams, and ends everything else.
  """
  env = huge_pages_env(dict(os.environ), platform.libc_ver(), thp_mode())
  if env is None or not sys.executable:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, list(sys.orig_argv), env)
  except OSError as e:  # the run goes on, on small pages
    print(
      f"[rljax] could not re-execute {sys.executable} with {TUNABLE} ({e}); "
      "running without huge pages",
      file=sys.stderr,
      flush=True,
    )


def started_tunables(path: str = "/proc/self/environ") -> str:
  """GLIBC_TUNABLES as this process started with it, which is what glibc
  read (a later change to os.environ does not count); os.environ's value
  where /proc is not there."""
  try:
    with open(path, "rb") as f:
      entries = f.read().split(b"\0")
  except OSError:
    return os.environ.get("GLIBC_TUNABLES", "")
  prefix = b"GLIBC_TUNABLES="
  for entry in entries:
    if entry.startswith(prefix):
      return entry[len(prefix) :].decode(errors="replace")
  return ""


def huge_pages_state() -> str:
  """How this process's large buffers are paged, for benchmark records:
  "on (...)" or "off (...)", with the reason."""
  mode = thp_mode()
  if mode == "always":
    return "on (THP always)"
  if mode != "madvise":
    return f"off (THP {mode or 'unavailable'})"
  if TUNABLE in started_tunables():
    return f"on (THP madvise, {TUNABLE})"
  return "off (THP madvise, tunable not set)"
