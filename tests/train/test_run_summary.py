"""summary.json describes the whole run across the processes that trained
it, and re-running a finished run's command changes nothing.

One 3-step run of the tiny model through `driver.run_experiment` (the
entry point of every experiment script), as three processes would train
it: the first stops after step 1, the second trains steps 2-3 and dies
between its last checkpoint and its summary, the third restores step 3,
trains nothing and writes the summary. A fourth invocation finds the run
finished.
"""

import json
import os
import time

import pytest

from rljax.train import driver
from rljax.train import loop as loop_lib
from rljax.train.metrics import read_metrics
from tests.train.test_trainer import LetterTask, small_config

REAL_TRAINER = loop_lib.Trainer


class Stop(Exception):
  pass


def _letter_trainer(stop_after=None):
  """`Trainer` as run_experiment builds it, on test_trainer's task whose
  reward varies from step to step (so that steps are told apart by their
  rewards), stopping after step `stop_after`."""
  from rljax import data as data_lib  # pylint: disable=g-import-not-at-top
  from rljax.train import testing  # pylint: disable=g-import-not-at-top

  def build(cfg, show_progress=True):
    tokenizer = testing.tiny_tokenizer()
    examples = data_lib.generate_arithmetic(64, "easy", seed=cfg.run.seed)
    task = LetterTask(
      examples[8:], examples[:8], tokenizer, data_lib.ChatTemplate(tokenizer),
      cfg.rollout.prompts_per_step, cfg.run.seed, cfg.task.max_prompt_tokens,
      reward_workers=0,
    )  # fmt: skip
    trainer = REAL_TRAINER(cfg, task=task, show_progress=show_progress)
    if stop_after is not None:
      step = trainer.train_step

      def limited():
        row = step()
        if trainer.step_num == stop_after:
          raise Stop
        return row

      trainer.train_step = limited
    return trainer

  return build


def _files(run_dir):
  """{path: (bytes, mtime)} of every file under the run directory."""
  out = {}
  for root, _, names in os.walk(run_dir):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        out[path] = (f.read(), os.stat(path).st_mtime_ns)
  return out


@pytest.mark.slow  # a stopped run, resumed, then run again: three trainers
def test_the_summary_is_the_whole_runs_and_a_finished_run_is_left_alone(
  tmp_path, monkeypatch, capsys
):
  cfg = small_config("grpo", tmp_path, steps=3, group_size=2)
  resumed = small_config("grpo", tmp_path, steps=3, group_size=2, resume=True)

  monkeypatch.setattr(loop_lib, "Trainer", _letter_trainer(stop_after=1))
  with pytest.raises(Stop):
    driver.run_experiment(cfg, plot=False, show_progress=False)

  class Killed(Exception):
    pass

  def killed(*args):
    raise Killed  # dies after checkpoint 3, before summary.json

  monkeypatch.setattr(loop_lib, "Trainer", _letter_trainer())
  with monkeypatch.context() as m:
    m.setattr(driver, "write_outputs", killed)
    with pytest.raises(Killed):
      driver.run_experiment(resumed, plot=False, show_progress=False)
  assert not os.path.exists(tmp_path / "summary.json")
  assert "3" in os.listdir(tmp_path / "checkpoints")

  start = time.perf_counter()
  summary = driver.run_experiment(resumed, plot=False, show_progress=False)
  third = time.perf_counter() - start
  rows = read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2, 3]
  # The first step's reward, though the process that wrote the summary
  # trained no step; steps 1 and 3 differ, so the two are told apart.
  assert summary["first_reward"] == rows[0]["reward_mean"]
  assert summary["last_reward"] == rows[-1]["reward_mean"]
  assert rows[0]["reward_mean"] != rows[-1]["reward_mean"]
  assert summary["steps"] == 3 and summary["processes"] == 3
  with open(tmp_path / "processes.json", encoding="utf-8") as f:
    processes = json.load(f)["processes"]
  assert [p["last_step"] for p in processes] == [1, 3, None]
  assert summary["wall_s"] == pytest.approx(sum(p["wall_s"] for p in processes))
  assert summary["wall_s"] > third + processes[0]["wall_s"]
  with open(tmp_path / "summary.json", encoding="utf-8") as f:
    assert json.load(f) == json.loads(json.dumps(summary))

  before = _files(str(tmp_path))
  capsys.readouterr()
  again = driver.run_experiment(resumed, plot=False, show_progress=False)
  assert (
    "holds a finished run (3 steps, 3 process(es)" in capsys.readouterr().out
  )
  assert again == json.loads(json.dumps(summary))
  assert _files(str(tmp_path)) == before  # not one byte or mtime changed
