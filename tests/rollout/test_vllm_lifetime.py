"""No vLLM server outlives its trainer, and its HTTP surface stays local:
the guard that stops a server (and removes its sync dirs) when the trainer
dies, pool restarts, stand-in servers killed with their trainer, the bearer-token
middleware and the batch-invariant option."""

import fnmatch
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest
import safetensors.numpy
import vllm_ext_util

from rljax.rollout import vllm_sidecar, weight_sync
from rljax.rollout.vllm import api as vllm_api
from rljax.rollout.vllm import guard as vllm_guard
from rljax.rollout.vllm import process as vllm_process
from rljax.rollout.vllm.process import LaunchedServer
from rljax.rollout.vllm_sidecar import (
  SidecarError,
  VLLMSidecar,
  VLLMSidecarConfig,
)


def _running_in_group(pgid: int) -> bool:
  """True if a live (non-zombie) process has process group pgid."""
  return bool(vllm_guard.group_members(pgid))


class TestGuard:
  """The parent of a launched server that cleans up after a dead trainer."""

  def test_exits_with_the_server_exit_code(self, tmp_path):
    argv = vllm_sidecar.guarded_command(
      [sys.executable, "-c", "import sys; sys.exit(3)"],
      os.getpid(),
      str(tmp_path / "none-*"),
    )
    guard = subprocess.Popen(argv, start_new_session=True)
    assert guard.wait(timeout=60) == 3

  def test_stops_the_server_and_removes_sync_dirs_when_the_trainer_dies(
    self, tmp_path
  ):
    (tmp_path / "sync-0").mkdir()
    (tmp_path / "sync-0" / "model.safetensors").write_bytes(b"x")
    marker = tmp_path / "server-alive"
    server = [
      sys.executable,
      "-c",
      f"import time; open({str(marker)!r}, 'w').close(); time.sleep(300)",
    ]
    # A "trainer" that launches the guarded server and dies without close().
    trainer_code = textwrap.dedent(f"""
        import os, subprocess, sys
        from rljax.rollout import vllm_sidecar
        argv = vllm_sidecar.guarded_command({server!r}, os.getpid(),
                                            {str(tmp_path / "sync-*")!r})
        guard = subprocess.Popen(argv, start_new_session=True)
        print(guard.pid, flush=True)
        import time
        while not os.path.exists({str(marker)!r}):
          time.sleep(0.05)
        os._exit(0)
    """)
    trainer = subprocess.run(
      [sys.executable, "-c", trainer_code],
      capture_output=True,
      text=True,
      timeout=120,
      check=True,
    )
    guard_pid = int(trainer.stdout.split()[0])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (tmp_path / "sync-0").exists():
      time.sleep(0.2)
    assert not (tmp_path / "sync-0").exists()
    while time.monotonic() < deadline and _running_in_group(guard_pid):
      time.sleep(0.2)
    assert not _running_in_group(guard_pid)

  def test_the_server_dies_with_its_guard(self, tmp_path):
    # The guard killed by SIGKILL (it cannot clean up): the server gets
    # SIGTERM from the kernel (PR_SET_PDEATHSIG) instead of running on.
    argv = vllm_sidecar.guarded_command(
      [sys.executable, "-c", "import time; time.sleep(300)"],
      os.getpid(),
      str(tmp_path / "none-*"),
    )
    guard = subprocess.Popen(argv, start_new_session=True)
    try:
      deadline = time.monotonic() + 60
      server = None
      while server is None and time.monotonic() < deadline:
        try:
          with open(f"/proc/{guard.pid}/task/{guard.pid}/children") as f:
            server = int(f.read().split()[0])
        except (OSError, IndexError):
          time.sleep(0.05)
      time.sleep(0.5)  # past the child's prctl
      guard.kill()
      guard.wait(timeout=30)
      while time.monotonic() < deadline and _process_start(server):
        time.sleep(0.1)
      assert _process_start(server) is None, "the server outlived its guard"
    finally:
      try:
        os.killpg(guard.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


def test_pool_restart_relaunches_only_unhealthy_members():
  """The trainer recovers any engine with `restart()`; on a pool that must
  relaunch the dead members and leave healthy ones serving."""
  from rljax.rollout.vllm_sidecar import VLLMSidecarPool

  class Member:
    def __init__(self, alive):
      self.alive, self.restarts = alive, 0

    def is_alive(self):
      return self.alive

    def restart(self):
      self.restarts += 1

  pool = object.__new__(VLLMSidecarPool)  # no real servers behind it
  pool.sidecars = [Member(True), Member(False), Member(True)]
  pool.restart()
  assert [m.restarts for m in pool.sidecars] == [0, 1, 0]


# -- process supervision and local surface, on a stand-in server -------------
#
# A real vLLM engine takes 1-2 min to start on 2 CPU cores; these tests need
# several launches. STAND_IN is a stand-in for the vLLM API server (named as
# such), run as a real process through the sidecar's own launch, guard,
# restart and close code: it answers the few routes the sidecar's start-up
# handshake uses, requires the bearer key from its environment like the
# launched vLLM server does, and forks one child that stands in for vLLM's
# engine-core process (on SIGTERM it stops that child, as vLLM's server shuts
# its engine down).
STAND_IN = r"""
import http.server, json, os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
# STAND_IN_HANG=1: completions after the start-up probe's never answer, and
# the first SIGTERM only stops the engine child, as vLLM's graceful shutdown
# then waits for open connections to close; a second SIGTERM ends it.
hang = os.environ.get("STAND_IN_HANG") == "1"
terms, completions = [], []
def stop(*_):
  child.kill()
  terms.append(1)
  if not hang or len(terms) > 1:
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
key = os.environ.get("VLLM_API_KEY")  # the sidecar always sets one

class Handler(http.server.BaseHTTPRequestHandler):
  def log_message(self, *args):
    pass
  def _answer(self, status, body):
    data = json.dumps(body).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)
  def _route(self):
    if key and self.path != "/health" and self.headers.get(
        "Authorization") != "Bearer " + key:
      return self._answer(401, {"error": "Unauthorized"})
    if self.path == "/v1/models":
      return self._answer(200, {"data": [{"id": "policy",
                                          "max_model_len": 64}]})
    if self.path == "/v1/completions":
      completions.append(1)
      if hang and len(completions) > 1:
        time.sleep(600)
      return self._answer(200, {"choices": [{
          "index": 0, "token_ids": [1], "finish_reason": "length",
          "logprobs": {"token_logprobs": [0.0]}}]})
    if self.path == "/reset_prefix_cache":
      return self._answer(200, {"success": True})
    return self._answer(200, {})
  def do_GET(self):
    self._route()
  def do_POST(self):
    self.rfile.read(int(self.headers.get("Content-Length") or 0))
    self._route()

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])),
                                Handler).serve_forever()
"""


@pytest.fixture
def stand_in(tmp_path):
  """(stand-in server script, tiny checkpoint dir)."""
  script = tmp_path / "stand_in_vllm_server.py"
  script.write_text(STAND_IN)
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  (ckpt / "config.json").write_text(
    json.dumps({"vocab_size": 8, "torch_dtype": "bfloat16"})
  )
  safetensors.numpy.save_file(
    {"w": np.zeros((2, 2), np.float32)}, str(ckpt / "model.safetensors")
  )
  return str(script), str(ckpt)


def _use_stand_in(monkeypatch, script):
  monkeypatch.setattr(
    LaunchedServer,
    "command",
    lambda self, port: [sys.executable, script, str(port)],
  )


def _process_start(pid: int) -> str | None:
  """Start time of a live (non-zombie) process pid, else None."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return None if fields[0] == "Z" else fields[19]


# The "trainer": launches a sidecar on the stand-in, kills its guard with
# SIGKILL (what tests/train/test_trainer_vllm.py does to a real engine),
# restarts it through VLLMSidecar.restart() (what the trainer calls on a
# SidecarError), prints every process either launch started, then ends:
# "exit" = normal interpreter exit without close(), "sigkill" = waits to be
# killed by SIGKILL.
_TRAINER = r"""
import json, os, signal, sys, time
from rljax.rollout import vllm_sidecar
from rljax.rollout.vllm_sidecar import LaunchedServer, SidecarError, VLLMSidecar
script, ckpt, mode = sys.argv[1:4]
LaunchedServer.command = lambda self, port: [sys.executable, script, str(port)]
sidecar = VLLMSidecar(ckpt, vllm_sidecar.VLLMSidecarConfig(
    startup_timeout_s=60))

def members(pgid):
  found = []
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if fields[0] != "Z" and int(fields[2]) == pgid:
      found.append(int(entry))
  return found

def group(sidecar):
  deadline = time.monotonic() + 30
  while len(members(sidecar.pid)) < 3:  # guard + server + engine core
    assert time.monotonic() < deadline
    time.sleep(0.05)
  return members(sidecar.pid)

pids = group(sidecar)
os.kill(sidecar.pid, signal.SIGKILL)
sidecar._server.proc.wait()
try:
  sidecar.generate([[1, 2]], vllm_sidecar.SamplingConfig(max_new_tokens=1))
  raise AssertionError("a sidecar without its guard was usable")
except SidecarError:
  pass
sidecar.restart()
pids += group(sidecar)
print(json.dumps(pids), flush=True)
if mode == "sigkill":
  time.sleep(600)
"""


class TestNoEngineOutlivesItsTrainer:
  """Every server a sidecar ever launched, restarts included, is stopped
  when the trainer exits normally or is killed with SIGKILL."""

  @pytest.mark.parametrize("mode", ["exit", "sigkill"])
  def test_restarted_and_replaced_servers_are_all_stopped(self, stand_in, mode):
    script, ckpt = stand_in
    trainer = subprocess.Popen(
      [sys.executable, "-c", _TRAINER, script, ckpt, mode],
      stdout=subprocess.PIPE,
      text=True,
      env=dict(
        os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path)
      ),
    )
    line = trainer.stdout.readline()
    pids = json.loads(line)
    started = {pid: _process_start(pid) for pid in pids}
    assert len(pids) >= 5  # old server + core, new guard + server + core
    if mode == "sigkill":
      trainer.kill()
    assert trainer.wait(timeout=120) in (0, -signal.SIGKILL)
    deadline = time.monotonic() + 60
    survivors = pids
    while survivors and time.monotonic() < deadline:
      survivors = [
        p
        for p in pids
        if started[p] is not None and _process_start(p) == started[p]
      ]
      time.sleep(0.2)
    assert not survivors, (
      f"{len(survivors)} of the {len(pids)} sidecar processes outlived a "
      f"trainer that ended by {mode}: {survivors}"
    )

  def test_close_stops_the_restarted_and_the_replaced_server(
    self, stand_in, monkeypatch
  ):
    script, ckpt = stand_in
    _use_stand_in(monkeypatch, script)
    sidecar = VLLMSidecar(ckpt, VLLMSidecarConfig(startup_timeout_s=60))
    first = sidecar.pid
    # The guard dies alone: its server and engine stay in its group.
    os.kill(first, signal.SIGKILL)
    sidecar._server.proc.wait()  # pylint: disable=protected-access
    sidecar.restart()
    second = sidecar.pid
    assert second != first
    sidecar.close()
    deadline = time.monotonic() + 30
    while (_running_in_group(first) or _running_in_group(second)) and (
      time.monotonic() < deadline
    ):
      time.sleep(0.1)
    assert not _running_in_group(first), "the replaced server outlived close()"
    assert not _running_in_group(second)


def test_a_rollout_waiting_on_a_server_whose_guard_died_fails_at_once(
  stand_in, monkeypatch
):
  """The guard killed while a request waits: its server gets SIGTERM and,
  like vLLM's, keeps the connection open while it shuts down. The rollout
  must fail (SidecarError, which the trainer answers with a restart) within
  seconds, not wait out the request timeout."""
  script, ckpt = stand_in
  _use_stand_in(monkeypatch, script)
  monkeypatch.setenv("STAND_IN_HANG", "1")
  sidecar = VLLMSidecar(
    ckpt, VLLMSidecarConfig(startup_timeout_s=60, request_timeout_s=300)
  )
  try:
    guard = sidecar.pid
    killer = threading.Timer(1.0, os.kill, (guard, signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    with pytest.raises(SidecarError, match="unanswered"):
      sidecar.generate([[1, 2]], vllm_sidecar.SamplingConfig(max_new_tokens=1))
    assert time.monotonic() - started < 30
    killer.join()
  finally:
    sidecar.close()


class TestLocalSurface:
  """Per-run API key, owner-only sync dirs and per-sidecar log files."""

  def test_key_is_random_per_sidecar_sent_and_never_on_argv(
    self, stand_in, monkeypatch
  ):
    script, ckpt = stand_in
    _use_stand_in(monkeypatch, script)
    # The stand-in answers 401 without the key of its environment: the
    # handshake passing means the client sent it.
    with (
      VLLMSidecar(ckpt, VLLMSidecarConfig()) as a,
      VLLMSidecar(ckpt, VLLMSidecarConfig()) as b,
    ):
      keys = [s.api_key for s in (a, b)]
      assert keys[0] != keys[1] and all(len(k) >= 32 for k in keys)
      with open(f"/proc/{a.pid}/cmdline", "rb") as f:  # the guard's argv
        assert keys[0].encode() not in f.read()
      with pytest.raises(vllm_api.VLLMRequestError, match="HTTP 401"):
        vllm_api.VLLMClient(a.url).models()
      with pytest.raises(vllm_api.VLLMRequestError, match="HTTP 401"):
        vllm_api.VLLMClient(a.url, api_key=keys[1]).collective_rpc("x")
      assert "api_key" not in repr(a.config) and keys[0] not in repr(
        a._client.http
      )  # pylint: disable=protected-access
      # Two sidecars: two log files, each in an owner-only dir of its own.
      assert a.log_path != b.log_path
      for s in (a, b):
        assert os.stat(os.path.dirname(s.log_path)).st_mode & 0o777 == 0o700
        assert os.stat(s.log_path).st_mode & 0o077 == 0
      assert os.path.dirname(a.log_path) != os.path.dirname(b.log_path)
      assert not a.log_path.startswith(
        os.path.join(tempfile.gettempdir(), "rljax-vllm-logs" + os.sep)
      )

  def test_shared_log_dir_gets_distinct_owner_only_files(
    self, stand_in, monkeypatch, tmp_path
  ):
    script, ckpt = stand_in
    _use_stand_in(monkeypatch, script)
    run_logs = tmp_path / "run" / "vllm_logs"
    cfg = VLLMSidecarConfig(log_dir=str(run_logs))
    with VLLMSidecar(ckpt, cfg) as a, VLLMSidecar(ckpt, cfg) as b:
      assert a.log_path != b.log_path
      assert {os.path.dirname(a.log_path), os.path.dirname(b.log_path)} == {
        str(run_logs)
      }
      assert os.stat(run_logs).st_mode & 0o777 == 0o700
      # Weight syncs: owner-only dirs in the sync root.
      a.update_weights({"w": np.ones((2, 2), np.float32)})
      current = a._sync_dirs.current  # pylint: disable=protected-access
      assert os.stat(current).st_mode & 0o777 == 0o700

  def test_sync_dirs_are_owner_only_and_unpredictable(self, tmp_path):
    old = os.umask(0)  # even a permissive umask gives 0700
    try:
      dirs = weight_sync.SyncDirs(tmp_path / "root")
      first, second = dirs.new(10), dirs.new(10)
    finally:
      os.umask(old)
    for path in (first, second, str(tmp_path / "root")):
      assert os.stat(path).st_mode & 0o777 == 0o700, path
    assert fnmatch.fnmatch(first, dirs.glob_pattern)
    dirs.cleanup()


def _auth_middleware():
  auth = vllm_ext_util.import_extension("rljax_vllm_auth")
  return auth.BearerTokenMiddleware


class TestBearerTokenMiddleware:
  """third_party/vllm_ext/rljax_vllm_auth.py, which guards the dev routes
  (/collective_rpc, /reset_prefix_cache, ...) that vLLM 0.32's --api-key
  leaves open."""

  def _call(self, middleware_cls, path, headers=()):
    async def app(scope, receive, send):
      await send({"type": "http.response.start", "status": 200, "headers": []})
      await send({"type": "http.response.body", "body": b"ok"})

    sent = []

    async def send(message):
      sent.append(message)

    async def receive():
      return {"type": "http.request", "body": b""}

    scope = {
      "type": "http",
      "method": "POST",
      "path": path,
      "headers": [(k.encode(), v.encode()) for k, v in headers],
    }
    import asyncio  # pylint: disable=g-import-not-at-top

    asyncio.run(middleware_cls(app)(scope, receive, send))
    return sent[0]["status"]

  def test_every_route_but_health_needs_the_key(self, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    cls = _auth_middleware()
    for path in (
      "/collective_rpc",
      "/reset_prefix_cache",
      "/v1/completions",
      "/v1/models",
      "/sleep",
      "/metrics",
    ):
      assert self._call(cls, path) == 401, path
      assert self._call(cls, path, [("authorization", "Bearer nope")]) == 401
      assert self._call(cls, path, [("Authorization", "Basic s3cret")]) == 401
      assert self._call(cls, path, [("authorization", "Bearer s3cret")]) == 200
    assert self._call(cls, "/health") == 200

  def test_refuses_to_start_without_a_key(self, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is not set"):
      _auth_middleware()(None)


class TestBatchInvariantOption:
  def _env(self, **config):
    server = LaunchedServer("/ckpt", VLLMSidecarConfig(**config), "k", "g")
    return server.environment()

  def test_sets_vllm_batch_invariant_on_gpu_builds(self, monkeypatch):
    monkeypatch.setattr(vllm_process, "is_cpu_build", lambda: False)
    assert self._env(batch_invariant=True)["VLLM_BATCH_INVARIANT"] == "1"
    assert "VLLM_BATCH_INVARIANT" not in self._env() or os.environ.get(
      "VLLM_BATCH_INVARIANT"
    )

  def test_refused_on_the_cpu_build(self, monkeypatch):
    monkeypatch.setattr(vllm_process, "is_cpu_build", lambda: True)
    with pytest.raises(ValueError, match=r"batch_invariant=True.*CPU build"):
      self._env(batch_invariant=True)

  def test_server_key_is_in_the_environment_not_overridable(self):
    env = self._env(env=(("VLLM_API_KEY", "other"),))
    assert env["VLLM_API_KEY"] == "k"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == vllm_sidecar.EXTENSION_DIR
