"""Running model-written Python where it cannot harm the machine or the run.

The design follows ``rljax.rewards.isolation``: a separate, killable process
per call (never ``multiprocessing``: a fresh interpreter, never a fork of a
multithreaded JAX process), bounded in wall time by the parent, which kills
the whole process tree when time is up. On top of that, the child
(``_sandbox_child.py``) confines itself before the code runs:

  ============  ==============================================================
  limit          how
  ============  ==============================================================
  wall time      parent deadline, then SIGKILL of the process group; in
                 namespaces mode the child is PID 1 of its own PID namespace,
                 so its death takes every descendant with it (even ones that
                 called setsid)
  CPU time       RLIMIT_CPU
  memory         RLIMIT_AS (a 10 GB allocation is a MemoryError)
  processes      RLIMIT_NPROC under a fresh uid per call (root is exempt from
                 RLIMIT_NPROC, so the child drops to that uid first)
  network        an empty network namespace (no interface but a down
                 loopback); an audit hook also refuses sockets, for a clear
                 report
  files          every mount remounted read-only in a private mount
                 namespace; the working directory is a fresh tmpfs owned by
                 the sandbox uid and capped in size (also RLIMIT_FSIZE)
  environment    a clean one: PATH, LANG, HOME; nothing of the parent's
  ============  ==============================================================

Modes (``sandbox_mode()``): "namespaces" needs root and util-linux
``unshare`` (this machine and CI). Elsewhere "rlimits", a weaker mode: the
same rlimits, clean environment, audit hook and process-group kill, but no
namespaces: the network is refused only to Python's own socket calls
(ctypes or a subprocess gets through) and world-writable directories such
as /tmp stay writable. As root it still drops to a fresh uid and kills every
process of that uid after the call; as another user the code runs as that
user (RLIMIT_NPROC then counts all of the user's processes), and a process
that leaves the process group can outlive the call. An interpreter installed
where others cannot read (/root/.pyenv) cannot import most modules after
the uid change in this mode (namespaces mode mounts it into reach).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Literal

from rljax.core import _validation as v

__all__ = [
  "SANDBOX_ERROR_KINDS",
  "SandboxConfig",
  "SandboxResult",
  "run_python",
  "sandbox_mode",
]

_CHILD = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "_sandbox_child.py"
)
_UNSHARE = (
  "--net",
  "--pid",
  "--mount",
  "--fork",
  "--kill-child",
  "--mount-proc",
)
# Fresh uids per call come from this range, far above any account's (so no
# file on the machine is theirs and no other process shares their
# RLIMIT_NPROC count).
_UID_LOW, _UID_SPAN = 1_500_000_000, 500_000_000

# What a call can end in, besides "ok". The child names the first six from
# the exception that escaped the code; the parent adds the rest.
SANDBOX_ERROR_KINDS = (
  "syntax",  # the code does not compile
  "exception",  # any other exception the code raised
  "memory",  # MemoryError: the address-space cap
  "process_limit",  # fork/spawn refused: the process cap
  "permission",  # writing outside the working directory
  "network",  # a socket
  "timeout",  # wall or CPU time
  "crash",  # killed by a signal, or died without a report
  "setup",  # the sandbox itself could not be set up
)

Mode = Literal["namespaces", "rlimits"]


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Limits of one Python tool call.

  Attributes:
    timeout_s: wall-clock limit of the call, start-up included (> 0).
    cpu_s: CPU-second limit of each process (RLIMIT_CPU, >= 1).
    memory_mb: address-space limit of each process (RLIMIT_AS, >= 64: the
      interpreter alone needs some tens of MB).
    max_processes: processes the sandbox uid may have at once (>= 1;
      RLIMIT_NPROC).
    workdir_kb: size of the working directory's tmpfs and the largest file
      (>= 64).
    max_output_chars: stdout and stderr are each cut to this many characters
      (>= 1); the reader keeps draining so the code never blocks on a full
      pipe.
  """

  timeout_s: float = 5.0
  cpu_s: int = 5
  memory_mb: int = 512
  max_processes: int = 16
  workdir_kb: int = 8192
  max_output_chars: int = 4000

  def __post_init__(self):
    for name, rule in _SANDBOX_RULES:
      v.check_field("SandboxConfig", name, getattr(self, name), rule)


