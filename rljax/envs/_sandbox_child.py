"""The process that runs model-written Python (see sandbox.py); stdlib only.

Started by ``sandbox.run_python`` as ``[unshare --net --pid --mount --fork
--kill-child --mount-proc] python -I _sandbox_child.py STATUS_FD``, with a
clean environment. It reads one JSON request from stdin, confines itself,
runs the code with its stdout/stderr going to the parent's pipes, and writes
one JSON report ``{"kind": ..., "message": ...}`` on STATUS_FD.

Confinement, in order (the order matters: mounts and the uid change need
root, so they come before the privilege drop; rlimits come before the code):
  1. (namespaces mode, root) make the interpreter's files reachable after
     the uid change, mount a size-capped tmpfs owned by the sandbox uid as
     the working directory, then remount every other mount read-only;
  2. chdir into the working directory;
  3. resource limits: address space, CPU seconds, processes, open files,
     file size, no core dumps;
  4. (root) drop every group, then setgid/setuid to the sandbox uid (root is
     exempt from RLIMIT_NPROC, so without this a fork bomb is not capped),
     and set no_new_privs so no setuid binary gives root back;
  5. an audit hook refuses sockets (a clear "network" report; the empty
     network namespace is what actually contains the code).
"""

import ctypes
import errno
import json
import os
import resource
import sys

_MS_RDONLY = 1
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_PR_SET_NO_NEW_PRIVS = 38
_SKIP_READ_ONLY = ("/proc",)

_MAIN_PID = os.getpid()
_status_fd = -1


class NetworkDenied(PermissionError):
  """Raised by the audit hook when the code asks for a socket."""


def _libc():
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mount.argtypes = [ctypes.c_char_p] * 3 + [
    ctypes.c_ulong,
    ctypes.c_char_p,
  ]
  return libc


def _mount(libc, source, target, fstype, flags, data=None):
  enc = lambda s: None if s is None else s.encode()  # noqa: E731
  if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
    code = ctypes.get_errno()
    raise OSError(code, f"mount {target}: {os.strerror(code)}")


def _mount_points():
  points = []
  with open("/proc/self/mountinfo") as f:
    for line in f:
      raw = line.split()[4]
      # mountinfo escapes space, tab, newline and backslash as \ooo.
      points.append(
        raw.encode().decode("unicode_escape").encode("latin-1").decode()
      )
  return points


def _blocked_ancestor(path):
  """The top-most ancestor of ``path`` that others cannot search, or None."""
  parts = os.path.realpath(path).split("/")[1:]
  current = ""
  for part in parts[:-1]:
    current += "/" + part
    if not os.stat(current).st_mode & 0o001:
      return current
  return None


def _confine_mounts(libc, request):
  work = request["workdir"]
  stage = request["stagedir"]
  uid = request["uid"]
  # 1a. The interpreter may live under a directory only root can enter
  # (/root/.pyenv): hide that directory behind a tmpfs that holds only the
  # interpreter's tree (which also keeps the rest of it out of sight).
  prefix = os.path.realpath(sys.base_prefix)
  blocked = _blocked_ancestor(os.path.join(prefix, "x"))
  if blocked is not None:
    _mount(libc, prefix, stage, None, _MS_BIND | _MS_REC)
    _mount(libc, "tmpfs", blocked, "tmpfs", 0, "mode=0755,size=64k")
    target = blocked + prefix[len(blocked) :]
    os.makedirs(target, exist_ok=True)
    _mount(libc, stage, target, None, _MS_BIND | _MS_REC)
  # 1b. Everything read-only (per-mount flags: only this namespace sees
  # them), then the one writable place.
  for point in _mount_points():
    if point.startswith(_SKIP_READ_ONLY) or point == work:
      continue
    try:
      _mount(libc, None, point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
    except OSError:
      if point == "/":
        raise
  _mount(
    libc,
    "tmpfs",
    work,
    "tmpfs",
    0,
    f"mode=0700,uid={uid},gid={uid},size={request['workdir_kb']}k",
  )


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


def _drop_privileges(libc, uid):
  os.setgroups([])
  os.setgid(uid)
  os.setuid(uid)
  if os.getuid() != uid or os.geteuid() != uid:
    raise RuntimeError("the sandbox uid change did not take")
  libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


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
  if isinstance(error, SyntaxError):
    return "syntax"
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


def _report(kind, message):
  if os.getpid() != _MAIN_PID:  # a forked child of the code: say nothing
    os._exit(1)
  sys.stdout.flush()
  sys.stderr.flush()
  payload = json.dumps({"kind": kind, "message": message[:2000]}).encode()
  os.write(_status_fd, payload)
  os.close(_status_fd)


def _init_then_wait():
  """In namespaces mode this process is PID 1 of its namespace, and the
  kernel ignores, for PID 1, signals it has no handler for unless they come
  from an ancestor namespace (its own CPU limit's SIGXCPU would not end it):
  fork the worker and exit with its status. Whatever is left in the
  namespace dies with PID 1."""
  pid = os.fork()
  if pid == 0:
    return
  _, status = os.waitpid(pid, 0)
  if os.WIFSIGNALED(status):
    os._exit(128 + os.WTERMSIG(status))
  os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main():
  global _status_fd, _MAIN_PID
  _status_fd = int(sys.argv[1])
  if os.getpid() == 1:
    _init_then_wait()
    _MAIN_PID = os.getpid()
  request = json.loads(sys.stdin.read())
  try:
    libc = _libc()
    if request["mode"] == "namespaces":
      _confine_mounts(libc, request)
    os.chdir(request["workdir"])
    _set_limits(request)
    if os.geteuid() == 0:
      _drop_privileges(libc, request["uid"])
    sys.addaudithook(_audit)
    code = compile(request["code"], "<python-tool>", "exec")
  except SyntaxError as error:
    _report("syntax", f"SyntaxError: {error}")
    return
  except BaseException as error:
    _report("setup", f"sandbox set-up failed: {type(error).__name__}: {error}")
    return
  try:
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
  except SystemExit as error:
    if error.code not in (None, 0):
      _report("exception", f"SystemExit: {error.code}")
      return
  except BaseException as error:
    _report(_kind(error), f"{type(error).__name__}: {error}")
    return
  _report("ok", "")


if __name__ == "__main__":
  main()
