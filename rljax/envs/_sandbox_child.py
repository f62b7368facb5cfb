"""The processes that run model-written Python (see sandbox.py); stdlib only.

``sandbox.run_python`` starts ``python -I _sandbox_child.py STATUS_FD`` with a
clean environment and writes one JSON request on its stdin. Three processes
then take part, each with one job:

  supervisor   (this process, root, the host's namespaces) joins the call's
               cgroups, asks for SIGKILL when the trainer dies
               (PR_SET_PDEATHSIG), makes a PID namespace and forks its init;
               it exits with init's status.
  init         (PID 1 of the new namespace, root) asks for SIGKILL when the
               supervisor dies, makes mount, network, IPC and UTS namespaces,
               builds and enters the read-only root (sandbox_root.py),
               compiles the code, forks the worker and waits for it. It
               alone writes the call's report (one JSON line) on STATUS_FD.
               When it exits, the kernel kills everything left in the
               namespace: setsid or double-forked descendants included.
  worker       closes every descriptor but 0-2 (STATUS_FD included), sets
               the rlimits, drops to the call's own uid with no_new_privs,
               adds the socket audit hook, installs the seccomp filter
               (sandbox_seccomp.py) and runs the code.

The worker's outcome reaches the parent only as its wait status, which init
reads from the kernel: an exception that escapes the code ends the worker
with the exit code of its kind (EXIT_CODES) after a ``\\x1e``-prefixed line
on stderr that carries the message. The code can choose its own exit
status, as any program can (so a failure can be made to look like another,
or like a normal exit), but it cannot reach the report: it has no
descriptor of it, cannot see init's /proc entries or ptrace it, and a
timeout, a signal or a kill by the memory cap is judged by the parent from
the clock, the wait status and the cgroup, never from the code's word.

In the "unsafe_rlimits_only" mode there is no init and no namespace: the
supervisor itself forks the worker (rlimits, uid drop as root, audit hook;
no seccomp, no private root) and reports.
"""

import ctypes
import errno
import importlib.util
import json
import os
import resource
import select
import signal
import sys

# Exit codes of the worker for an exception that escaped the code. High and
# contiguous, so that a program's ordinary exit codes are not read as them.
EXIT_CODES = {
  "setup": 230,
  "exception": 231,
  "memory": 232,
  "process_limit": 233,
  "permission": 234,
  "network": 235,
}
MESSAGE_MARK = b"\x1e"  # starts the worker's last stderr line: the message
_MESSAGE_BYTES = 2000

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38

_HERE = os.path.dirname(os.path.abspath(__file__))
_worker_pid = -1


class NetworkDenied(PermissionError):
  """Raised by the audit hook when the code asks for a socket."""


def _sibling(name):
  """A stdlib-only module of this folder, by path (the child never imports
  rljax: that would import the project's dependencies)."""
  path = os.path.join(_HERE, name + ".py")
  spec = importlib.util.spec_from_file_location("_rljax_" + name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _prctl(option, value):
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(option, value, 0, 0, 0) != 0:
    code = ctypes.get_errno()
    raise OSError(code, f"prctl({option}): {os.strerror(code)}")


def _report(status_fd, **fields):
  os.write(status_fd, json.dumps(fields).encode() + b"\n")


def _set_limits(request):
  mb, cpu, kb = request["memory_mb"], request["cpu_s"], request["workdir_kb"]
  # The hard CPU limit is one second above the soft one: the soft limit
  # sends SIGXCPU (reported as a timeout); equal limits would send SIGKILL.
  limits = (
    (resource.RLIMIT_AS, mb << 20, mb << 20),
    (resource.RLIMIT_CPU, cpu, cpu + 1),
    (resource.RLIMIT_NPROC, request["max_processes"], request["max_processes"]),
    (resource.RLIMIT_NOFILE, 64, 64),
    (resource.RLIMIT_FSIZE, kb << 10, kb << 10),
    (resource.RLIMIT_CORE, 0, 0),
  )
  for which, soft, hard in limits:
    resource.setrlimit(which, (soft, hard))


def _drop_privileges(uid):
  # Root is exempt from RLIMIT_NPROC and from every file permission: the
  # code runs as a fresh uid that owns nothing but its working directory.
  os.setgroups([])
  os.setgid(uid)
  os.setuid(uid)
  if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
    raise RuntimeError("the sandbox uid change did not take")


def _audit(event, args):
  if event in ("socket.__new__", "socket.getaddrinfo", "socket.gethostbyname"):
    raise NetworkDenied(
      errno.EACCES, "network access is disabled in the sandbox"
    )


def _kind(error):
  """The named tool error for an exception that escaped the code."""
  if isinstance(error, NetworkDenied):
    return "network"
  if isinstance(error, MemoryError):
    return "memory"
  if isinstance(error, OSError):
    if error.errno == errno.EAGAIN:
      return "process_limit"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG):
      return "permission"
    if error.errno in (
      errno.ENETUNREACH,
      errno.EHOSTUNREACH,
      errno.ECONNREFUSED,
    ):
      return "network"
  return "exception"