_SANDBOX_RULES = (
  ("timeout_s", v.all_of(v.is_real, v.in_range(0, 3600, lo_open=True))),
  ("cpu_s", v.all_of(v.is_int, v.in_range(1, 3600))),
  ("memory_mb", v.all_of(v.is_int, v.in_range(64, 1 << 20))),
  ("max_processes", v.all_of(v.is_int, v.in_range(1, 4096))),
  ("workdir_kb", v.all_of(v.is_int, v.in_range(64, 1 << 24))),
  ("max_output_chars", v.all_of(v.is_int, v.at_least(1))),
)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """One call's outcome.

  Attributes:
    kind: "ok" or one of ``SANDBOX_ERROR_KINDS``.
    stdout, stderr: what the code printed (cut to ``max_output_chars``).
    message: the error's text ("" when ok).
    truncated: True when stdout or stderr was cut.
    mode: the sandbox mode that ran it.
    seconds: wall time of the call.
    uid: the uid the code ran as (-1: not changed, rlimits mode of a
      non-root caller).
  """

  kind: str
  stdout: str
  stderr: str
  message: str
  truncated: bool
  mode: str
  seconds: float
  uid: int = -1

  @property
  def ok(self) -> bool:
    return self.kind == "ok"


_mode_cache: list[Mode] = []


def sandbox_mode() -> Mode:
  """ "namespaces" when this process is root and ``unshare`` can make the
  namespaces, else "rlimits" (weaker: see the module docstring)."""
  if not _mode_cache:
    mode: Mode = "rlimits"
    unshare = shutil.which("unshare")
    if os.geteuid() == 0 and unshare:
      try:
        probe = subprocess.run(
          [unshare, *_UNSHARE, "true"],
          stdin=subprocess.DEVNULL,
          capture_output=True,
          timeout=10,
          env={"PATH": "/usr/bin:/bin"},
        )
        if probe.returncode == 0:
          mode = "namespaces"
      except (OSError, subprocess.SubprocessError):
        pass
    _mode_cache.append(mode)
  return _mode_cache[0]


def _clean_environment(home: str) -> dict[str, str]:
  return {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": home,
    # One thread per math library: each thread's stack counts against
    # RLIMIT_AS and RLIMIT_NPROC.
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
  }


def _kill_group(process: subprocess.Popen, mode: Mode) -> None:
  # Once the leader is reaped its pid may be reused; in namespaces mode
  # nothing of the call outlives the leader, so there is nothing to kill.
  if process.returncode is None or mode == "rlimits":
    try:
      os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
  try:
    process.wait(timeout=10)
  except subprocess.TimeoutExpired:
    pass


def _kill_uid(uid: int) -> None:
  """SIGKILL every process whose real uid is ``uid`` (a fresh sandbox uid:
  nothing else runs under it), until none is left."""
  for _ in range(100):
    found = False
    for entry in os.listdir("/proc"):
      if not entry.isdigit():
        continue
      try:
        with open(f"/proc/{entry}/status") as f:
          fields = dict(line.split(":", 1) for line in f if ":" in line)
        # A zombie is dead already; its parent (or init) reaps it.
        if int(fields["Uid"].split()[0]) == uid and "Z" not in fields["State"]:
          found = True
          os.kill(int(entry), signal.SIGKILL)
      except (OSError, KeyError, ValueError):
        continue
    if not found:
      return
    time.sleep(0.01)


