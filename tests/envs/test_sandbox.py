"""The Python tool's sandbox: ordinary code runs, every failure is a named
error, the limits hold, the caller goes on, and no process is left behind;
the modes fail closed. (The attacks of a hostile program are in
test_sandbox_attacks.py, a killed trainer in test_sandbox_lifetime.py.)

The fork bomb runs only after a bounded check (50 forks, each child
sleeping) shows that the process cap holds here: an uncapped unbounded bomb
would take the machine down, and root is exempt from RLIMIT_NPROC unless the
sandbox really drops to its own uid.
"""

import dataclasses
import os
import time

import psutil
import pytest

from rljax.envs import PythonTool, sandbox, sandbox_cgroup
from rljax.envs.sandbox import SandboxConfig
from rljax.train import config as config_lib
from rljax.train import tool_task

# Short limits: every hostile case ends within ~2 s even on a loaded box.
FAST = SandboxConfig(timeout_s=2.0, cpu_s=1, memory_mb=256, max_processes=8)
UNSAFE = dataclasses.replace(FAST, mode="unsafe_rlimits_only")
STRONG_PROBLEM = sandbox.strong_problem()
needs_strong = pytest.mark.skipif(
  STRONG_PROBLEM is not None,
  reason=f"the strong sandbox cannot run here: {STRONG_PROBLEM}",
)


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
  # Nor a cgroup of this process's calls.
  found = sandbox_cgroup.hierarchy()
  mine = f"{sandbox_cgroup.PREFIX}{os.getpid()}-"
  for parent in found.parents if found else ():
    assert [n for n in os.listdir(parent) if n.startswith(mine)] == []


@needs_strong
def test_ordinary_code_runs():
  result = run_python("print(sum(range(10)))", FAST)
  assert (result.kind, result.stdout, result.message) == ("ok", "45\n", "")
  assert result.mode == "strong"


@needs_strong
def test_exception_is_reported_and_next_call_works():
  result = run_python("raise ValueError('boom')", FAST)
  assert result.kind == "exception" and result.message == "ValueError: boom"
  assert result.stderr == ""  # the message line is taken off stderr
  assert run_python("print(1)", FAST).stdout == "1\n"


@needs_strong
def test_syntax_error():
  assert run_python("def (:", FAST).kind == "syntax"


@needs_strong
def test_infinite_loop_is_timeout():
  start = time.monotonic()
  result = run_python("while True:\n  pass", FAST)
  assert result.kind == "timeout"
  assert time.monotonic() - start < FAST.timeout_s + 2.0


@needs_strong
def test_sleeping_code_hits_the_wall_clock():
  result = run_python("import time\ntime.sleep(60)", FAST)
  assert result.kind == "timeout" and "wall" in result.message


@needs_strong
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


@needs_strong
def test_ten_gigabytes_is_memory_error():
  result = run_python("x = bytearray(10 * 1024**3)", FAST)
  assert result.kind == "memory"


@needs_strong
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


@needs_strong
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


@needs_strong
@pytest.mark.parametrize("path", ["../escape.txt", "/tmp/../escape.txt"])
def test_writing_outside_the_working_directory(path):
  result = run_python(f"open({path!r}, 'w').write('x')", FAST)
  assert result.kind == "permission", result
  assert not os.path.exists("/escape.txt")


@needs_strong
def test_working_directory_and_tmp_are_writable_and_fresh():
  first = run_python(
    "import os\nprint(os.getcwd(), os.listdir('.'), os.listdir('/tmp'))\n"
    "open('a.txt', 'w').write('hi')\nopen('/tmp/b', 'w').write('b')\n"
    "print(open('a.txt').read())",
    FAST,
  )
  assert first.stdout == "/sandbox [] []\nhi\n"
  again = run_python(
    "import os\nprint(os.listdir('.'), os.listdir('/tmp'))", FAST
  )
  assert again.stdout == "[] []\n"


@needs_strong
def test_working_directory_is_size_capped():
  config = dataclasses.replace(FAST, workdir_kb=256)
  result = run_python("open('big', 'wb').write(b'x' * (1 << 20))", config)
  assert result.kind == "permission", result  # EFBIG or ENOSPC


@needs_strong
def test_socket_is_network_error():
  result = run_python(
    "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
    FAST,
  )
  assert result.kind == "network", result


