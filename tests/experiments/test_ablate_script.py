"""experiments/ablate.py end to end on the tiny random model: a checked-in
style config file (shared "base" + runs) becomes one run directory per
(run, seed), the table has one row per run, typed flags beat the file, and
plot_run.py draws the result. Runs the scripts as a user would (subprocess)."""

import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import compile_cache_util
from rljax.train import config as config_lib

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
SCRIPTS = os.path.join(ROOT, "experiments")


def _script_env():
  # The run's compilation cache is inherited (compile_cache_util): every
  # script here trains the same tiny model.
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # One device is enough, and compiles fast (compile_cache_util).
  env["XLA_FLAGS"] = compile_cache_util.FAST_COMPILE_XLA_FLAGS
  return env


def _run(script, *args):
  env = _script_env()
  proc = subprocess.run(
    [sys.executable, os.path.join(SCRIPTS, script), *args],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


@functools.lru_cache(maxsize=None)
def _load_ablate():
  """The script as the module `ablate`: it defines absl flags, so it is
  executed once per process, and scripts that import it (long_horizon.py,
  qurl_replay.py, imported by other test files of this worker) share it."""
  if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
  import ablate

  return ablate


def test_checked_in_qurl_config_names_only_real_fields():
  ablate = _load_ablate()
  shared, runs, seeds = ablate.load_config_file(
    os.path.join(SCRIPTS, "configs", "qurl_cpu.json")
  )
  names = [r["name"] for r in runs]
  assert len(set(names)) == len(names)
  # The QuRL study's arms: reference, INT8 × every correction,
  # UAQ s ∈ {1, 1.5, 2} with ACR, FP8 with TIS and ACR.
  lookup = config_lib.lookup
  combos = {
    (
      lookup(r, "rollout.quant"),
      lookup(r, "loss.correction"),
      lookup(r, "rollout.uaq_scale"),
    )
    for r in runs
  }
  for need in [
    ("none", "naive", 1.0),
    ("int8", "naive", 1.0),
    ("int8", "ignore_behavior", 1.0),
    ("int8", "tis", 1.0),
    ("int8", "acr", 1.0),
    ("int8", "acr", 1.5),
    ("int8", "acr", 2.0),
    ("fp8", "tis", 1.0),
    ("fp8", "acr", 1.0),
  ]:
    assert need in combos, need
  cfg = config_lib.from_dict(shared)  # validates the shared settings
  assert cfg.task.eval_size > 0 and seeds


def test_only_process_zero_writes_the_study_files(tmp_path, monkeypatch):
  # Multi-host: every process runs the study; process 0 alone writes
  # its table and progress (the runs' own files are gated by the Trainer).
  ablate = _load_ablate()
  row = {
    "name": "a",
    "seed": 0,
    "status": "done",
    "steps": 1,
    "eval_final": 0.5,
    "eval_best": 0.5,
    "reward_last_q": 0.25,
  }
  monkeypatch.setattr(ablate.distributed, "is_main_process", lambda: False)
  assert "| a | 0 |" in ablate.write_table([row], str(tmp_path))
  ablate.write_progress([], str(tmp_path), "complete")
  assert os.listdir(tmp_path) == []
  monkeypatch.setattr(ablate.distributed, "is_main_process", lambda: True)
  ablate.write_table([row], str(tmp_path))
  ablate.write_progress([], str(tmp_path), "complete")
  assert sorted(os.listdir(tmp_path)) == [
    "progress.json",
    "table.json",
    "table.md",
  ]


def test_config_file_errors_name_the_bad_key(tmp_path):
  ablate = _load_ablate()
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"base": {"stepz": 3}, "runs": [{"name": "a"}]}))
  with pytest.raises(ValueError, match="base has 'stepz'"):
    ablate.load_config_file(str(bad))
  bad.write_text(json.dumps({"runs": [{"name": "a", "loss": {"eps": 1}}]}))
  with pytest.raises(ValueError, match=r"runs\[0\] has 'loss.eps'"):
    ablate.load_config_file(str(bad))
  bad.write_text(json.dumps({"runs": [{"rollout": {"quant": "int8"}}]}))
  with pytest.raises(ValueError, match=r"runs\[0\] has no 'name'"):
    ablate.load_config_file(str(bad))
  with pytest.raises(ValueError, match="'loss.eps' is not a TrainConfig"):
    ablate.grid_runs("loss.eps=0.2,0.3")
  assert ablate.grid_runs("rollout.quant=none,int8;loss.eps_high=0.2,0.3")[
    3
  ] == {
    "rollout.quant": "int8",
    "loss.eps_high": 0.3,
    "name": "rollout.quant=int8_loss.eps_high=0.3",
  }
  # An older flat axis keeps its run name (and so its run directories).
  assert ablate.grid_runs("rollout_quant=none,int8;uaq_scale=1.0,1.5")[3] == {
    "rollout.quant": "int8",
    "rollout.uaq_scale": 1.5,
    "name": "rollout_quant=int8_uaq_scale=1.5",
  }


