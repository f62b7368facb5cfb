"""The QuRL scripts run as shipped: each takes one step
on the tiny model with its own defaults overridden only for size, drops
over-long prompts with a count in the metrics, evaluates the paper's
benchmarks, and refuses to train on a file it evaluates."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import compile_cache_util
from rljax import data as data_lib
from rljax import evaluation
from rljax.train import driver
from rljax.train import tasks as tasks_lib
from rljax.train.config import apply_preset

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
SHARED = os.path.join(ROOT, "..", "shared", "data")
needs_data = pytest.mark.skipif(
  not os.path.isdir(SHARED), reason="../shared/data is not present"
)

# Size only: the model, steps, batch, token and evaluation sizes (and no
# side processes: in-process verifier, no TensorBoard, no HF export).
SIZE = [
  "--model.name=tiny",
  "--run.steps=1",
  "--rollout.prompts_per_step=2",
  "--rollout.max_new_tokens=4",
  "--task.eval_size=2",
  "--bench_limit=2",
  "--task.reward_workers=0",
  "--run.tensorboard=false",
  "--run.export_hf=false",
]


def _run(script, *args):
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
  )
  # One device is enough, and compiles fast (compile_cache_util).
  env["XLA_FLAGS"] = compile_cache_util.FAST_COMPILE_XLA_FLAGS
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "experiments", script), *args],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=1500,
  )


@needs_data
@pytest.mark.parametrize(
  "script,sizes,benchmarks",
  [
    ("ppo_gsm8k.py", [], {"gsm8k"}),
    (
      "dapo_math.py",
      ["--rollout.group_size=2", "--bench_samples=2"],
      {"aime24"},
    ),
    (
      "grpo_deepscaler.py",
      ["--rollout.group_size=2", "--bench_samples=2"],
      {"aime24", "math500", "amc23", "minerva"},
    ),
  ],
)
def test_script_runs_one_step_as_shipped(script, sizes, benchmarks, tmp_path):
  run_dir = tmp_path / "run"
  proc = _run(script, *SIZE, *sizes, f"--run.run_dir={run_dir}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rows = [json.loads(l) for l in open(run_dir / "metrics.jsonl")]
  step1 = [r for r in rows if r["step"] == 1 and "loss" in r]
  assert step1 and "prompts_filtered_long" in step1[0]
  summary = json.load(open(run_dir / "summary.json"))
  assert set(summary["benchmarks"]) == benchmarks
  for label in benchmarks:
    assert summary["benchmarks"][label]["examples"] == 2
    assert os.path.exists(run_dir / "benchmarks" / f"{label}.jsonl")
  if script == "grpo_deepscaler.py":  # not in ../shared/data
    assert "benchmark olympiadbench: skipped" in proc.stdout


@needs_data
def test_training_on_the_evaluated_file_is_refused_before_loading(tmp_path):
  test_file = os.path.join("..", "shared", "data", "gsm8k", "test.jsonl")
  copy = tmp_path / "copy.jsonl"  # the same rows under another name
  shutil.copy(os.path.join(ROOT, test_file), copy)
  for data_path in (test_file, str(copy)):
    run_dir = tmp_path / "run"
    proc = _run(
      "ppo_gsm8k.py",
      *SIZE,
      f"--task.data_path={data_path}",
      f"--run.run_dir={run_dir}",
    )
    assert proc.returncode != 0
    assert "is the evaluated benchmark gsm8k" in proc.stderr
    assert "--allow_train_on_eval" in proc.stderr
    assert not run_dir.exists()  # refused before the trainer started


def _jsonl(path, questions):
  with open(path, "w") as f:
    for i, q in enumerate(questions):
      f.write(json.dumps({"problem": q, "answer": str(i)}) + "\n")
  return str(path)


def test_allow_train_on_eval_overrides_and_missing_files_are_skipped(
  tmp_path, capsys
):
  same = _jsonl(tmp_path / "a.jsonl", ["1+1?"])
  cfg = apply_preset("grpo", {"task.name": "math500", "task.data_path": same})
  plan = driver.BenchmarkPlan(
    specs=(
      evaluation.EvalSpec("math500", same, 0, "m"),
      evaluation.EvalSpec("olympiadbench", str(tmp_path / "no.jsonl"), 0, "ob"),
    ),
    samples=2,
    temperature=1.0,
  )
  with pytest.raises(ValueError, match="is the evaluated benchmark m"):
    driver.check_benchmarks(cfg, plan)
  import dataclasses

  allowed = dataclasses.replace(plan, allow_train_on_eval=True)
  assert [s.label for s in driver.check_benchmarks(cfg, allowed)] == ["m"]
  assert "benchmark ob: skipped" in capsys.readouterr().out


def test_long_prompts_are_dropped_and_counted(tmp_path):
  from rljax.train import testing

  tok = testing.tiny_tokenizer()
  long_q = "Compute " + " + ".join(str(i) for i in range(200)) + "."
  path = _jsonl(
    tmp_path / "d.jsonl",
    ["1+1?", long_q, "2+2?", long_q + " Again.", "3+3?", "4+4?"],
  )
  cfg = apply_preset(
    "grpo",
    {
      "task.name": "math500",
      "task.data_path": path,
      "task.eval_size": 2,
      "rollout.prompts_per_step": 2,
      "task.max_prompt_tokens": 64,
      "task.reward_workers": 0,
    },
  )
  task = tasks_lib.build_task(cfg, tok)
  try:
    assert task.prompts_filtered_long == 2
    seen = task.eval_examples() + task.next_train_batch(2)
    assert all(len(task.prompt_ids(e)) <= 64 for e in seen)
    assert len(task.eval_examples()) == 2  # eval_size kept after filtering
    assert "Compute 0" not in " ".join(e.question for e in seen)
  finally:
    task.close()
  short = data_lib.ChatTemplate(tok)
  kept, dropped = tasks_lib.drop_long_prompts(
    list(data_lib.load_dataset("math500", path)), short, tok, 64
  )
  assert (len(kept), dropped) == (4, 2)