@needs_strong
def test_libraries_and_threads_of_the_interpreter_work():
  # The root holds the interpreter's whole tree, site-packages included;
  # a thread starts although clone3 is refused (the C library falls back).
  code = (
    "import json, sqlite3, threading, numpy\n"
    "t = threading.Thread(target=print, args=(numpy.ones(2).sum(),))\n"
    "t.start()\nt.join()\n"
  )
  result = run_python(code, FAST)
  assert (result.kind, result.stdout) == ("ok", "2.0\n"), result


@needs_strong
def test_subprocess_of_the_interpreter_runs():
  code = (
    "import subprocess, sys\n"
    "r = subprocess.run([sys.executable, '-c', 'print(6 * 7)'],"
    " capture_output=True, text=True)\n"
    "print(r.stdout.strip(), r.returncode)"
  )
  assert run_python(code, FAST).stdout == "42 0\n"


@needs_strong
def test_environment_is_clean(monkeypatch):
  monkeypatch.setenv("RLJAX_TEST_SECRET", "s3cret")
  result = run_python("import os\nprint(sorted(os.environ))", FAST)
  assert result.kind == "ok"
  assert "RLJAX_TEST_SECRET" not in result.stdout
  assert "s3cret" not in result.stdout


@needs_strong
def test_runs_as_an_unprivileged_uid():
  result = run_python("import os\nprint(os.getuid(), os.getgid())", FAST)
  uid, gid = map(int, result.stdout.split())
  assert uid >= sandbox._UID_LOW and gid == uid == result.uid


@needs_strong
def test_output_is_cut():
  config = SandboxConfig(timeout_s=2.0, cpu_s=1, max_output_chars=100)
  result = run_python("print('x' * 10000)", config)
  assert result.kind == "ok" and result.truncated
  assert len(result.stdout) == 100


@needs_strong
def test_python_tool_names_the_error():
  tool = PythonTool(FAST)
  assert tool.run({"code": "print(6 * 7)"}, 2.0).output == "42"
  failed = tool.run({"code": "x = bytearray(10 * 1024**3)"}, 2.0)
  assert failed.error == "memory" and "MemoryError" in failed.output
  assert tool.run({"program": "1"}, 2.0).error == "arguments"


@pytest.mark.parametrize(
  "field,value",
  [
    ("timeout_s", 0),
    ("cpu_s", 0),
    ("memory_mb", 8),
    ("max_processes", True),
    ("mode", "rlimits"),
  ],
)
def test_config_names_the_bad_field(field, value):
  with pytest.raises(ValueError, match=rf"SandboxConfig\.{field}="):
    SandboxConfig(**{field: value})


@needs_strong
def test_output_written_before_the_end_is_all_kept():
  code = "import sys\nsys.stdout.write('y' * 3000)\nsys.stderr.write('e')"
  result = run_python(code, FAST)
  assert (len(result.stdout), result.stderr, result.kind) == (3000, "e", "ok")


@needs_strong
def test_exit_zero_without_report_is_ok():
  result = run_python("import os\nprint('bye', flush=True)\nos._exit(0)", FAST)
  assert (result.kind, result.stdout) == ("ok", "bye\n")


@needs_strong
def test_exit_status_of_its_own_is_a_crash():
  result = run_python("import os\nos._exit(3)", FAST)
  assert (result.kind, result.message) == (
    "crash",
    "the program exited with status 3",
  )


# ------------------------------------------------------------ the modes


def test_the_default_mode_is_strong():
  assert SandboxConfig().mode == "strong"
  assert PythonTool().config.mode == "strong"
  assert config_lib.TrainConfig().task.python_sandbox == "strong"
  # The config spells the modes out (it imports no environment code).
  assert config_lib.sections.PYTHON_SANDBOXES == sandbox.SANDBOX_MODES


@pytest.fixture
def strong_unavailable(monkeypatch):
  """The strong mode made unavailable, as on a machine without root."""
  monkeypatch.setattr(sandbox, "_strong_problem", ["no namespaces (simulated)"])


def test_an_unavailable_strong_mode_refuses_and_never_weakens(
  strong_unavailable,
):
  with pytest.raises(sandbox.SandboxUnavailable) as error:
    run_python("print(1)", FAST)
  assert "no namespaces (simulated)" in str(error.value)
  assert "--task.python_sandbox=unsafe_rlimits_only" in str(error.value)
  with pytest.raises(sandbox.SandboxUnavailable):
    PythonTool(FAST).run({"code": "print(1)"}, 2.0)
  with pytest.raises(sandbox.SandboxUnavailable):
    PythonTool().check()
  with pytest.raises(sandbox.SandboxUnavailable):
    tool_task.make_tool("python")
  assert sandbox.sandbox_mode() == "unavailable"