def run_python(
  code: str, config: SandboxConfig = SandboxConfig()
) -> SandboxResult:
  """Runs ``code`` in a fresh sandbox process; never raises for what the
  code does, never takes longer than ``config.timeout_s`` (plus the kill),
  and leaves no process behind (as root; see the module docstring for the
  rlimits mode of other users)."""
  start = time.monotonic()
  mode = sandbox_mode()
  root = tempfile.mkdtemp(prefix="rljax-python-tool-")
  os.chmod(root, 0o711)  # enterable, not listable or writable by the code
  workdir = os.path.join(root, "work")
  stagedir = os.path.join(root, "stage")
  os.mkdir(workdir, 0o700)
  os.mkdir(stagedir, 0o700)
  uid = _UID_LOW + secrets.randbelow(_UID_SPAN) if os.geteuid() == 0 else -1
  if mode == "rlimits" and os.geteuid() == 0:
    os.chown(workdir, uid, uid)
  request = {
    "code": code,
    "mode": mode,
    "workdir": workdir,
    "stagedir": stagedir,
    "uid": uid,
    "memory_mb": config.memory_mb,
    "cpu_s": config.cpu_s,
    "max_processes": config.max_processes,
    "workdir_kb": config.workdir_kb,
  }
  status_read, status_write = os.pipe()
  command = [sys.executable, "-I", _CHILD, str(status_write)]
  if mode == "namespaces":
    command = [shutil.which("unshare") or "unshare", *_UNSHARE, *command]
  try:
    try:
      process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(status_write,),
        env=_clean_environment(workdir),
        start_new_session=True,  # its own process group, for the kill
        cwd=root,
      )
    except OSError as error:
      return SandboxResult(
        "setup",
        "",
        "",
        f"could not start the sandbox: {error}",
        False,
        mode,
        time.monotonic() - start,
        uid,
      )
    finally:
      os.close(status_write)
    try:
      return _collect(process, request, status_read, config, mode, start)
    finally:
      _kill_group(process, mode)
      if mode == "rlimits" and os.geteuid() == 0:
        _kill_uid(uid)  # what left the process group (setsid)
      for stream in (process.stdout, process.stderr):
        stream.close()
  finally:
    os.close(status_read)
    shutil.rmtree(root, ignore_errors=True)


def _collect(process, request, status_fd, config, mode, start) -> SandboxResult:
  deadline = start + config.timeout_s
  try:
    process.stdin.write(json.dumps(request).encode())
    process.stdin.close()
  except OSError:
    pass
  limit = config.max_output_chars * 4  # UTF-8: at most 4 bytes a character
  buffers = {
    process.stdout.fileno(): bytearray(),
    process.stderr.fileno(): bytearray(),
    status_fd: bytearray(),
  }
  overflow = False
  open_fds = set(buffers)
  timed_out = False

  def take(fd: int, chunk: bytes) -> None:
    nonlocal overflow
    buffer = buffers[fd]
    room = (65536 if fd == status_fd else limit) - len(buffer)
    if len(chunk) > room:
      overflow = overflow or fd != status_fd
    buffer += chunk[: max(room, 0)]

  while open_fds:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      timed_out = True
      break
    # Short waits: a descendant may hold the pipes open after the child
    # has exited (rlimits mode), so end of file cannot be the only signal.
    readable, _, _ = select.select(list(open_fds), [], [], min(remaining, 0.05))
    for fd in readable:
      chunk = os.read(fd, 65536)
      if chunk:
        take(fd, chunk)
      else:
        open_fds.discard(fd)
    if process.poll() is not None:
      # The child has exited, so all it wrote is in the pipes: take it
      # without waiting for end of file (the group is killed next).
      for fd in open_fds:
        os.set_blocking(fd, False)
        try:
          while chunk := os.read(fd, 65536):
            take(fd, chunk)
        except BlockingIOError:
          pass
      break
  if timed_out:
    _kill_group(process, mode)
  stdout, stdout_cut = _text(buffers[process.stdout.fileno()], config)
  stderr, stderr_cut = _text(buffers[process.stderr.fileno()], config)
  truncated = overflow or stdout_cut or stderr_cut
  seconds = time.monotonic() - start
  uid = request["uid"]
  if timed_out:
    message = f"no result within {config.timeout_s} s (wall time)"
    return SandboxResult(
      "timeout", stdout, stderr, message, truncated, mode, seconds, uid
    )
  try:
    report = json.loads(bytes(buffers[status_fd]).decode())
    kind, message = str(report["kind"]), str(report["message"])
  except (ValueError, KeyError, TypeError):
    # No report: the code ended the process itself, or a signal did (the
    # PID-1 wrapper of namespaces mode exits with 128 + the signal).
    code = process.wait()
    if code == 0:
      kind, message = "ok", ""
    elif code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
      kind, message = "timeout", f"CPU time limit of {config.cpu_s} s"
    else:
      kind, message = "crash", f"the sandbox process died (exit status {code})"
  if kind not in SANDBOX_ERROR_KINDS and kind != "ok":
    kind = "crash"
  return SandboxResult(
    kind, stdout, stderr, message, truncated, mode, seconds, uid
  )


def _text(raw: bytearray, config: SandboxConfig) -> tuple[str, bool]:
  text = bytes(raw).decode("utf-8", errors="replace")
  if len(text) > config.max_output_chars:
    return text[: config.max_output_chars], True
  return text, False
