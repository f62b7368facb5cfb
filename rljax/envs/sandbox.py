"""Running model-written Python where it cannot reach the host or the run.

Threat model (docs/sandbox.md): the code is hostile. It may try to read the
trainer's memory, environment or files, signal or trace it, reach any
socket, leave processes behind, exhaust memory or processes, or forge its
own outcome. Each call runs in a fresh process tree (``_sandbox_child.py``:
a supervisor, the init of a PID namespace, a worker that runs the code),
bounded in wall time by this process, which kills the tree when time is up.

Modes (``SandboxConfig.mode``):

  "strong" (the default) needs root, namespaces, libseccomp:
    ============  ===========================================================
    files         a read-only root of its own (sandbox_root.py): the system's
                  libraries and the interpreter, nothing of the project, /tmp,
                  /run, /home or /root; a private, size-capped /tmp and
                  working directory; a procfs of its own PID namespace
    processes     PID namespace: nothing outside it is visible or signalable,
                  and its init's death kills every descendant (setsid and
                  double forks included); PR_SET_PDEATHSIG chains it to the
                  trainer, so a killed trainer takes it along
    system calls  seccomp (sandbox_seccomp.py): no ptrace, namespaces,
                  mounts, sockets of any family, keyrings, bpf, perf, ...
    network       an empty network namespace, and no socket() at all
    identity      a fresh uid per call, no groups, no_new_privs
    memory,       a cgroup per call (sandbox_cgroup.py): memory_mb and
    processes     max_processes for the whole call; where no cgroup can be
                  made, RLIMIT_AS per process x RLIMIT_NPROC per uid bound
                  the total (``limits()`` says which)
    CPU time      RLIMIT_CPU
    outcome       judged from the worker's wait status (read by init from
                  the kernel), the cgroup's OOM count and the clock; the code
                  holds no descriptor of the report
    ============  ===========================================================

  "unsafe_rlimits_only" only where named: the rlimits, the clean
    environment, the socket audit hook (Python's own sockets only), the uid
    drop when root and the process-group kill. The code sees and can
    write what its uid can, reaches the network through ctypes or a
    subprocess, and (unless root) can signal and trace the trainer.

A mode is never chosen for the caller: "strong" where it cannot run raises
``SandboxUnavailable`` with the reason, and ``PythonTool`` and the trainer
refuse to start.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

from rljax.core import _validation as v
from rljax.envs import _sandbox_child as child
from rljax.envs import sandbox_cgroup, sandbox_process, sandbox_seccomp

__all__ = [
  "SANDBOX_ERROR_KINDS",
  "SANDBOX_MODES",
  "SandboxConfig",
  "SandboxResult",
  "SandboxUnavailable",
  "limits",
  "require",
  "run_python",
  "sandbox_mode",
  "strong_problem",
]

_CHILD = os.path.abspath(child.__file__)
# Fresh uids per call come from this range, far above any account's (so no
# file on the machine is theirs and no other process shares their
# RLIMIT_NPROC count).
_UID_LOW, _UID_SPAN = 1_500_000_000, 500_000_000
_TMP_PREFIX = "rljax-python-tool-"

SANDBOX_MODES = ("strong", "unsafe_rlimits_only")
UNSAFE_HINT = (
  "name the weaker mode explicitly to run without these defences: "
  "PythonTool(SandboxConfig(mode='unsafe_rlimits_only')), or the trainer's "
  "--task.python_sandbox=unsafe_rlimits_only (docs/sandbox.md)"
)

# What a call can end in, besides "ok".
SANDBOX_ERROR_KINDS = (
  "syntax",  # the code does not compile
  "exception",  # any other exception the code raised
  "memory",  # MemoryError, or the call's cgroup killed a process
  "process_limit",  # fork/spawn refused: the process cap
  "permission",  # writing outside the working directory, a denied call
  "network",  # a socket
  "timeout",  # wall or CPU time
  "crash",  # killed by a signal, or an exit status of its own
  "setup",  # the sandbox itself could not be set up
)


class SandboxUnavailable(RuntimeError):
  """The requested mode cannot run on this machine (never a weaker one)."""


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Limits of one Python tool call.

  Attributes:
    timeout_s: wall-clock limit of the call, start-up included (> 0).
    cpu_s: CPU-second limit of each process (RLIMIT_CPU, >= 1).
    memory_mb: the call's memory: all its processes together where a cgroup
      can be made, and each process's address space (RLIMIT_AS) always
      (>= 64: the interpreter alone needs some tens of MB).
    max_processes: processes of the call's uid at once (>= 1; RLIMIT_NPROC,
      and the cgroup's pids.max with the supervisor and init on top).
    workdir_kb: size of the working directory's tmpfs (and of /tmp's in
      strong mode) and of the largest file (>= 64).
    max_output_chars: stdout and stderr are each cut to this many characters
      (>= 1); the reader keeps draining so the code never blocks on a full
      pipe.
    mode: "strong" or "unsafe_rlimits_only" (module docstring).
  """

  timeout_s: float = 5.0
  cpu_s: int = 5
  memory_mb: int = 512
  max_processes: int = 16
  workdir_kb: int = 8192
  max_output_chars: int = 4000
  mode: str = "strong"

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
  ("mode", v.one_of(*SANDBOX_MODES)),
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
    uid: the uid the code ran as (-1: not changed, a non-root caller).
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


