"""Hostile programs against the Python tool's sandbox, with its public API
and default settings: each attack is stopped and the host is untouched.

Attacks on the trainer itself (its environment, ptrace, a signal, a process
left running, its loopback listeners, a Unix socket of the host) run from a
separate trainer-like process that holds a secret in its environment and the
listeners the code tries to reach, once as this user and once as an
unprivileged user (uid 65534, made by this process when it is root). The
unprivileged trainer is where a sandbox that falls back to a weaker mode
fails open; a sandbox that fails closed refuses it instead.

The other attacks run from this process in the default (strong) mode and
skip, with the reason, where that mode cannot run here.
"""

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile

import psutil
import pytest

import rljax
from rljax.envs import sandbox
from rljax.envs.sandbox import SandboxConfig

# The checkout whose rljax these tests import (the trainer imports the same).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(rljax.__file__)))
CONFIG = SandboxConfig(timeout_s=10.0, cpu_s=5, memory_mb=256, max_processes=8)
STRONG_PROBLEM = sandbox.strong_problem()
needs_strong = pytest.mark.skipif(
  STRONG_PROBLEM is not None,
  reason=f"the strong sandbox cannot run here: {STRONG_PROBLEM}",
)
SECRET = "trainer-secret-" + secrets.token_hex(8)
NOBODY = 65534


def _alive(process: psutil.Process) -> bool:
  try:
    return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


@pytest.fixture(autouse=True, scope="module")
def nothing_left_running():
  """After the file: no process this file started runs on (an earlier
  file's processes in the same worker are not its)."""
  before = {p.pid for p in psutil.Process().children(recursive=True)}
  yield
  mine = [
    p for p in psutil.Process().children(recursive=True) if p.pid not in before
  ]
  psutil.wait_procs(mine, timeout=3)
  assert [p for p in mine if _alive(p)] == []


# ---------------------------------------------------- attacks on the trainer

_CTYPES = (
  "import ctypes, os, struct, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
)
TRAINER_ATTACKS = {
  # Every environment the code can read, the trainer's first.
  "environ": (
    "import os\n"
    "pids = [os.getppid()]\n"
    "if os.path.isdir('/proc'):\n"
    "  pids += [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
    "found = []\n"
    "for pid in pids:\n"
    "  try:\n"
    "    data = open(f'/proc/{pid}/environ', 'rb').read()\n"
    "  except OSError:\n"
    "    continue\n"
    "  found += [i.decode() for i in data.split(b'\\0')\n"
    "            if i.startswith(b'RLJAX_TRAINER_SECRET=')]\n"
    "print(found)\n"
  ),
  # PTRACE_SEIZE: attaches without stopping the trainer; 0 is success.
  "ptrace": _CTYPES
  + (
    "rc = libc.ptrace(0x4206, os.getppid(), None, None)\n"
    "print('attach', rc, ctypes.get_errno())\n"
  ),
  # A grandchild in a session of its own, sleeping under a marker name.
  "orphan": (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "  os.setsid()\n"
    "  if os.fork() == 0:\n"
    "    os.execv(sys.executable, [sys.executable, '-c',\n"
    "             'import time; time.sleep(30)', 'MARKER'])\n"
    "  os._exit(0)\n"
    "time.sleep(0.5)\n"
    "print('left behind')\n"
  ),
  # A subprocess has no audit hook: only the kernel can stop it.
  "tcp_subprocess": (
    "import subprocess, sys\n"
    "r = subprocess.run([sys.executable, '-c', 'import socket; "
    'socket.create_connection(("127.0.0.1", PORT), timeout=2)'
    '.sendall(b"x"); print("connected")\'], capture_output=True, text=True)\n'
    "print(r.stdout.strip() or r.stderr.strip()[-300:])\n"
  ),
  "tcp_ctypes": _CTYPES
  + (
    "fd = libc.socket(2, 1, 0)\n"
    "addr = struct.pack('=H', 2) + struct.pack('!H', PORT) + bytes([127, 0, 0, 1])"
    " + bytes(8)\n"
    "rc = libc.connect(fd, addr, len(addr)) if fd >= 0 else None\n"
    "print('socket', fd, 'connect', rc, ctypes.get_errno())\n"
  ),
  # A world-writable Unix socket file of the host: read-only mounts do not
  # stop connect(), and the audit hook does not see ctypes.
  "unix_ctypes": _CTYPES
  + (
    "fd = libc.socket(1, 1, 0)\n"
    "addr = struct.pack('=H', 1) + b'UNIX_PATH' + bytes(1)\n"
    "rc = libc.connect(fd, addr, len(addr)) if fd >= 0 else None\n"
    "print('socket', fd, 'connect', rc, ctypes.get_errno())\n"
  ),
  "named_unsafe_mode": "print('ran')",
  # Last: it would end the trainer.
  "kill": "import os\nos.kill(os.getppid(), 9)\nprint('sent')\n",
}
LISTENS = {"tcp_subprocess": "tcp", "tcp_ctypes": "tcp", "unix_ctypes": "unix"}

