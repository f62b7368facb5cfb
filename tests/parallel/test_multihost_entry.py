"""Every training script can join a multi-host run, and only process 0
writes a run's outputs (no two processes write one file)."""

import glob
import json
import os
import subprocess
import sys

import pytest

from rljax import distributed
from rljax.train import driver
from rljax.train import loop as loop_lib
from rljax.train.config import TrainConfig

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

# A fresh process: import the default job's script as `python
# experiments/main.py` would, parse no flags, resolve its config, then
# initialize. Nothing may have started a JAX backend before `initialize`
# (jax.distributed.initialize must come first), and without the flags (and
# no cluster in the environment) nothing is initialized.
_PROBE = """
import sys
sys.argv = ["main.py"]
sys.path.insert(0, "experiments")
import main  # noqa: F401  (defines the flags)
from absl import flags
from jax._src import xla_bridge
from rljax import distributed
from rljax.train import flags as train_flags
flags.FLAGS(sys.argv)
train_flags.config_from_flags()
assert not xla_bridge.backends_are_initialized(), "backend started early"
assert distributed.initialize_from_flags() is False
import jax
print("OK", jax.process_count(), distributed._initialized)
"""


def test_main_script_has_the_flags_and_initializes_nothing_by_default():
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in distributed._CLUSTER_ENV  # no cluster to auto-detect
  }
  env["PYTHONPATH"] = ROOT
  out = subprocess.run(
    [sys.executable, "-c", _PROBE],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split()[-3:] == ["OK", "1", "False"]
  helps = subprocess.run(
    [sys.executable, "experiments/main.py", "--helpfull"],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  ).stdout
  for name in ("coordinator_address", "num_processes", "process_id"):
    assert f"--{name}" in helps, name


def test_every_training_script_goes_through_the_initialize_call():
  # A script that defines the trainer's flags builds a Trainer: through
  # driver.run_experiment (which initializes), or calling it itself.
  scripts = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")))
  checked = []
  for path in scripts:
    with open(path, encoding="utf-8") as f:
      text = f.read()
    if "define_train_flags(" not in text and "import ablate" not in text:
      continue
    via_driver = "from rljax.train.driver import run_experiment" in text
    assert via_driver or "initialize_from_flags()" in text, path
    checked.append(os.path.basename(path))
  assert {"main.py", "ablate.py", "long_horizon.py", "ppo_gsm8k.py"} <= set(
    checked
  )


class FakeTrainer:
  """A stand-in for `loop.Trainer` (a fake: what is tested is the driver's
  order of calls and its process-0 gate, and a second process cannot be
  made here); it records whether the processes were joined before it was
  built."""

  built = []

  def __init__(self, cfg, show_progress=True):
    FakeTrainer.built.append(driver_initialized[0])
    self.cfg, self.uaq_scale, self.step_num, self.lora = cfg, 1.0, 0, None

  def run(self):
    self.step_num = 1
    return [{"reward_mean": 0.5}]

  def close(self):
    pass


driver_initialized = [False]


@pytest.mark.parametrize("main_process", [True, False])
def test_run_experiment_joins_first_and_only_process_0_writes(
  tmp_path, monkeypatch, main_process
):
  FakeTrainer.built.clear()
  driver_initialized[0] = False

  def initialize():
    driver_initialized[0] = True
    return False

  monkeypatch.setattr(distributed, "initialize_from_flags", initialize)
  monkeypatch.setattr(distributed, "is_main_process", lambda: main_process)
  monkeypatch.setattr(loop_lib, "Trainer", FakeTrainer)
  cfg = TrainConfig().replace(
    {
      "run.run_dir": str(tmp_path),
      "task.eval_size": 0,
      "run.export_hf": False,
    }
  )
  summary = driver.run_experiment(cfg, plot=False, show_progress=False)
  assert FakeTrainer.built == [True]  # joined before the trainer was built
  assert summary["steps"] == 1
  written = os.path.exists(tmp_path / "summary.json")
  assert written == main_process
  if written:
    with open(tmp_path / "summary.json", encoding="utf-8") as f:
      assert json.load(f)["last_reward"] == 0.5
