"""The trainer on episodes of an environment server in its own process.

`experiments/env_server.py` serves the calculator environment in a child
process; `--task.env_url` points the trainer at it, and two GRPO steps run
on the forced tiny decoder of tests/train/test_tool_training.py (it calls
the calculator every turn). The steps must be those of the in-process
environment: the same episodes, tool metrics and masks.
"""

import os
import subprocess
import sys

import pytest

from rljax.train.config import ConfigError
from tests.train.test_tool_training import _check_steps, _config, _train

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.fixture
def server_url():
  proc = subprocess.Popen(
    [
      sys.executable,
      os.path.join(_ROOT, "experiments", "env_server.py"),
      "--port=0",
      "--max_turns=2",
      "--max_total_tokens=64",
    ],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=_ROOT),
  )
  try:
    line = proc.stdout.readline()  # "serving URL" once it answers
    if not line.startswith("serving http://"):
      proc.kill()
      raise AssertionError(f"no server: {line!r} {proc.stderr.read()[-2000:]}")
    yield line.split()[1]
  finally:
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.slow
def test_trains_two_steps_against_a_server_process(
  tmp_path, monkeypatch, server_url
):
  # max_turns is the server's (2); the trainer's stays at its default.
  cfg = _config(tmp_path, **{"task.env_url": server_url, "task.max_turns": 4})
  rows, collected, batches = _train(cfg, monkeypatch)
  _check_steps(rows, collected, batches)
  assert "eval_tool_call_rate" in rows[-1]


def test_settings_the_server_decides_are_refused(tmp_path):
  url = "http://127.0.0.1:9"
  with pytest.raises(ConfigError) as err:
    _config(
      tmp_path,
      **{
        "task.env_url": url,
        "task.tool_format": "qwen",
        "task.tool_choice": "required",
      },
    )
  text = str(err.value)
  for field in (
    "--task.tool_format='qwen'",
    "--task.tool_choice='required'",
    "--task.max_turns=2",
  ):
    assert field in text, text
  with pytest.raises(ConfigError, match="--task.env_url='127.0.0.1:80'"):
    _config(tmp_path, **{"task.env_url": "127.0.0.1:80", "task.max_turns": 4})
