"""The Python tool's sandbox against hostile code: each attack is stopped or
contained, reported as a named error, the caller goes on, and no process is
left behind.

The fork bomb runs only after a bounded check (50 forks, each child
sleeping) shows that the process cap holds here: an uncapped unbounded bomb
would take the machine down, and root is exempt from RLIMIT_NPROC unless the
sandbox really drops to its own uid.
"""

import os
import sys
import time

import psutil
import pytest

from rljax.envs import PythonTool, sandbox
from rljax.envs.sandbox import SandboxConfig

# Short limits: every hostile case ends within ~2 s even on a loaded box.
FAST = SandboxConfig(timeout_s=2.0, cpu_s=1, memory_mb=256, max_processes=8)
NAMESPACES = sandbox.sandbox_mode() == "namespaces"
needs_namespaces = pytest.mark.skipif(
  not NAMESPACES, reason="needs root and util-linux unshare (namespaces mode)"
)


def _library_reachable() -> bool:
  """Whether the code can import the standard library after the uid change
  (namespaces mode mounts it into reach; rlimits mode needs it readable)."""
  if NAMESPACES or os.geteuid() != 0:
    return True
  path = ""
  for part in os.path.realpath(sys.base_prefix).split("/")[1:]:
    path += "/" + part
    if not os.stat(path).st_mode & 0o001:
      return False
  return True


def run_python(code, config):
  # Through the module attribute, so that the fixture below sees the call.
  return sandbox.run_python(code, config)


@pytest.fixture(autouse=True)
def no_process_left_behind(monkeypatch):
  """After each test: no process of a uid its calls ran as, and no
  descendant of this process (only this test's calls: other runs of the
  suite may share the machine)."""
  uids = set()
  real = sandbox.run_python

  def recording(code, config=SandboxConfig()):
    result = real(code, config)
    uids.add(result.uid)
    return result

  monkeypatch.setattr(sandbox, "run_python", recording)
  # Children this worker had before the test (an earlier test file's reward
  # pool, say, when the whole suite runs in one process) are not the test's.
  before = {p.pid for p in psutil.Process().children(recursive=True)}
  yield

  def left():
    found = [
      p
      for p in psutil.Process().children(recursive=True)
      if p.pid not in before
    ]
    for p in psutil.process_iter(["uids"]):
      if p.info["uids"] is not None and p.info["uids"].real in uids - {-1}:
        found.append(p)
    return found

  deadline = time.monotonic() + 3.0  # a killed child may take a moment to go
  while left() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert left() == []


def test_ordinary_code_runs():
  result = run_python("print(sum(range(10)))", FAST)
  assert (result.kind, result.stdout, result.message) == ("ok", "45\n", "")


def test_exception_is_reported_and_next_call_works():
  result = run_python("raise ValueError('boom')", FAST)
  assert result.kind == "exception" and "boom" in result.message
  assert run_python("print(1)", FAST).stdout == "1\n"


def test_syntax_error():
  assert run_python("def (:", FAST).kind == "syntax"


def test_infinite_loop_is_timeout():
  start = time.monotonic()
  result = run_python("while True:\n  pass", FAST)
  assert result.kind == "timeout"
  assert time.monotonic() - start < FAST.timeout_s + 2.0


def test_sleeping_code_hits_the_wall_clock():
  result = run_python("import time\ntime.sleep(60)", FAST)
  assert result.kind == "timeout" and "wall" in result.message


def test_children_die_with_the_call_even_after_setsid():
  # A child that leaves the process group, then outlives its parent.
  code = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "  os.setsid()\n"
    "  time.sleep(60)\n"
    "print('parent done')\n"
  )
  result = run_python(code, FAST)
  assert result.stdout == "parent done\n"
  # The autouse fixture checks that the sleeping child is gone.


def test_ten_gigabytes_is_memory_error():
  result = run_python("x = bytearray(10 * 1024**3)", FAST)
  assert result.kind == "memory"


def test_process_cap_holds_for_fifty_forks():
  code = (
    "import os, time\n"
    "started = 0\n"
    "for _ in range(50):\n"
    "  if os.fork() == 0:\n"
    "    time.sleep(5)\n"
    "    os._exit(0)\n"
    "  started += 1\n"
    "print(started)\n"
  )
  result = run_python(code, FAST)
  assert result.kind == "process_limit", result


def test_fork_bomb_is_capped():
  # Only once the bounded check above holds in this very environment.
  probe = run_python(
    "import os, time\nfor _ in range(50):\n  if os.fork() == 0:\n"
    "    time.sleep(5)\n    os._exit(0)\n",
    FAST,
  )
  if probe.kind != "process_limit":
    pytest.fail(f"process cap not effective ({probe}); not running the bomb")
  start = time.monotonic()
  result = run_python("import os\nwhile True:\n  os.fork()", FAST)
  assert result.kind in ("process_limit", "timeout")
  assert time.monotonic() - start < FAST.timeout_s + 2.0


@pytest.mark.parametrize("path", ["../escape.txt", "/tmp/rljax-escape.txt"])
def test_writing_outside_the_working_directory(path):
  if path.startswith("/tmp") and not NAMESPACES:
    pytest.skip("rlimits mode leaves world-writable directories writable")
  before = os.path.exists(path) if path.startswith("/") else False
  result = run_python(f"open({path!r}, 'w').write('x')", FAST)
  assert result.kind == "permission", result
  if path.startswith("/"):
    assert os.path.exists(path) == before