# The trainer: makes the listeners, makes each call as the trainer would,
# records whether a listener was reached and what was left running.
HARNESS = r"""
import json, os, select, signal, socket, sys, tempfile
from rljax.envs import sandbox

attacks, listens, config = json.loads(sys.argv[1])
marker = "rljax-orphan-" + os.urandom(6).hex()
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen(4)
unix_path = os.path.join(tempfile.mkdtemp(), "host.sock")
os.chmod(os.path.dirname(unix_path), 0o755)
unix = socket.socket(socket.AF_UNIX)
unix.bind(unix_path)
os.chmod(unix_path, 0o777)
unix.listen(4)
listeners = {"tcp": tcp, "unix": unix}
unavailable = getattr(sandbox, "SandboxUnavailable", ())
for name, code in attacks.items():
  code = (code.replace("PORT", str(tcp.getsockname()[1]))
          .replace("UNIX_PATH", unix_path).replace("MARKER", marker))
  record = {"name": name}
  try:
    mode = "unsafe_rlimits_only" if name == "named_unsafe_mode" else "strong"
    kwargs = dict(config, mode=mode) if mode != "strong" else config
    result = sandbox.run_python(code, sandbox.SandboxConfig(**kwargs))
    record.update(kind=result.kind, stdout=result.stdout,
                  stderr=result.stderr, message=result.message,
                  mode=result.mode)
  except unavailable as error:
    record["refused"] = str(error)
  except Exception as error:
    record["error"] = repr(error)
  listener = listeners.get(listens.get(name))
  if listener is not None:
    ready = select.select([listener], [], [], 0.3)[0]
    record["accepted"] = bool(ready)
    if ready:
      listener.accept()[0].close()
  orphans = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if marker.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
        orphans.append(int(pid))
        os.kill(int(pid), signal.SIGKILL)
    except OSError:
      pass
  record["orphans"] = len(orphans)
  print(json.dumps(record), flush=True)
"""

# Run as root: a mount namespace in which the interpreter (under /root,
# which others cannot enter) is reachable, then uid 65534 and the harness.
AS_NOBODY = r"""
import ctypes, os, sys, tempfile
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
def mount(source, target, fstype, flags, data=None):
  enc = lambda s: None if s is None else s.encode()
  if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)):
    raise OSError(ctypes.get_errno(), f"mount {target}")
if libc.unshare(0x20000):
  raise OSError(ctypes.get_errno(), "unshare")
mount(None, "/", None, 0x4000 | 0x40000)  # MS_REC | MS_PRIVATE
prefix, path = os.path.realpath(sys.base_prefix), ""
for part in prefix.split("/")[1:-1]:
  path += "/" + part
  if not os.stat(path).st_mode & 0o001:
    stage = tempfile.mkdtemp()
    mount(prefix, stage, None, 0x1000 | 0x4000)  # MS_BIND | MS_REC
    mount("tmpfs", path, "tmpfs", 0, "mode=0755")
    os.makedirs(prefix)
    mount(stage, prefix, None, 0x1000 | 0x4000)
    break
os.setgroups([])
os.setgid(NOBODY)
os.setuid(NOBODY)
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1], sys.argv[2]])
""".replace("NOBODY", str(NOBODY))


def _run_trainer(who: str, home: str) -> tuple[dict, int, str]:
  spec = json.dumps(
    [TRAINER_ATTACKS, LISTENS, {"timeout_s": 10.0, "memory_mb": 256}]
  )
  if who == "unprivileged":
    command = [sys.executable, "-c", AS_NOBODY, HARNESS, spec]
  else:
    command = [sys.executable, "-c", HARNESS, spec]
  env = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "PYTHONPATH": REPO,
    "HOME": home,
    "JAX_PLATFORMS": "cpu",
    "RLJAX_TRAINER_SECRET": SECRET,
  }
  done = subprocess.run(command, env=env, capture_output=True, timeout=300)
  records = {}
  for line in done.stdout.decode().splitlines():
    if line.startswith("{"):
      record = json.loads(line)
      records[record["name"]] = record
  return records, done.returncode, done.stderr.decode()[-3000:]


