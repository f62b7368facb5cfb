"""The Python tool's file system: a minimal, read-only root of its own.

Stdlib only: the sandbox's child process loads this file by path. Run as
root in a fresh mount namespace (``build_root``), it assembles on a tmpfs

  /usr, /bin, /lib...     the system's programs and shared libraries
                          (read-only binds; the merged-/usr symlinks copied)
  <interpreter prefix>    sys.base_prefix and a virtualenv's sys.prefix,
                          read-only binds at their own paths (the
                          directories above them are empty)
  /etc                    only ld.so.cache and localtime
  /dev                    null, zero, full, random, urandom (binds)
  /proc                   a fresh procfs of the sandbox's PID namespace,
                          hidepid=2 (a process sees only its own uid's), or
                          an empty directory where the kernel refuses one
  /tmp, WORKDIR           private tmpfs, size-capped; WORKDIR is the code's
                          working directory, owned by the sandbox uid

then pivot_root()s into it and detaches the old root, so nothing else of
the host (the project's checkout, /tmp, /run, /home, /root, other jobs'
files, the trainer's /proc) is reachable by any path, and remounts the new
root read-only.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = ["WORKDIR", "build_root", "set_hostname", "unshare"]

WORKDIR = "/sandbox"

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2
# glibc has no pivot_root(); its number per architecture.
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203}
_DEVICES = ("null", "zero", "full", "random", "urandom")
_ETC = ("ld.so.cache", "localtime")
_MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _libc():
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mount.argtypes = [ctypes.c_char_p] * 3 + [
    ctypes.c_ulong,
    ctypes.c_char_p,
  ]
  libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
  libc.unshare.argtypes = [ctypes.c_int]
  return libc


def _fail(what: str) -> None:
  code = ctypes.get_errno()
  raise OSError(code, f"{what}: {os.strerror(code)}")


def unshare(flags: int) -> None:
  """unshare(2) (os.unshare is Python 3.12+)."""
  if _libc().unshare(flags) != 0:
    _fail(f"unshare({flags:#x})")


def set_hostname(name: str) -> None:
  """sethostname(2), in a UTS namespace of its own: the host's name is not
  the code's business."""
  if _libc().sethostname(name.encode(), len(name)) != 0:
    _fail("sethostname")


def _mount(source, target, fstype, flags, data=None) -> None:
  enc = lambda s: None if s is None else s.encode()  # noqa: E731
  if _libc().mount(enc(source), enc(target), enc(fstype), flags, enc(data)):
    _fail(f"mount {source} on {target}")


def _bind_read_only(source: str, target: str, extra: int = MS_NODEV) -> None:
  """A read-only bind of ``source`` at ``target`` (a bind takes the source's
  flags; read-only needs a second, remounting call)."""
  if os.path.isdir(source):
    os.makedirs(target, exist_ok=True)
  else:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    open(target, "a").close()
  _mount(source, target, None, MS_BIND)
  flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | extra
  _mount(None, target, None, flags)


def _prefixes() -> list[str]:
  """The interpreter's trees outside /usr, outermost first, none inside
  another."""
  out: list[str] = []
  for path in sorted({os.path.realpath(sys.base_prefix), sys.prefix}):
    path = os.path.abspath(path)
    covered = [p for p in ["/usr", *out] if (path + "/").startswith(p + "/")]
    if not covered:
      out.append(path)
  return out


def build_root(stage: str, uid: int, tmp_kb: int) -> str:
  """Builds the root on ``stage`` (an empty directory), enters it and
  returns how /proc was provided ("procfs" or "none").

  Must run as root in a mount namespace of its own (the mounts then never
  reach the host) and in the PID namespace the procfs is to show. Any
  failure raises: the caller must not run code in a partly built root.
  """
  _mount(None, "/", None, MS_REC | MS_PRIVATE)
  _mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
  new = lambda path: stage + path  # noqa: E731
  _bind_read_only("/usr", new("/usr"))
  for name in _MERGED_USR:
    path = "/" + name
    if os.path.islink(path):
      os.symlink(os.readlink(path), new(path))
    elif os.path.isdir(path):
      _bind_read_only(path, new(path))
  for prefix in _prefixes():
    _bind_read_only(prefix, new(prefix))
  os.makedirs(new("/etc"))
  for name in _ETC:
    path = "/etc/" + name
    if os.path.islink(path):
      os.symlink(os.readlink(path), new(path))
    elif os.path.isfile(path):
      _bind_read_only(path, new(path))
  os.makedirs(new("/dev"))
  for name in _DEVICES:
    if os.path.exists("/dev/" + name):  # a container may lack /dev/full
      _bind_read_only("/dev/" + name, new("/dev/" + name), extra=0)
  for name, target in (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
  ):
    os.symlink(target, new("/dev/" + name))
  os.makedirs(new("/proc"))
  proc = "procfs"
  try:
    # Before the old root goes: the kernel mounts a new procfs only where
    # an unmasked one is already in the namespace.
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount("proc", new("/proc"), "proc", flags, "hidepid=2")
  except OSError:
    proc = "none"
  size = f"size={tmp_kb}k"
  for path, options in (
    ("/tmp", f"mode=1777,{size}"),
    (WORKDIR, f"mode=0700,uid={uid},gid={uid},{size}"),
  ):
    os.makedirs(new(path))
    _mount("tmpfs", new(path), "tmpfs", MS_NOSUID | MS_NODEV, options)
  _pivot(stage)
  _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
  return proc


def _pivot(stage: str) -> None:
  number = _PIVOT_ROOT.get(platform.machine())
  if number is None:
    raise OSError(f"pivot_root: no system-call number for {platform.machine()}")
  old = "/.old-root"
  os.makedirs(stage + old)
  os.chdir(stage)
  libc = _libc()
  if libc.syscall(number, b".", b"." + old.encode()) != 0:
    _fail("pivot_root")
  os.chdir("/")
  if libc.umount2(old.encode(), MNT_DETACH) != 0:
    _fail("umount the old root")
  os.rmdir(old)