def test_the_trainer_refuses_an_unavailable_strong_mode(strong_unavailable):
  task = config_lib.TaskConfig(name="tool_arithmetic", tool="python")
  (problem,) = tool_task.sandbox_problems(task)
  assert problem.field == "task.python_sandbox"
  assert "no namespaces (simulated)" in str(problem)
  named = dataclasses.replace(task, python_sandbox="unsafe_rlimits_only")
  assert tool_task.sandbox_problems(named) == []


def test_the_tool_task_does_not_start(strong_unavailable):
  cfg = config_lib.resolve(
    "grpo", {"task.name": "tool_arithmetic", "task.tool": "python"}
  )
  # Refused before the tokenizer (or anything else) is used.
  with pytest.raises(config_lib.ConfigError, match="task.python_sandbox"):
    tool_task.build_tool_task(cfg, tokenizer=None)


def test_the_trainer_names_a_bad_or_idle_sandbox_setting():
  bad = config_lib.TaskConfig(
    name="tool_arithmetic", tool="python", python_sandbox="rlimits"
  )
  assert [p.field for p in tool_task.sandbox_problems(bad)] == [
    "task.python_sandbox"
  ]
  # Named for a calculator task, it would do nothing: said, not ignored.
  idle = config_lib.TaskConfig(
    name="tool_arithmetic", python_sandbox="unsafe_rlimits_only"
  )
  (problem,) = tool_task.sandbox_problems(idle)
  assert "task.tool='calculator'" in str(problem)


def test_the_named_unsafe_mode_runs_and_is_recorded(strong_unavailable):
  tool = tool_task.make_tool("python", "unsafe_rlimits_only")
  assert tool.config.mode == "unsafe_rlimits_only"
  assert tool.run({"code": "print(6 * 7)"}, 2.0).output == "42"
  assert run_python("print(1)", UNSAFE).mode == "unsafe_rlimits_only"
  # The run's config.json is `to_dict()`: the mode is in it.
  cfg = config_lib.resolve(
    "grpo", {"task.python_sandbox": "unsafe_rlimits_only"}
  )
  assert cfg.to_dict()["task"]["python_sandbox"] == "unsafe_rlimits_only"
  assert sandbox.limits(tool.config)["mode"] == "unsafe_rlimits_only"


def test_limits_say_what_bounds_the_total(monkeypatch):
  found = sandbox_cgroup.hierarchy()
  if found is not None:
    record = sandbox.limits(FAST)
    assert record["cgroup"] == f"v{found.version}"
    assert record["memory"] == "256 MB for the whole call (cgroup)"
  monkeypatch.setattr(
    sandbox_cgroup, "_found", [(None, "no cgroup (simulated)")]
  )
  record = sandbox.limits(FAST)
  assert record["cgroup"] == "none (no cgroup (simulated))"
  assert (
    "RLIMIT_AS" in record["memory"] and "at most 2048 MB" in record["memory"]
  )


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop needs root")
class TestUnsafeModeAsRoot:
  """The weaker mode, named: the caps still hold and nothing outlives the
  call. Builtin modules only: after the uid change an interpreter under
  /root cannot import from its library in this mode."""

  def test_runs_and_confines(self):
    result = run_python("print(2 + 2)", UNSAFE)
    assert (result.stdout, result.mode) == ("4\n", "unsafe_rlimits_only")
    assert run_python("open('../x', 'w')", UNSAFE).kind == "permission"
    assert run_python("x = bytearray(10 * 1024**3)", UNSAFE).kind == "memory"

  def test_process_cap_holds_for_fifty_forks(self):
    code = (
      "import os, time\nfor _ in range(50):\n  if os.fork() == 0:\n"
      "    time.sleep(5)\n    os._exit(0)\n"
    )
    assert run_python(code, UNSAFE).kind == "process_limit"

  def test_setsid_child_is_killed(self):
    code = (
      "import os, time\nif os.fork() == 0:\n  os.setsid()\n  time.sleep(60)\n"
      "print('parent done')\n"
    )
    assert run_python(code, UNSAFE).stdout == "parent done\n"