_strong_problem: list[str | None] = []


def strong_problem() -> str | None:
  """Why the strong mode cannot run here, or None (found once per process:
  the static requirements, then one real call that must come back "ok")."""
  if not _strong_problem:
    problem = None
    if os.geteuid() != 0:
      problem = (
        f"it needs root (this process runs as uid {os.geteuid()}): the "
        "call's own uid, the namespaces, the root and the cgroup are made "
        "as root"
      )
    problem = problem or sandbox_seccomp.problem()
    if problem is None:
      probe = _call("print('ok')", SandboxConfig(timeout_s=30.0))
      if (probe.kind, probe.stdout) != ("ok", "ok\n"):
        problem = f"a trial call failed ({probe.kind}: {probe.message})"
    _strong_problem.append(problem)
  return _strong_problem[0]


def require(mode: str) -> None:
  """Raises ``SandboxUnavailable`` unless ``mode`` can run here."""
  if mode not in SANDBOX_MODES:
    raise ValueError(f"sandbox mode={mode!r}; expected one of {SANDBOX_MODES}")
  if mode == "strong" and (problem := strong_problem()) is not None:
    raise SandboxUnavailable(
      f"the Python tool's strong sandbox cannot run here: {problem}. "
      f"{UNSAFE_HINT}"
    )


def sandbox_mode() -> str:
  """ "strong" when the strong mode can run here, else "unavailable"."""
  return "strong" if strong_problem() is None else "unavailable"


def limits(config: SandboxConfig = SandboxConfig()) -> dict:
  """What bounds a call of ``config`` here, for the run's record."""
  out = {"mode": config.mode}
  found = sandbox_cgroup.hierarchy() if config.mode == "strong" else None
  rlimits = (
    f"{config.memory_mb} MB of address space per process (RLIMIT_AS) x "
    f"{config.max_processes} processes (RLIMIT_NPROC) = at most "
    f"{config.memory_mb * config.max_processes} MB for the call"
  )
  if found is not None:
    out["cgroup"] = f"v{found.version}"
    out["memory"] = f"{config.memory_mb} MB for the whole call (cgroup)"
    out["processes"] = f"{config.max_processes} for the whole call"
  else:
    why = sandbox_cgroup.problem() if config.mode == "strong" else "unsafe mode"
    out["cgroup"] = f"none ({why})"
    out["memory"] = rlimits
    out["processes"] = f"{config.max_processes} per uid (RLIMIT_NPROC)"
  return out


