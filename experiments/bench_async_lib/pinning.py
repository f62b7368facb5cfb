"""Where bench_async.py's vLLM sidecar runs: every thread of its processes
on one core and the trainer's threads on the others, from /proc."""

from __future__ import annotations

import collections
import os


def _descendants(root: int) -> list[int]:
  """`root` and every process below it (from /proc's parent links)."""
  children = collections.defaultdict(list)
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      except (OSError, ValueError, IndexError):
        continue
      children[ppid].append(int(entry))
  out, todo = [], [root]
  while todo:
    pid = todo.pop()
    out.append(pid)
    todo.extend(children.get(pid, ()))
  return out


def _pin(pid: int, cores: set[int]) -> int:
  """Every thread of `pid` onto `cores`; how many threads were pinned."""
  done = 0
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      os.sched_setaffinity(int(tid), cores)
      done += 1
    except OSError:  # a thread that ended meanwhile
      pass
  return done


def pin_engine(engine_pid: int, core: int) -> dict:
  """The sidecar (and its engine and worker processes) on `core`, this
  process's threads on the other cores; new threads inherit."""
  every = set(range(os.cpu_count() or 1))
  if core not in every or len(every) < 2:
    raise ValueError(
      f"--engine_core={core}; expected one of {sorted(every)} on a machine "
      "with at least 2 cores"
    )
  pids = _descendants(engine_pid)
  engine_threads = sum(_pin(p, {core}) for p in pids)
  trainer_threads = _pin(os.getpid(), every - {core})
  return {
    "engine_core": core,
    "engine_processes": len(pids),
    "engine_threads": engine_threads,
    "trainer_cores": sorted(every - {core}),
    "trainer_threads": trainer_threads,
  }
