"""A tool-task training process for tests/train/test_tool_async.py, to be
killed.

  python tests/train/tool_fault_worker.py '<json: dotted config fields>'

Trains the forced tiny decoder of test_tool_training.py on tool episodes
(`Trainer.run`; the JSON holds `run.run_dir` and the fields to change in
that file's `_config`). With $RLJAX_TEST_SLOW_CALL=K, the process's K-th
calculator call first creates the file $RLJAX_TEST_IN_EPISODE (an episode
is in flight) and then sleeps, so that the test can kill -9 the process
in the middle of the episode.
"""

import json
import os
import sys
import threading
import time

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _slow_calculator(slow: int, marker: str) -> None:
  from rljax.envs import tools

  run, count, lock = tools.CalculatorTool.run, [0], threading.Lock()

  def slow_run(self, arguments, timeout_s):
    with lock:
      count[0] += 1
      k = count[0]
    if k == slow:
      with open(marker, "w") as f:
        f.write("in flight")
      time.sleep(600)
    return run(self, arguments, timeout_s)

  tools.CalculatorTool.run = slow_run


def main(argv) -> None:
  overrides = json.loads(argv[1])
  sys.path.insert(0, ROOT)
  from absl import logging

  logging.set_verbosity(logging.WARNING)
  slow = int(os.environ.get("RLJAX_TEST_SLOW_CALL", "0"))
  if slow:
    _slow_calculator(slow, os.environ["RLJAX_TEST_IN_EPISODE"])
  from rljax.models.pretrained import tiny_tokenizer
  from rljax.train import loop as loop_lib
  from tests.train.test_tool_training import _config, _forced_model

  cfg = _config(overrides.pop("run.run_dir"), **overrides)
  trainer = loop_lib.Trainer(
    cfg, model=_forced_model(tiny_tokenizer()), show_progress=False
  )
  print(f"[worker] pid {os.getpid()} starts at step {trainer.step_num}")
  try:
    trainer.run()
  finally:
    trainer.close()


if __name__ == "__main__":
  main(sys.argv)