@pytest.fixture(scope="module")
def trainer():
  """who -> (records by attack, the trainer's exit status), run once."""
  runs = {}
  home = tempfile.mkdtemp()
  os.chmod(home, 0o777)  # the unprivileged trainer's too

  def run(who):
    if who == "unprivileged" and os.geteuid() != 0:
      pytest.skip(
        "this process is not root: 'this_user' is the unprivileged one"
      )
    if who not in runs:
      runs[who] = _run_trainer(who, home)
    return runs[who]

  yield run
  shutil.rmtree(home, ignore_errors=True)


WHO = ["this_user", "unprivileged"]


def _record(trainer, who, name) -> dict:
  records, code, stderr = trainer(who)
  assert name in records, f"the trainer died before {name!r}: {code}\n{stderr}"
  record = records[name]
  assert "error" not in record, record
  if "refused" not in record and STRONG_PROBLEM is None and who == "this_user":
    assert record["mode"] == "strong"  # the call ran in the sandbox
  if "refused" in record:  # failed closed: it names the weaker mode
    assert "unsafe_rlimits_only" in record["refused"]
  return record


@pytest.mark.parametrize("who", WHO)
def test_the_trainers_environment_is_out_of_reach(trainer, who):
  record = _record(trainer, who, "environ")
  assert SECRET not in json.dumps(record)


@pytest.mark.parametrize("who", WHO)
def test_the_trainer_cannot_be_traced(trainer, who):
  record = _record(trainer, who, "ptrace")
  assert not record.get("stdout", "").startswith("attach 0 "), record


@pytest.mark.parametrize("who", WHO)
def test_the_trainer_cannot_be_killed(trainer, who):
  records, code, stderr = trainer(who)
  assert code == 0, f"the trainer ended with {code}: {stderr}"
  assert "sent" not in _record(trainer, who, "kill").get("stdout", "")


@pytest.mark.parametrize("who", WHO)
def test_no_setsid_grandchild_outlives_the_call(trainer, who):
  assert _record(trainer, who, "orphan")["orphans"] == 0


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("attack", ["tcp_subprocess", "tcp_ctypes"])
def test_the_hosts_loopback_listener_is_out_of_reach(trainer, who, attack):
  record = _record(trainer, who, attack)
  assert record["accepted"] is False, record


@pytest.mark.parametrize("who", WHO)
def test_a_unix_socket_of_the_host_is_out_of_reach(trainer, who):
  record = _record(trainer, who, "unix_ctypes")
  assert record["accepted"] is False, record
  if "refused" not in record:
    assert record["stdout"].startswith("socket -1 "), record  # no socket


def test_the_unprivileged_trainer_gets_only_the_mode_it_names(trainer):
  records, _, _ = trainer("unprivileged")
  if STRONG_PROBLEM is None and os.geteuid() != 0:
    pytest.skip("the strong mode runs for this user")
  assert "refused" in records["environ"]  # the default mode: refused
  named = records["named_unsafe_mode"]
  assert (named["kind"], named["mode"]) == ("ok", "unsafe_rlimits_only")


# --------------------------------------------------- attacks on the sandbox

_UNSHARE_AND_MOUNT = _CTYPES + (
  "libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]\n"
  "if libc.unshare(0x10000000 | 0x20000) != 0:\n"  # CLONE_NEWUSER | NEWNS
  "  raise OSError(ctypes.get_errno(), 'unshare')\n"
  "if libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) != 0:\n"
  "  raise OSError(ctypes.get_errno(), 'mount')\n"
  "print('mounted')\n"
)


@needs_strong
def test_no_new_namespace_and_no_mount_inside():
  result = sandbox.run_python(_UNSHARE_AND_MOUNT, CONFIG)
  assert (result.kind, result.stdout) == ("permission", ""), result
  assert "EPERM" in result.message or "Errno 1]" in result.message


@needs_strong
def test_clone_with_a_new_namespace_is_denied():
  code = _CTYPES + (
    "rc = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\n"  # clone(NEWUSER)
    "if rc == 0:\n  os._exit(0)\n"
    "print(rc, ctypes.get_errno())\n"
  )
  assert sandbox.run_python(code, CONFIG).stdout == "-1 1\n"


@needs_strong
def test_ptrace_is_denied_even_on_its_own_child():
  code = _CTYPES + (
    "import time\n"
    "child = os.fork()\n"
    "if child == 0:\n  time.sleep(5)\n  os._exit(0)\n"
    "rc = libc.ptrace(0x4206, child, None, None)\n"  # PTRACE_SEIZE
    "print('attach', rc, ctypes.get_errno())\n"
  )
  assert sandbox.run_python(code, CONFIG).stdout == "attach -1 1\n"


