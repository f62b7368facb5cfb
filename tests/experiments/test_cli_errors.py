"""A user error prints its message and exits 2; a traceback is for bugs
(a user should read what to fix, not a stack). One mechanism,
`rljax.train.cli`, for every script."""

import os
import subprocess
import sys

import pytest

from rljax.train import cli
from rljax.train import rundir
from rljax.train.config import ConfigError, Problem

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _script(name, *args, cwd=ROOT):
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    RLJAX_HUGE_PAGES="0",
    PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
  )
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "experiments", name), *args],
    capture_output=True,
    text=True,
    env=env,
    cwd=cwd,
    timeout=300,
  )


def _user_error(proc, message):
  assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert f"error: {message}" in proc.stderr, proc.stderr[-3000:]


class TestGuarded:
  @pytest.mark.parametrize(
    "error",
    [
      cli.UsageError("--grid axis 'x' is not FIELD=v1,v2"),
      ConfigError([Problem("loss.eps_high", -1.0, ">= 0")]),
      rundir.ConfigChangeError("run_dir='r' was trained ..."),
      rundir.RunDirExistsError("run_dir='r' already holds checkpoints"),
      rundir.RunDirLockedError("run_dir='r' is in use"),
    ],
  )
  def test_user_errors_exit_2_with_the_message(self, error, capsys):
    def main(argv):
      raise error

    with pytest.raises(SystemExit) as exit_:
      cli.guarded(main)([])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: {error}\n"

  def test_a_bug_keeps_its_traceback(self):
    def main(argv):
      raise KeyError("a bug")

    with pytest.raises(KeyError):
      cli.guarded(main)([])


def test_main_unknown_model_no_traceback_no_run_dir(tmp_path):
  run_dir = tmp_path / "run"
  proc = _script(
    "main.py", "--model.name=/no/such/model", f"--run.run_dir={run_dir}"
  )
  _user_error(proc, "1 problem in the training config")
  assert "--model.name='/no/such/model'" in proc.stderr
  assert not run_dir.exists()


def test_ablate_missing_configs_file_and_grid_typo(tmp_path):
  out = tmp_path / "abl"
  proc = _script(
    "ablate.py", f"--configs={tmp_path / 'no.json'}", f"--out_dir={out}"
  )
  _user_error(proc, f"--configs={str(tmp_path / 'no.json')!r}: no such file")
  proc = _script("ablate.py", "--grid=loss.eps_hig=0.1", f"--out_dir={out}")
  _user_error(proc, "--grid field 'loss.eps_hig' is not a TrainConfig field")
  proc = _script("ablate.py", f"--out_dir={out}")
  _user_error(proc, "give --grid and/or --configs")
  assert not out.exists()


def test_main_settings_nothing_reads_are_named_together(tmp_path):
  # Each was accepted and did nothing (or failed in the first rollout).
  run_dir = tmp_path / "run"
  proc = _script(
    "main.py",
    "--model.name=tiny",
    f"--run.run_dir={run_dir}",
    "--task.data_path=/no/such.jsonl",
    "--task.tool=python",
    "--critic.pretrain_steps=5",
    "--rollout.batching=continuous",
    "--rollout.kv_page_size=1000000000",
    "--task.eval_size=1000000",
  )
  _user_error(proc, "5 problems in the training config")
  for named in (
    "--task.data_path='/no/such.jsonl'; expected ''",
    "--task.tool='python'; expected 'calculator'",
    "--critic.pretrain_steps=5; expected 0 without a critic",
    "--rollout.kv_page_size=1000000000; expected <= 160",
    "--task.eval_size=1000000; expected <= 20000",
  ):
    assert named in proc.stderr, proc.stderr[-3000:]
  assert not run_dir.exists()


def test_bench_rollout_checks_every_flag_before_it_runs(tmp_path):
  out = tmp_path / "rows.json"
  proc = _script(
    "bench_rollout.py",
    "--workloads=foo,real",
    "--slots=0",
    "--kv_page_sizes=-4,abc,4096",
    f"--data={tmp_path / 'no.jsonl'}",
    f"--out={out}",
  )
  _user_error(proc, "6 problems in the flags")
  for named in (
    "--workloads='foo'; expected one of ('real', 'math500', 'longtail', 'fixed')",
    "--slots=0; expected >= 1",
    "--kv_page_sizes=-4; expected >= 0",
    "--kv_page_sizes='abc'; expected ints >= 0",
    "--kv_page_sizes=4096; expected <= 512",
    "no such file",
  ):
    assert named in proc.stderr, proc.stderr[-3000:]
  assert "machine:" not in proc.stdout  # nothing ran
  assert not out.exists()
