"""One cgroup per Python tool call: memory and processes capped for the
whole call, every process of it found and killed after.

An rlimit caps each process on its own (three children of 300 MB each pass
a 512 MB RLIMIT_AS); a cgroup caps their sum. ``hierarchy()`` finds where
this process may make child groups:

  * cgroup v2, where this process's group already delegates the memory and
    pids controllers to its children (or can be made to);
  * else cgroup v1, with a memory and a pids hierarchy mounted and writable
    (a container running as root, as CI does);
  * else None, and ``problem()`` says why: the caller then states what
    bounds the total instead (RLIMIT_AS x RLIMIT_NPROC).

``CallGroup`` makes the group(s) of one call, named after the creating
process (``rljax-sandbox-<pid>-<random>``), so that ``sweep()`` can remove
those a killed trainer left behind.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import time

__all__ = ["PREFIX", "CallGroup", "Hierarchy", "hierarchy", "problem", "sweep"]

PREFIX = "rljax-sandbox-"
_V1_CONTROLLERS = ("memory", "pids")


@dataclasses.dataclass(frozen=True)
class Hierarchy:
  """Where the call groups go: version 2 (one directory) or 1 (one per
  controller: memory, pids)."""

  version: int
  parents: tuple[str, ...]


_found: list[tuple[Hierarchy | None, str]] = []


def _read(path: str) -> str:
  with open(path) as f:
    return f.read()


def _write(path: str, value: str) -> None:
  with open(path, "w") as f:
    f.write(value)


def _mounts() -> list[tuple[str, str, str, list[str]]]:
  """(mount root, mount point, fs type, super options) of every mount."""
  out = []
  for line in _read("/proc/self/mountinfo").splitlines():
    left, _, right = line.partition(" - ")
    fields, tail = left.split(), right.split()
    if len(fields) < 5 or len(tail) < 3:
      continue
    unescape = lambda s: s.encode().decode("unicode_escape")  # noqa: E731
    out.append(
      (unescape(fields[3]), unescape(fields[4]), tail[0], tail[2].split(","))
    )
  return out


def _own_groups() -> dict[str, str]:
  """controller ("" for v2) -> this process's group path."""
  out = {}
  for line in _read("/proc/self/cgroup").splitlines():
    _, controllers, path = line.split(":", 2)
    for name in controllers.split(",") if controllers else [""]:
      out[name] = path
  return out


def _directory(mount_root: str, mount_point: str, path: str) -> str | None:
  if not (path + "/").startswith(mount_root.rstrip("/") + "/"):
    return None
  return os.path.join(
    mount_point, path[len(mount_root.rstrip("/")) :].lstrip("/")
  )


def _probe(parents: tuple[str, ...]) -> None:
  """Raises OSError unless a child group can be made in every parent."""
  name = f"{PREFIX}probe-{os.getpid()}-{secrets.token_hex(4)}"
  for parent in parents:
    os.mkdir(os.path.join(parent, name))
    os.rmdir(os.path.join(parent, name))


def _v2() -> tuple[Hierarchy | None, str]:
  mounts = [m for m in _mounts() if m[2] == "cgroup2"]
  path = _own_groups().get("")
  if not mounts or path is None:
    return None, "no cgroup v2 mounted"
  for root, point, _, _ in mounts:
    here = _directory(root, point, path)
    if here is None or not os.path.isdir(here):
      continue
    available = _read(os.path.join(here, "cgroup.controllers")).split()
    if not {"memory", "pids"} <= set(available):
      return None, f"cgroup v2 at {here} offers {available or 'nothing'}"
    control = os.path.join(here, "cgroup.subtree_control")
    if not {"memory", "pids"} <= set(_read(control).split()):
      try:
        _write(control, "+memory +pids")
      except OSError as error:
        return None, (
          f"cgroup v2 at {here} does not delegate memory and pids to its "
          f"children and cannot be made to ({error.strerror})"
        )
    try:
      _probe((here,))
    except OSError as error:
      return None, f"cannot make a group in {here} ({error.strerror})"
    return Hierarchy(2, (here,)), ""
  return None, "this process's cgroup v2 directory is not mounted here"