def test_a_config_file_with_older_flat_keys_plans_the_same_runs(tmp_path):
  ablate = _load_ablate()
  flat = {
    "base": {"algorithm": "dapo", "steps": 3, "eps_high": 0.3},
    "runs": [{"name": "a", "rollout_quant": "none", "correction": "tis"}],
  }
  nested = {
    "base": {"algorithm": "dapo", "run": {"steps": 3}, "loss.eps_high": 0.3},
    "runs": [
      {"name": "a", "rollout": {"quant": "none"}, "loss": {"correction": "tis"}}
    ],
  }
  plans = []
  for name, data in (("flat", flat), ("nested", nested)):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    shared, runs, _ = ablate.load_config_file(str(path))
    plans.append(ablate.plan_runs(runs, shared, ["0"], str(tmp_path)))
  assert plans[0][0][2] == plans[1][0][2]
  assert plans[0][0][2].loss.correction == "tis"


def test_ablation_on_tiny_model_writes_runs_table_and_plots(tmp_path):
  config = {
    "base": {
      "model": {"name": "tiny"},
      "run": {"steps": 3, "eval_every": 2, "tensorboard": False},
      "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
      "task": {"eval_size": 4, "reward_workers": 0},
      "optim": {"learning_rate": 1e-3},
    },
    "seeds": [0],
    "runs": [
      {"name": "fp", "rollout.quant": "none", "loss.correction": "naive"},
      {"name": "q", "rollout.quant": "int8", "loss.correction": "acr"},
    ],
  }
  path = tmp_path / "grid.json"
  path.write_text(json.dumps(config))
  out = tmp_path / "out"
  # --steps typed on the command line beats the file's 3.
  _run("ablate.py", f"--configs={path}", f"--out_dir={out}", "--run.steps=2")
  table = json.loads((out / "table.json").read_text())
  assert [(r["name"], r["seed"], r["steps"]) for r in table] == [
    ("fp", 0, 2),
    ("q", 0, 2),
  ]
  for row in table:
    assert row["eval_before"] is not None and row["eval_final"] is not None
    assert row["eval_best"] >= row["eval_final"]
  run_cfg = json.loads((out / "q_s0" / "config.json").read_text())
  assert (
    run_cfg["rollout"]["quant"],
    run_cfg["loss"]["correction"],
    run_cfg["rollout"]["group_size"],
    run_cfg["run"]["steps"],
  ) == ("int8", "acr", 4, 2)
  table_md = (out / "table.md").read_text()
  assert "| fp | 0 | done | 2 |" in table_md
  # Speeds without the compiling first step, and the table says so.
  assert "s_per_step_warm" in table_md and "after the first" in table_md
  assert all(r["s_per_step_warm"] is not None for r in table)
  # Each run's memory, peak and after what it held was released.
  log = [json.loads(x) for x in open(out / "cpu_log.jsonl")]
  assert [r["run"] for r in log] == ["fp_s0", "q_s0"]
  assert all(0 < r["rss_after_release_gib"] <= r["peak_rss_gib"] for r in log)
  assert (out / "plots.png").stat().st_size > 10_000
  # A second call finds every run finished and only rebuilds the table.
  again = _run(
    "ablate.py", f"--configs={path}", f"--out_dir={out}", "--run.steps=2"
  )
  assert "[ablate] fp" not in again.stdout
  png = tmp_path / "both.png"
  proc = _run(
    "plot_run.py",
    f"--runs={out / 'fp_s0'},{out / 'q_s0'}",
    f"--out={png}",
    "--labels=fp,q",
  )
  assert png.stat().st_size > 10_000 and "panels" in proc.stdout