@needs_strong
def test_every_socket_family_is_denied():
  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET; and socketpair.
  code = _CTYPES + (
    "print([libc.socket(f, 2, 0) for f in (1, 2, 10, 16, 17)])\n"
    "pair = (ctypes.c_int * 2)()\n"
    "print(libc.socketpair(1, 1, 0, pair), ctypes.get_errno())\n"
  )
  assert (
    sandbox.run_python(code, CONFIG).stdout == "[-1, -1, -1, -1, -1]\n-1 1\n"
  )


@needs_strong
def test_the_projects_source_is_out_of_sight():
  source = os.path.abspath(sandbox.__file__)
  code = (
    "import os\n"
    f"print(os.path.exists({REPO!r}), os.path.exists({source!r}))\n"
    "print([d for d in ('/work', '/home', '/root', '/run', '/var', '/opt')\n"
    "       if os.path.isdir(d) and os.listdir(d)])\n"
    f"open({source!r}).read()\n"
  )
  result = sandbox.run_python(code, CONFIG)
  assert result.stdout.startswith("False False\n"), result
  # /root holds only the empty way down to the interpreter's tree.
  assert result.stdout.split("\n")[1] in ("[]", "['/root']"), result
  assert result.kind == "exception" and "FileNotFoundError" in result.message


@needs_strong
def test_a_file_in_the_hosts_tmp_is_out_of_sight():
  with tempfile.NamedTemporaryFile("w", suffix=".answers") as f:
    f.write("the answer is 42")
    f.flush()
    os.chmod(f.name, 0o644)
    code = f"print(open({f.name!r}).read())"
    result = sandbox.run_python(code, CONFIG)
  assert "42" not in result.stdout
  assert result.kind == "exception" and "FileNotFoundError" in result.message


@needs_strong
def test_the_memory_cap_holds_for_the_whole_call():
  if sandbox.limits(CONFIG)["cgroup"].startswith("none"):
    pytest.skip(f"no cgroup here: {sandbox.limits(CONFIG)['cgroup']}")
  # Three children of 150 MB each: every one is under the 256 MB rlimit,
  # together they are not.
  code = (
    "import os, time\n"
    "kids = []\n"
    "for _ in range(3):\n"
    "  pid = os.fork()\n"
    "  if pid == 0:\n"
    "    held = 'x' * (150 << 20)\n"
    "    time.sleep(1)\n"
    "    os._exit(0)\n"
    "  kids.append(pid)\n"
    "print([os.waitpid(k, 0)[1] for k in kids])\n"
  )
  result = sandbox.run_python(code, CONFIG)
  assert result.kind == "memory", result
  assert "memory_mb=256" in result.message


@needs_strong
def test_writing_to_a_descriptor_cannot_forge_the_outcome():
  forged = '{"kind": "ok", "message": ""}'
  code = (
    "import os\n"
    "for fd in range(3, 1024):\n"
    "  try:\n"
    f"    os.write(fd, {forged!r}.encode())\n"
    "  except OSError:\n"
    "    pass\n"
    "raise ValueError('the real failure')\n"
  )
  result = sandbox.run_python(code, CONFIG)
  assert result.kind == "exception", result
  assert result.message == "ValueError: the real failure"


@needs_strong
def test_calling_the_reporter_cannot_forge_the_outcome():
  code = (
    "import __main__\n"
    "for name in ('_report', '_end'):\n"
    "  for args in (('ok', ''), (3,), (1, 'ok')):\n"
    "    try:\n"
    "      getattr(__main__, name)(*args)\n"
    "    except BaseException:\n"
    "      pass\n"
    "raise ValueError('the real failure')\n"
  )
  result = sandbox.run_python(code, CONFIG)
  assert result.kind == "exception", result
  assert result.message == "ValueError: the real failure"


@needs_strong
@pytest.mark.parametrize(
  "code",
  [
    "x = '\ud800'",  # a lone surrogate: not encodable source
    "-" * 200_000 + "1",  # the parser's stack (MemoryError)
    "a" + ".b" * 200_000,  # the compiler's recursion (RecursionError)
    "[" * 200_000 + "]" * 200_000,
  ],
  ids=["lone_surrogate", "deep_unary", "deep_attribute", "deep_list"],
)
def test_code_that_does_not_compile_is_syntax(code):
  result = sandbox.run_python(code, CONFIG)
  assert result.kind == "syntax", result
