"""rljax.train.metrics: a run's metrics read back from either file form."""

import gzip
import json
import os

import pytest

from rljax.train import metrics as metrics_lib

ROWS = [
  {"step": 0, "eval_accuracy": 0.25, "eval_reward": 0.25},
  {"step": 1, "loss": -0.5, "reward_mean": 0.125},
]


def _write(run_dir, compressed):
  os.makedirs(run_dir, exist_ok=True)
  text = "".join(json.dumps(r) + "\n" for r in ROWS)
  path = os.path.join(run_dir, "metrics.jsonl")
  if compressed:
    with gzip.open(path + ".gz", "wt", encoding="utf-8") as f:
      f.write(text)
  else:
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)


@pytest.mark.parametrize("compressed", [False, True])
def test_read_metrics_and_recorded_eval(tmp_path, compressed):
  run_dir = str(tmp_path / "run")
  _write(run_dir, compressed)
  assert metrics_lib.has_metrics(run_dir)
  assert metrics_lib.metrics_path(run_dir).endswith(
    ".gz" if compressed else ".jsonl"
  )
  assert metrics_lib.read_metrics(run_dir) == ROWS
  assert metrics_lib.recorded_eval(run_dir, 0) == {
    "eval_accuracy": 0.25,
    "eval_reward": 0.25,
  }


def test_plain_file_wins_over_an_archived_copy(tmp_path):
  # A run still writing (plain) beside an older archive: the live file.
  run_dir = str(tmp_path / "run")
  _write(run_dir, compressed=True)
  with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 7}) + "\n")
  assert metrics_lib.read_metrics(run_dir) == [{"step": 7}]


def test_no_metrics(tmp_path):
  assert not metrics_lib.has_metrics(str(tmp_path))
  assert metrics_lib.recorded_eval(str(tmp_path)) == {}