def run_python(
  code: str, config: SandboxConfig = SandboxConfig()
) -> SandboxResult:
  """Runs ``code`` in a fresh sandbox of ``config.mode``; never raises for
  what the code does, never takes longer than ``config.timeout_s`` (plus
  the kill), and leaves no process behind (as root; see the module
  docstring for the unsafe mode of other users). Raises
  ``SandboxUnavailable`` if the mode cannot run here."""
  require(config.mode)
  return _call(code, config)


def _clean_environment(home: str) -> dict[str, str]:
  bin_dir = os.path.dirname(sys.executable)
  return {
    "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": home,
    # One thread per math library: each thread's stack counts against
    # RLIMIT_AS and RLIMIT_NPROC.
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
  }


_swept_tmp: list[bool] = []


def _sweep_tmp() -> None:
  """Removes, once per process, the (empty) call directories of trainers
  that were killed during a call."""
  if _swept_tmp:
    return
  _swept_tmp.append(True)
  base = tempfile.gettempdir()
  for name in os.listdir(base):
    if not name.startswith(_TMP_PREFIX):
      continue
    try:
      os.kill(int(name[len(_TMP_PREFIX) :].split("-")[0]), 0)
    except ProcessLookupError:
      shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    except (ValueError, PermissionError):
      pass


def _setup_failure(message, config, start, uid) -> SandboxResult:
  seconds = time.monotonic() - start
  return SandboxResult(
    "setup", "", "", message, False, config.mode, seconds, uid
  )


def _call(code: str, config: SandboxConfig) -> SandboxResult:
  start = time.monotonic()
  strong = config.mode == "strong"
  root_user = os.geteuid() == 0
  _sweep_tmp()
  root = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-")
  uid = _UID_LOW + secrets.randbelow(_UID_SPAN) if root_user else -1
  workdir = os.path.join(root, "work")
  if not strong:
    os.chmod(root, 0o711)  # enterable, not listable or writable by the code
    os.mkdir(workdir, 0o700)
    if root_user:
      os.chown(workdir, uid, uid)
  group = None
  found = sandbox_cgroup.hierarchy() if strong else None
  try:
    if found is not None:
      sandbox_cgroup.sweep(found)
      try:
        # The supervisor and init count against pids.max too.
        group = sandbox_cgroup.CallGroup(
          found, config.memory_mb, config.max_processes + 2
        )
      except OSError as error:
        return _setup_failure(
          f"could not make the call's cgroup: {error}", config, start, uid
        )
    request = {
      "code": code,
      "mode": config.mode,
      "parent": os.getpid(),
      "stage": root,
      "workdir": workdir,
      "uid": uid,
      "memory_mb": config.memory_mb,
      "cpu_s": config.cpu_s,
      "max_processes": config.max_processes,
      "workdir_kb": config.workdir_kb,
      "cgroups": list(group.directories) if group else [],
    }
    return _supervise(request, config, group, start)
  finally:
    if group is not None:
      group.close()
    shutil.rmtree(root, ignore_errors=True)


def _supervise(request, config, group, start) -> SandboxResult:
  status_read, status_write = os.pipe()
  home = "/sandbox" if config.mode == "strong" else request["workdir"]
  try:
    try:
      process = subprocess.Popen(
        [sys.executable, "-I", _CHILD, str(status_write)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(status_write,),
        env=_clean_environment(home),
        start_new_session=True,  # its own process group, for the kill
        cwd=request["stage"],
      )
    except OSError as error:
      message = f"could not start the sandbox: {error}"
      return _setup_failure(message, config, start, request["uid"])
    finally:
      os.close(status_write)
    try:
      deadline = start + config.timeout_s
      outcome = sandbox_process.collect(
        process, request, status_read, config, group, deadline
      )
    finally:
      sandbox_process.kill_group(process)
      if config.mode != "strong" and os.geteuid() == 0:
        # What left the process group (setsid).
        sandbox_process.kill_uid(request["uid"])
      for stream in (process.stdout, process.stderr):
        stream.close()
  finally:
    os.close(status_read)
  seconds = time.monotonic() - start
  return SandboxResult(*outcome, config.mode, seconds, request["uid"])
