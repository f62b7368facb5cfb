"""Two real processes run the Trainer as one process does (multi-host).

Two processes (`trainer_problem.py`, 4 fake CPU devices each, gloo
collectives) join through `rljax.distributed` (jax.distributed.initialize)
and run two Trainer steps of the tiny model on a global (2, 2, 2) mesh,
sharing one run directory: process 0 holds its lock and writes the metrics
and the checkpoints' manifests, both write and then restore the orbax
checkpoints. This process then runs the same steps on its own 8 fake
devices; the rows (loss, every metric), the params after each step and the
restored params must agree to float32 rounding.
"""

import json
import os
import socket
import subprocess
import sys

import jax
import pytest

import compile_cache_util
from parallel import trainer_problem

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
WORKER = os.path.join(ROOT, "tests", "parallel", "trainer_problem.py")
MESH = "2,2,2"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.skipif(
  jax.device_count() < 8, reason="needs 8 (fake) devices: tests/conftest.py"
)
@pytest.mark.slow
def test_two_process_trainer_equals_one_process(tmp_path):
  out, run_dir = str(tmp_path / "two.npz"), tmp_path / "run"
  port = _free_port()
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),
    XLA_FLAGS=compile_cache_util.FAST_COMPILE_XLA_FLAGS,
    JAX_PLATFORMS="cpu",
  )
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        WORKER,
        out,
        str(run_dir),
        MESH,
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
        f"--process_id={i}",
        "--cpu_devices_per_process=4",
      ],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  try:
    logs = [p.communicate(timeout=150)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  # The single-process reference runs after the workers, not beside them:
  # on two cores the three only take turns, and beside them (after
  # test_trainer_mesh.py in the same process) an 8-device program of the
  # reference, the quantizer diagnostics' copy of θ, twice never finished.
  rows, params, _ = trainer_problem.run(tmp_path / "one", MESH)
  got_rows, got_params, restored, got = trainer_problem.read_result(out)
  assert int(got["process_count"]) == 2
  assert int(got["device_count"]) == 8
  steps = trainer_problem.STEPS
  trainer_problem.assert_rows_close(got_rows, rows)
  for i in range(steps):
    trainer_problem.assert_params_close_flat(got_params[i], params[i])
  # The resume restored exactly the last step's params.
  assert int(got["resumed_step"]) == steps
  trainer_problem.assert_params_close_flat(restored, params[-1])
  # One writer: process 0's metrics, one row per step, no lock left behind.
  with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
    logged = [json.loads(line) for line in f if line.strip()]
  assert [r["step"] for r in logged] == list(range(1, steps + 1))
  assert sorted(os.listdir(run_dir / "checkpoints")) == ["1", "2"]