def test_grid_cell_algorithm_trains_that_algorithms_preset(tmp_path):
  """--grid="algorithm=grpo,dapo": the dapo cell gets DAPO's settings (it
  trains DAPO, not GRPO under a DAPO label), and the command line's own flags
  still apply on top."""
  from absl import flags

  ablate = _load_ablate()
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["ablate.py", "--kl.coef=0.002"])
  try:
    runs = ablate.grid_runs("algorithm=grpo,dapo")
    plan = ablate.plan_runs(runs, {"run.steps": 3}, ["0"], str(tmp_path))
  finally:
    flags.FLAGS.unparse_flags()
  by_name = {run["name"]: cfg for run, _, cfg in plan}
  grpo, dapo = by_name["algorithm=grpo"], by_name["algorithm=dapo"]
  assert (
    dapo.algorithm,
    dapo.advantage.dynamic_sampling,
    dapo.loss.eps_high,
  ) == (
    "dapo",
    True,
    0.28,
  )
  assert (
    grpo.algorithm,
    grpo.advantage.dynamic_sampling,
    grpo.loss.eps_high,
  ) == (
    "grpo",
    False,
    0.2,
  )
  # The typed flag names no algorithm: it holds for every cell; the base's
  # steps too; seed and run_dir are the cell's.
  assert grpo.kl.coef == dapo.kl.coef == 0.002
  assert grpo.run.steps == dapo.run.steps == 3
  assert (
    dapo.run.run_dir == str(tmp_path / "algorithm-dapo_s0") and dapo.run.resume
  )


def _tiny_config(tmp_path, steps, names=("a", "b")):
  # The flat keys of an older rljax, on purpose: such files still run
  # (config.LEGACY_KEYS).
  config = {
    "base": {
      "model": "tiny",
      "steps": steps,
      "prompts_per_step": 2,
      "group_size": 2,
      "max_new_tokens": 4,
      "eval_size": 2,
      "reward_workers": 0,
      "tensorboard": False,
      "checkpoint_every": 1,
      "learning_rate": 1e-3,
    },
    "runs": [
      {"name": n, "rollout_quant": "int8", "correction": "acr"} for n in names
    ],
  }
  path = tmp_path / "grid.json"
  path.write_text(json.dumps(config))
  return path


def _steps_of(run_dir):
  return [
    r["step"]
    for r in map(json.loads, open(run_dir / "metrics.jsonl"))
    if "loss" in r
  ]


def test_killed_ablation_resumes_where_it_stopped(tmp_path):
  """SIGKILL after run a finished and run b checkpointed mid-way; the same
  command again skips a, resumes b from its checkpoint, and tables both."""
  path = _tiny_config(tmp_path, steps=4)
  out = tmp_path / "out"
  env = _script_env()
  args = [
    sys.executable,
    os.path.join(SCRIPTS, "ablate.py"),
    f"--configs={path}",
    f"--out_dir={out}",
    "--seeds=0",
  ]
  log = open(tmp_path / "first.log", "w")
  proc = subprocess.Popen(
    args,
    stdout=log,
    stderr=subprocess.STDOUT,
    env=env,
    cwd=ROOT,
    start_new_session=True,
  )
  b_ckpt = out / "b_s0" / "checkpoints"
  deadline = time.monotonic() + 300
  try:
    while not (
      b_ckpt.is_dir()
      and any(d.isdigit() and int(d) >= 2 for d in os.listdir(b_ckpt))
    ):
      assert proc.poll() is None, open(tmp_path / "first.log").read()[-3000:]
      assert time.monotonic() < deadline, "run b never checkpointed step 2"
      time.sleep(0.2)
  finally:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
  assert (out / "a_s0" / "summary.json").exists()
  assert not (out / "b_s0" / "summary.json").exists()
  a_mtime = os.path.getmtime(out / "a_s0" / "metrics.jsonl")
  again = _run(
    "ablate.py", f"--configs={path}", f"--out_dir={out}", "--seeds=0"
  )
  assert "[ablate] a seed=0" not in again.stdout
  assert "[ablate] resuming b seed=0 from step" in again.stdout
  assert os.path.getmtime(out / "a_s0" / "metrics.jsonl") == a_mtime
  assert _steps_of(out / "b_s0") == [1, 2, 3, 4]  # no step twice, none lost
  # The resumed process keeps the first one's evaluation before training
  # (not null: the baseline of the run's before/after comparison).
  b_summary = json.loads((out / "b_s0" / "summary.json").read_text())
  assert b_summary["eval_accuracy_before"] is not None
  table = json.loads((out / "table.json").read_text())
  assert [(r["name"], r["status"], r["steps"]) for r in table] == [
    ("a", "done", 4),
    ("b", "done", 4),
  ]
  progress = json.loads((out / "progress.json").read_text())
  assert (progress["done"], progress["pending"]) == (2, 0)