def _flush():
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except BaseException:  # the code may have replaced or closed it
      pass


def _end(kind, message):
  """Ends the worker: the message as the last stderr line, the kind as the
  exit code. A process the code forked says nothing (only the worker's
  status is the call's)."""
  _flush()
  if os.getpid() != _worker_pid:
    os._exit(1)
  line = message.encode("utf-8", "backslashreplace")[:_MESSAGE_BYTES]
  try:
    os.write(2, MESSAGE_MARK + line + b"\n")
  except OSError:
    pass
  os._exit(EXIT_CODES[kind])


def _run(code):
  try:
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
  except SystemExit as error:
    if error.code not in (None, 0):
      _end("exception", f"SystemExit: {error.code}")
  except BaseException as error:
    _end(_kind(error), f"{type(error).__name__}: {error}")
  _flush()
  os._exit(0)


def _worker(request, code, seccomp):
  """Confines this process, then runs ``code``; never returns."""
  global _worker_pid
  _worker_pid = os.getpid()
  try:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request["workdir"])
    _set_limits(request)
    if os.geteuid() == 0:
      _drop_privileges(request["uid"])
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    sys.addaudithook(_audit)
    if seccomp is not None:
      seccomp.install()  # last: nothing of ours runs after it but the code
  except BaseException as error:
    _end("setup", f"sandbox set-up failed: {type(error).__name__}: {error}")
  _run(code)


def _compile(request, status_fd):
  """The code object, or None once a syntax report is written. Whatever
  compile() refuses (a lone surrogate, nesting past the parser's depth, a
  null byte) is the code's syntax, not the sandbox's set-up."""
  try:
    return compile(request["code"], "<python-tool>", "exec")
  except BaseException as error:
    message = f"{type(error).__name__}: {error}"
    _report(status_fd, kind="syntax", message=message[:_MESSAGE_BYTES])
    return None


def _fork_worker_and_wait(request, status_fd, seccomp, reap_all):
  """Compiles, forks the worker, waits for it and reports its status."""
  code = _compile(request, status_fd)
  if code is None:
    return
  sys.stdout.flush()
  pid = os.fork()
  if pid == 0:
    _worker(request, code, seccomp)
  while True:
    try:
      # As PID 1, init also reaps the orphans of the namespace: a zombie
      # still counts against the cgroup's process cap.
      done, status = os.waitpid(-1 if reap_all else pid, 0)
    except InterruptedError:
      continue
    if done == pid:
      break
  _report(status_fd, kind="exited", status=status)


def _init(request, status_fd, life):
  _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  if select.select([life], [], [], 0)[0]:
    os._exit(1)  # the supervisor died before the line above took effect
  os.close(life)
  seccomp = _sibling("sandbox_seccomp")
  root = _sibling("sandbox_root")
  root.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS)
  root.set_hostname("sandbox")
  root.build_root(request["stage"], request["uid"], request["workdir_kb"])
  request = dict(request, workdir=root.WORKDIR)
  _fork_worker_and_wait(request, status_fd, seccomp, reap_all=True)


def _strong(request, status_fd):
  life, alive = os.pipe()  # readable (EOF) once the supervisor is gone
  _sibling("sandbox_root").unshare(_CLONE_NEWPID)
  pid = os.fork()
  if pid == 0:
    os.close(alive)
    try:
      _init(request, status_fd, life)
    except BaseException as error:
      message = f"sandbox set-up failed: {type(error).__name__}: {error}"
      _report(status_fd, kind="setup", message=message[:_MESSAGE_BYTES])
    os._exit(0)
  os.close(status_fd)
  os.close(life)
  _, status = os.waitpid(pid, 0)
  if os.WIFSIGNALED(status):
    os._exit(128 + os.WTERMSIG(status))
  os._exit(os.WEXITSTATUS(status))


def main():
  status_fd = int(sys.argv[1])
  request = json.loads(sys.stdin.buffer.read())
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)
  try:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != request["parent"]:
      os._exit(1)  # the trainer died before the line above took effect
    for group in request["cgroups"]:
      with open(os.path.join(group, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    if request["mode"] == "strong":
      _strong(request, status_fd)
    else:
      _fork_worker_and_wait(request, status_fd, None, reap_all=False)
  except BaseException as error:
    message = f"sandbox set-up failed: {type(error).__name__}: {error}"
    _report(status_fd, kind="setup", message=message[:_MESSAGE_BYTES])


if __name__ == "__main__":
  main()
