"""The guard: no vLLM server outlives the trainer that launched it.

A guard process leads each launched server's process group; it stops the
group when the trainer or the server dies. `kill_process_group` and
`shutdown` are the trainer's side of the same guarantee (close(), restart(),
the garbage collector, interpreter exit).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Sequence

from rljax.rollout import weight_sync


# A tiny parent of the server, leader of its process group (= session). Three
# ways an engine could outlive its trainer, and what stops it:
#   * the trainer dies without close() (SIGKILL, OOM): the guard polls its
#     parent pid and stops the group (polling, not PR_SET_PDEATHSIG: that
#     signal fires when the *thread* that forked the guard exits, and the
#     trainer may restart a sidecar from a worker thread);
#   * the guard dies (SIGKILL, e.g. a test or an OOM killer picking it): the
#     server has PR_SET_PDEATHSIG=SIGTERM (set in the forked child, which is
#     single-threaded, so the thread caveat does not apply) and shuts down
#     with its engine processes; the trainer's close()/restart() also signals
#     whatever is left in the group, whether or not its leader still runs;
#   * the server crashes: the guard stops the rest of the group (engine core,
#     workers) and exits with the server's exit code.
# Members that ignore SIGTERM for `grace` seconds get SIGKILL. Sync dirs are
# deleted only when the trainer is gone (a live trainer's restart() re-reads
# the last one).
_GUARD_SOURCE = r"""

import ctypes, glob, os, shutil, signal, subprocess, sys, time
trainer, sync_glob, command = int(sys.argv[1]), sys.argv[2], sys.argv[4:]
guard, group, grace = os.getpid(), os.getpgrp(), 30.0
# Survive the SIGTERM sent to the whole group; the server (whose exec resets
# this handler) stops, and the loop below then exits.
signal.signal(signal.SIGTERM, lambda *_: None)
signal.signal(signal.SIGINT, lambda *_: None)

def die_with_guard():
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PDEATHSIG
  except (OSError, AttributeError):
    pass
  if os.getppid() != guard:  # the guard died before prctl
    os.kill(os.getpid(), signal.SIGTERM)

def members():
  found = []
  for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != guard:
      try:
        with open("/proc/%s/stat" % entry) as f:
          fields = f.read().rsplit(")", 1)[1].split()
      except OSError:
        continue
      if fields[0] != "Z" and int(fields[2]) == group:
        found.append(int(entry))
  return found

def stop_group():
  os.killpg(group, signal.SIGTERM)
  deadline = time.monotonic() + grace
  while members() and time.monotonic() < deadline:
    server.poll()
    time.sleep(0.2)
  for pid in members():
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass
  server.poll()

server = subprocess.Popen(command, preexec_fn=die_with_guard)
while server.poll() is None:
  if os.getppid() != trainer:
    print("[rljax guard] trainer process", trainer, "is gone: stopping the "
          "vLLM server", flush=True)
    stop_group()
    for path in glob.glob(sync_glob):
      shutil.rmtree(path, ignore_errors=True)
    sys.exit(1)
  time.sleep(0.5)
# Engine-core / worker processes that outlive a crashed server go too.
stop_group()
sys.exit(server.returncode if server.returncode >= 0 else
         128 - server.returncode)
"""


def guarded_command(
  command: Sequence[str], trainer_pid: int, sync_glob: str
) -> list[str]:
  """argv that runs command under the guard (see `_GUARD_SOURCE`).

  Start it with `start_new_session=True`: the guard must lead the process
  group that it cleans up.
  """
  return [
    sys.executable,
    "-c",
    _GUARD_SOURCE,
    str(int(trainer_pid)),
    sync_glob,
    "--",
    *command,
  ]


def group_members(pgid: int) -> list[int] | None:
  """Live (non-zombie) processes in process group pgid; None without /proc.

  A pid is not reused while a process group with that id has members
  (POSIX), so signalling a group found non-empty here cannot hit a stranger.
  """
  if not os.path.isdir("/proc"):
    return None
  found = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if fields[0] != "Z" and int(fields[2]) == pgid:
      found.append(int(entry))
  return found


def kill_process_group(
  proc: subprocess.Popen | None, grace_s: float = 20.0
) -> None:
  """SIGTERM to the server's process group (guard, API server, engine core,
  workers), SIGKILL to what is left after grace_s; then reaps the guard.

  The group is signalled even when its leader (the guard) has exited: a
  guard killed by SIGKILL leaves the server and its engine in the group.
  """
  if proc is None:
    return
  members = group_members(proc.pid)
  if members is None:  # no /proc: only the leader's liveness is known
    alive = proc.poll() is None
  else:
    alive = bool(members)
  if alive:
    try:
      os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
      pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
      proc.poll()  # reap the guard, or it stays a member (a zombie)
      left = group_members(proc.pid)
      if (not left) if left is not None else proc.poll() is not None:
        break
      time.sleep(0.1)
    else:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
  try:
    proc.wait(timeout=grace_s)
  except subprocess.TimeoutExpired:
    pass


def shutdown(
  procs: list[subprocess.Popen], sync_dirs: weight_sync.SyncDirs
) -> None:
  """Stops every server a sidecar ever launched (restarts included)."""
  for proc in procs:
    kill_process_group(proc)
  sync_dirs.cleanup()