def _v1() -> tuple[Hierarchy | None, str]:
  groups, parents = _own_groups(), []
  for controller in _V1_CONTROLLERS:
    found = None
    for root, point, fstype, options in _mounts():
      if fstype == "cgroup" and controller in options:
        found = _directory(root, point, groups.get(controller, "/"))
        break
    if found is None or not os.path.isdir(found):
      return None, f"no cgroup v1 {controller} hierarchy mounted"
    parents.append(found)
  try:
    _probe(tuple(parents))
  except OSError as error:
    return None, f"cannot make a group in {parents} ({error.strerror})"
  return Hierarchy(1, tuple(parents)), ""


def _detect() -> tuple[Hierarchy | None, str]:
  if not _found:
    try:
      found, why2 = _v2()
      if found is None:
        found, why1 = _v1()
        why = "" if found else f"{why2}; {why1}"
      else:
        why = ""
    except OSError as error:
      found, why = None, f"reading the cgroups failed: {error}"
    _found.append((found, why))
  return _found[0]


def hierarchy() -> Hierarchy | None:
  """Where call groups can be made here (found once per process)."""
  return _detect()[0]


def problem() -> str | None:
  """Why no call group can be made here, or None."""
  return _detect()[1] or None


def _kill_members(directory: str) -> bool:
  """SIGKILLs the processes listed in a group; True if there were any."""
  try:
    pids = [
      int(p) for p in _read(os.path.join(directory, "cgroup.procs")).split()
    ]
  except OSError:
    return False
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  return bool(pids)


def _remove(directory: str, kill: bool) -> None:
  deadline = time.monotonic() + 5.0
  while True:
    if kill:
      if os.path.exists(os.path.join(directory, "cgroup.kill")):
        try:
          _write(os.path.join(directory, "cgroup.kill"), "1")
        except OSError:
          pass
      _kill_members(directory)
    try:
      os.rmdir(directory)
      return
    except FileNotFoundError:
      return
    except OSError:  # EBUSY: a killed process has not exited yet
      if time.monotonic() > deadline:
        raise
      time.sleep(0.005)


class CallGroup:
  """The group(s) of one call: made with their limits on creation, every
  member killed and the groups removed by ``close()``."""

  def __init__(self, found: Hierarchy, memory_mb: int, max_tasks: int):
    self.version = found.version
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    self.directories = tuple(os.path.join(p, name) for p in found.parents)
    made = []
    try:
      for directory in self.directories:
        os.mkdir(directory)
        made.append(directory)
      memory, pids = self.directories[0], self.directories[-1]
      limit = str(memory_mb << 20)
      if self.version == 2:
        _write(os.path.join(memory, "memory.max"), limit)
        self._write_if_present(memory, "memory.swap.max", "0")
        # One process over the cap ends the whole call.
        self._write_if_present(memory, "memory.oom.group", "1")
      else:
        _write(os.path.join(memory, "memory.limit_in_bytes"), limit)
        self._write_if_present(memory, "memory.memsw.limit_in_bytes", limit)
      _write(os.path.join(pids, "pids.max"), str(max_tasks))
    except BaseException:
      for directory in made:
        _remove(directory, kill=False)
      raise

  @staticmethod
  def _write_if_present(directory: str, name: str, value: str) -> None:
    if os.path.exists(os.path.join(directory, name)):
      _write(os.path.join(directory, name), value)

  def oom_kills(self) -> int:
    """Processes the memory cap has killed in this call."""
    memory = self.directories[0]
    name = "memory.events" if self.version == 2 else "memory.oom_control"
    try:
      for line in _read(os.path.join(memory, name)).splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
          return int(value)
    except (OSError, ValueError):
      pass
    return 0

  def close(self) -> None:
    """Kills every process still in the groups and removes them."""
    for directory in self.directories:
      _remove(directory, kill=True)


_swept: list[bool] = []


def sweep(found: Hierarchy) -> None:
  """Removes, once per process, the groups of creators that are gone (a
  trainer killed during a call leaves its empty group behind)."""
  if _swept:
    return
  _swept.append(True)
  for parent in found.parents:
    try:
      names = os.listdir(parent)
    except OSError:
      continue
    for name in names:
      if not name.startswith(PREFIX):
        continue
      try:
        pid = int(name[len(PREFIX) :].split("-")[0])
        os.kill(pid, 0)
        continue  # its creator is alive
      except ProcessLookupError:
        pass
      except (ValueError, PermissionError):
        continue
      try:
        _remove(os.path.join(parent, name), kill=True)
      except OSError:
        pass