def test_seeds_are_an_axis_and_progress_is_read_from_disk(tmp_path):
  """--seeds=0,1 doubles the plan (seed-major by default, so an interrupted
  study holds complete paired seeds); run status and progress come from
  the run directories alone."""
  ablate = _load_ablate()
  plan = ablate.plan_runs(
    [{"name": "a"}, {"name": "b"}],
    {"run.steps": 1},
    ["0", "1"],
    str(tmp_path),
    order="seed",
  )
  assert [(r["name"], s) for r, s, _ in plan] == [
    ("a", "0"),
    ("b", "0"),
    ("a", "1"),
    ("b", "1"),
  ]
  run_major = ablate.plan_runs(
    [{"name": "a"}, {"name": "b"}],
    {"run.steps": 1},
    ["0", "1"],
    str(tmp_path),
    order="run",
  )
  assert [(r["name"], s) for r, s, _ in run_major] == [
    ("a", "0"),
    ("a", "1"),
    ("b", "0"),
    ("b", "1"),
  ]
  done, partial = tmp_path / "a_s0", tmp_path / "b_s0"
  for d in (done, partial):
    d.mkdir()
    # The second line was cut by a kill: summarize skips it.
    (d / "metrics.jsonl").write_text(
      '{"step": 1, "loss": 0.5, "reward_mean": 0.25}\n{"step": 2, "lo'
    )
  (done / "summary.json").write_text("{}")
  (partial / "checkpoints" / "1").mkdir(parents=True)
  assert [ablate.run_status(cfg.run.run_dir) for _, _, cfg in plan] == [
    "done",
    "partial",
    "pending",
    "pending",
  ]
  assert ablate.latest_checkpoint(str(partial)) == 1
  rows = ablate.collect(plan)
  assert [
    (r["name"], r["status"], r["steps"], r["reward_last_q"]) for r in rows
  ] == [("a", "done", 1, 0.25), ("b", "partial", 1, 0.25)]
  progress = ablate.write_progress(plan, str(tmp_path), "--max_runs=1")
  assert (
    progress["done"],
    progress["partial"],
    progress["pending"],
    progress["stopped"],
  ) == (1, 1, 2, "--max_runs=1")


def test_grid_run_directories_have_no_equals_or_dots(tmp_path):
  # Portable directory names; a directory an older rljax made (with the
  # label's "=" and ".") keeps being used, so a study resumes in place.
  ablate = _load_ablate()
  name = ablate.grid_runs("rollout.quant=int8;loss.eps_high=0.28")[0]["name"]
  assert name == "rollout.quant=int8_loss.eps_high=0.28"  # the table's label
  path = ablate.run_dir_for(str(tmp_path), name, 0)
  assert os.path.basename(path) == "rollout_quant-int8_loss_eps_high-0p28_s0"
  (tmp_path / f"{name}_s0").mkdir()
  assert ablate.run_dir_for(str(tmp_path), name, 0) == str(
    tmp_path / f"{name}_s0"
  )
  assert ablate.run_dir_for(str(tmp_path), "int8_acr", 1) == str(
    tmp_path / "int8_acr_s1"
  )
