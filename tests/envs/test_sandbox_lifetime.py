"""No sandboxed process outlives its trainer: a trainer-like process starts
a Python tool call that would run for ten minutes, is killed with SIGKILL
in the middle of it, and every process of the call is gone moments later,
including ones that left the process group (setsid) or their parent
(a double fork). What a killed trainer leaves on disk (its call's empty
cgroup and directory) is removed by the next trainer's first call."""

import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

import rljax
from rljax.envs import sandbox, sandbox_cgroup
from rljax.envs.sandbox import SandboxConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(rljax.__file__)))
STRONG_PROBLEM = sandbox.strong_problem()
pytestmark = pytest.mark.skipif(
  STRONG_PROBLEM is not None,
  reason=f"the strong sandbox cannot run here: {STRONG_PROBLEM}",
)

TRAINER = r"""
import sys
from rljax.envs import sandbox
sandbox.run_python(sys.argv[1], sandbox.SandboxConfig(timeout_s=600, cpu_s=600))
"""
# The call: a main process sleeping ten minutes, a child in a session of its
# own and a grandchild whose parent has exited (double fork): three
# processes of the code, two of them out of its process group.
CODE = (
  "import os, time\n"
  "if os.fork() == 0:\n"
  "  os.setsid()\n"
  "  time.sleep(600)\n"
  "if os.fork() == 0:\n"
  "  os.setsid()\n"
  "  if os.fork() == 0:\n"
  "    time.sleep(600)\n"
  "  os._exit(0)\n"
  "time.sleep(600)\n"
)


def _alive(process: psutil.Process) -> bool:
  try:
    return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def _sandboxed(trainer: psutil.Process) -> list[psutil.Process]:
  """The trainer's descendants that run as a sandbox uid: the code's."""
  out = []
  for p in trainer.children(recursive=True):
    try:
      if p.uids().real >= sandbox._UID_LOW and _alive(p):
        out.append(p)
    except psutil.NoSuchProcess:
      pass
  return out


def _start_call(code: str, processes: int):
  """A trainer in the middle of a call of ``code``, once ``processes`` of
  the code run; returns the trainer and every process below it."""
  env = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "PYTHONPATH": REPO,
    "JAX_PLATFORMS": "cpu",
    "HOME": tempfile.gettempdir(),
  }
  trainer = subprocess.Popen([sys.executable, "-c", TRAINER, code], env=env)
  parent = psutil.Process(trainer.pid)
  deadline = time.monotonic() + 60
  while len(_sandboxed(parent)) < processes:
    assert trainer.poll() is None, "the trainer ended before the call ran"
    assert time.monotonic() < deadline, "the call's processes never ran"
    time.sleep(0.05)
  return trainer, parent.children(recursive=True)


@pytest.fixture(scope="module")
def killed_trainer():
  """A trainer SIGKILLed in the middle of a call of CODE: its pid and the
  processes that were below it, with 5 s given to them to go."""
  trainer, tree = _start_call(CODE, 3)
  try:
    os.kill(trainer.pid, signal.SIGKILL)
    trainer.wait()
    deadline = time.monotonic() + 5.0
    while any(map(_alive, tree)) and time.monotonic() < deadline:
      time.sleep(0.05)
    yield trainer.pid, tree
  finally:
    for p in tree:  # whatever the outcome, nothing of this test runs on
      try:
        p.kill()
      except psutil.NoSuchProcess:
        pass


def test_a_killed_trainer_takes_its_call_along(killed_trainer):
  _, tree = killed_trainer
  assert len(tree) >= 5  # supervisor, init, the code's three
  assert [p for p in tree if _alive(p)] == []


def test_what_a_killed_trainer_left_is_swept(killed_trainer, monkeypatch):
  pid, _ = killed_trainer
  found = sandbox_cgroup.hierarchy()
  groups = f"{sandbox_cgroup.PREFIX}{pid}-"
  tmp = f"{sandbox._TMP_PREFIX}{pid}-"

  def left():
    names = os.listdir(tempfile.gettempdir())
    for parent in found.parents if found else ():
      names += os.listdir(parent)
    return [n for n in names if n.startswith((groups, tmp))]

  assert left() != []  # the call's cgroup (if any) and directory
  # The next trainer's first call sweeps them.
  monkeypatch.setattr(sandbox_cgroup, "_swept", [])
  monkeypatch.setattr(sandbox, "_swept_tmp", [])
  assert sandbox.run_python("print(1)", SandboxConfig()).stdout == "1\n"
  assert left() == []
