"""Two real processes on 127.0.0.1 = one process (multi-host training).

Two processes (`sharded_problem.py`, 4 fake CPU devices each, gloo
collectives) join through `rljax.distributed` (jax.distributed.initialize)
and run two sharded update steps on a global (2, 2, 2) mesh of 8 devices;
process 0 gathers and writes the state and metrics. This process runs the
same steps on its own 8 fake devices meanwhile; loss, metrics, params and
optimizer state must agree to float32 rounding.
"""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

import compile_cache_util
from parallel import sharded_problem

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
WORKER = os.path.join(ROOT, "tests", "parallel", "sharded_problem.py")
STEPS = 2


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.skipif(
  jax.device_count() < 8, reason="needs 8 (fake) devices: tests/conftest.py"
)
@pytest.mark.slow  # two training processes with a coordinator
def test_two_processes_equal_one(tmp_path):
  out = str(tmp_path / "two.npz")
  port = _free_port()
  env = dict(
    os.environ,
    PYTHONPATH=ROOT,
    XLA_FLAGS=compile_cache_util.FAST_COMPILE_XLA_FLAGS,
    JAX_PLATFORMS="cpu",
  )
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        WORKER,
        out,
        "2,2,2",
        str(STEPS),
        "policy",
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
    # The single-process reference compiles while the workers do.
    states, metrics, _ = sharded_problem.run((2, 2, 2), STEPS, critic=False)
    logs = [p.communicate(timeout=110)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  got = np.load(out)
  assert int(got["process_count"]) == 2
  assert int(got["device_count"]) == 8
  for i in range(STEPS):
    want = {
      f"{i}/state{k}": v for k, v in sharded_problem.flat(states[i]).items()
    }
    want.update(
      {
        f"{i}/metrics{k}": v
        for k, v in sharded_problem.flat(metrics[i]).items()
      }
    )
    for k, v in want.items():
      np.testing.assert_allclose(got[k], v, rtol=2e-5, atol=2e-6, err_msg=k)
  assert float(got["0/metrics['applied']"]) == 1.0
  loss = [float(got[f"{i}/metrics['loss']"]) for i in range(STEPS)]
  assert loss[0] != loss[1]  # the second step saw the first one's params
