"""The Python tool's system-call filter: a small ctypes binding to libseccomp.

Stdlib only: the sandbox's child process loads this file by path (it never
imports rljax). ``install()`` loads a seccomp filter into the calling
process (and so into every process it starts); the kernel then answers the
calls below with an error instead of running them. The default action is
to allow: the filter takes away what a confined program could use to reach
past its namespaces, its uid or the empty network; it does not try to
enumerate what Python needs.

Denied with EPERM (a ``PermissionError`` in Python, so the tool names a
``permission`` error rather than a crash):

  * other processes' memory: ptrace, process_vm_readv/writev, kcmp,
    pidfd_getfd (stealing another process's descriptor);
  * new namespaces and mounts: unshare, setns, clone with any CLONE_NEW*
    flag, mount, umount2, pivot_root, chroot and the mount API (fsopen,
    fsmount, move_mount, open_tree, ...); clone3 gets ENOSYS instead, since
    its flags sit in memory the filter cannot read, and the C library then
    falls back to clone, whose flags it can;
  * every socket: socket and socketpair for every address family (AF_UNIX
    included, so ctypes cannot connect to a Unix socket file of the host
    either), and io_uring, which can open and connect sockets on its own;
  * the kernel's own surfaces: keyctl/add_key/request_key, bpf,
    perf_event_open, userfaultfd, kexec, (f)init_module/delete_module,
    open_by_handle_at, and the clock, swap, reboot and accounting calls.

Only the native architecture's calls are allowed at all: a call made
through another ABI (32-bit int 0x80, x32) kills the process (libseccomp's
bad-architecture action).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno

__all__ = ["DENIED", "ENOSYS_CALLS", "NAMESPACE_FLAGS", "install", "problem"]

DENIED = (
  "ptrace",
  "process_vm_readv",
  "process_vm_writev",
  "kcmp",
  "pidfd_getfd",
  "unshare",
  "setns",
  "mount",
  "umount",
  "umount2",
  "pivot_root",
  "chroot",
  "fsopen",
  "fsconfig",
  "fsmount",
  "fspick",
  "move_mount",
  "open_tree",
  "mount_setattr",
  "socket",
  "socketpair",
  "io_uring_setup",
  "io_uring_enter",
  "io_uring_register",
  "keyctl",
  "add_key",
  "request_key",
  "bpf",
  "perf_event_open",
  "userfaultfd",
  "kexec_load",
  "kexec_file_load",
  "init_module",
  "finit_module",
  "delete_module",
  "open_by_handle_at",
  "name_to_handle_at",
  "acct",
  "swapon",
  "swapoff",
  "reboot",
  "syslog",
  "quotactl",
  "settimeofday",
  "clock_settime",
  "clock_adjtime",
  "adjtimex",
  "iopl",
  "ioperm",
  "lookup_dcookie",
  "vhangup",
)
ENOSYS_CALLS = ("clone3",)
# clone's flags that make a namespace (CLONE_NEWNS ... CLONE_NEWTIME).
NAMESPACE_FLAGS = (
  0x00020000,  # NEWNS
  0x02000000,  # NEWCGROUP
  0x04000000,  # NEWUTS
  0x08000000,  # NEWIPC
  0x10000000,  # NEWUSER
  0x20000000,  # NEWPID
  0x40000000,  # NEWNET
  0x00000080,  # NEWTIME
)

_ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_CMP_MASKED_EQ = 7


class _ArgCmp(ctypes.Structure):
  # struct scmp_arg_cmp: the argument's index, the comparison, two operands.
  _fields_ = [
    ("arg", ctypes.c_uint),
    ("op", ctypes.c_int),
    ("datum_a", ctypes.c_uint64),
    ("datum_b", ctypes.c_uint64),
  ]


def _library():
  """libseccomp with the prototypes used here, or None if not installed."""
  name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
  try:
    lib = ctypes.CDLL(name, use_errno=True)
  except OSError:
    return None
  lib.seccomp_init.restype = ctypes.c_void_p
  lib.seccomp_init.argtypes = [ctypes.c_uint32]
  lib.seccomp_release.argtypes = [ctypes.c_void_p]
  lib.seccomp_load.argtypes = [ctypes.c_void_p]
  lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
  lib.seccomp_rule_add_array.argtypes = [
    ctypes.c_void_p,
    ctypes.c_uint32,
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.POINTER(_ArgCmp),
  ]
  return lib


def problem() -> str | None:
  """Why no filter can be installed here, or None."""
  if _library() is None:
    return (
      "libseccomp (libseccomp.so.2) is not installed; install it with the "
      "system's package manager (Debian/Ubuntu: libseccomp2)"
    )
  return None


def _check(code: int, what: str) -> None:
  if code < 0:
    raise OSError(-code, f"seccomp {what}: {errno.errorcode.get(-code, code)}")


def install() -> None:
  """Loads the filter into this process; raises OSError if any part of it
  cannot be (the caller must not run the code then)."""
  lib = _library()
  if lib is None:
    raise OSError(errno.ENOSYS, problem())
  ctx = lib.seccomp_init(_ACT_ALLOW)
  if not ctx:
    raise OSError(errno.ENOMEM, "seccomp_init failed")
  try:
    eperm, enosys = _ACT_ERRNO | errno.EPERM, _ACT_ERRNO | errno.ENOSYS
    none = ctypes.POINTER(_ArgCmp)()
    for names, action in ((DENIED, eperm), (ENOSYS_CALLS, enosys)):
      for name in names:
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:  # no such call on this architecture
          continue
        _check(lib.seccomp_rule_add_array(ctx, action, number, 0, none), name)
    clone = lib.seccomp_syscall_resolve_name(b"clone")
    for flag in NAMESPACE_FLAGS:
      # clone's flags are its first argument on x86-64 and arm64.
      cmp = _ArgCmp(0, _CMP_MASKED_EQ, flag, flag)
      _check(
        lib.seccomp_rule_add_array(ctx, eperm, clone, 1, ctypes.byref(cmp)),
        f"clone flag {flag:#x}",
      )
    _check(lib.seccomp_load(ctx), "load")
  finally:
    lib.seccomp_release(ctx)