def test_working_directory_is_writable_and_fresh():
  first = run_python(
    "import os\nprint(os.listdir('.'))\nopen('a.txt', 'w').write('hi')\n"
    "print(open('a.txt').read())",
    FAST,
  )
  assert first.stdout == "[]\nhi\n"
  assert run_python("import os\nprint(os.listdir('.'))", FAST).stdout == "[]\n"


@pytest.mark.skipif(not _library_reachable(), reason="no socket module")
def test_socket_is_network_error():
  result = run_python(
    "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
    FAST,
  )
  assert result.kind == "network", result


@needs_namespaces
def test_network_namespace_has_only_loopback():
  # The host has its interfaces (eth0, ...); the sandbox sees none of them.
  code = "import socket\nprint([name for _, name in socket.if_nameindex()])"
  assert run_python(code, FAST).stdout == "['lo']\n"


@needs_namespaces
def test_network_namespace_cannot_reach_the_hosts_loopback():
  # Past the audit hook (a subprocess has no hook), the network namespace is
  # what holds: a server this test listens with on the host's 127.0.0.1 is
  # out of reach from inside (the sandbox's loopback is its own). Only
  # loopback addresses are ever dialled.
  import socket  # pylint: disable=g-import-not-at-top

  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = (
      "import subprocess, sys\n"
      "r = subprocess.run([sys.executable, '-c', "
      '"import socket\\n'
      "try:\\n"
      f"  socket.create_connection(('127.0.0.1', {port}), timeout=1)\\n"
      "  print('connected')\\n"
      "except OSError as e:\\n"
      "  print('refused', e.errno)\"], capture_output=True, text=True)\n"
      "print(r.stdout.strip())\n"
    )
    result = run_python(code, FAST)
  assert result.stdout.startswith("refused"), result


def test_environment_is_clean(monkeypatch):
  monkeypatch.setenv("RLJAX_TEST_SECRET", "s3cret")
  result = run_python("import os\nprint(sorted(os.environ))", FAST)
  assert result.kind == "ok"
  assert "RLJAX_TEST_SECRET" not in result.stdout
  assert "s3cret" not in result.stdout


@needs_namespaces
def test_runs_as_an_unprivileged_uid():
  result = run_python("import os\nprint(os.getuid(), os.getgid())", FAST)
  uid, gid = map(int, result.stdout.split())
  assert uid >= sandbox._UID_LOW and gid == uid


def test_output_is_cut():
  config = SandboxConfig(timeout_s=2.0, cpu_s=1, max_output_chars=100)
  result = run_python("print('x' * 10000)", config)
  assert result.kind == "ok" and result.truncated
  assert len(result.stdout) == 100


def test_python_tool_names_the_error():
  tool = PythonTool(FAST)
  assert tool.run({"code": "print(6 * 7)"}, 2.0).output == "42"
  failed = tool.run({"code": "x = bytearray(10 * 1024**3)"}, 2.0)
  assert failed.error == "memory" and "MemoryError" in failed.output
  assert tool.run({"program": "1"}, 2.0).error == "arguments"


@pytest.mark.parametrize(
  "field,value",
  [("timeout_s", 0), ("cpu_s", 0), ("memory_mb", 8), ("max_processes", True)],
)
def test_config_names_the_bad_field(field, value):
  with pytest.raises(ValueError, match=rf"SandboxConfig\.{field}="):
    SandboxConfig(**{field: value})


def test_output_written_before_the_end_is_all_kept():
  code = "import sys\nsys.stdout.write('y' * 3000)\nsys.stderr.write('e')"
  result = run_python(code, FAST)
  assert (len(result.stdout), result.stderr, result.kind) == (3000, "e", "ok")


def test_exit_zero_without_report_is_ok():
  result = run_python("import os\nprint('bye', flush=True)\nos._exit(0)", FAST)
  assert (result.kind, result.stdout) == ("ok", "bye\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop needs root")
class TestRlimitsModeAsRoot:
  """The weaker fallback (no namespaces), forced: the caps still hold and
  nothing outlives the call. Builtin modules only: after the uid change an
  interpreter under /root cannot import from its library in this mode."""

  @pytest.fixture(autouse=True)
  def rlimits_mode(self, monkeypatch):
    monkeypatch.setattr(sandbox, "_mode_cache", ["rlimits"])

  def test_runs_and_confines(self):
    assert run_python("print(2 + 2)", FAST).stdout == "4\n"
    assert run_python("open('../x', 'w')", FAST).kind == "permission"
    assert run_python("x = bytearray(10 * 1024**3)", FAST).kind == "memory"

  def test_process_cap_holds_for_fifty_forks(self):
    code = (
      "import os, time\nfor _ in range(50):\n  if os.fork() == 0:\n"
      "    time.sleep(5)\n    os._exit(0)\n"
    )
    assert run_python(code, FAST).kind == "process_limit"

  def test_setsid_child_is_killed(self):
    code = (
      "import os, time\nif os.fork() == 0:\n  os.setsid()\n  time.sleep(60)\n"
      "print('parent done')\n"
    )
    assert run_python(code, FAST).stdout == "parent done\n"
