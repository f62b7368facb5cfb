"""experiments/eval.py keys every result by a unique label: two files read
by one loader give two rows and two records files, and a duplicate label is
refused before any model loads, as are an unknown dataset name and a LIMIT
below 1. Runs the script as a user would (subprocess) on a tiny-model run
directory."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

import compile_cache_util
from rljax.train import loop as loop_lib
from rljax.train.checkpoint import RunCheckpointer
from rljax.train.config import apply_preset

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _run(*args):
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
  )
  # One device is enough, and compiles fast (compile_cache_util).
  env["XLA_FLAGS"] = compile_cache_util.FAST_COMPILE_XLA_FLAGS
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "experiments", "eval.py"), *args],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=600,
  )


def _math_file(path, answers):
  with open(path, "w") as f:
    for i, a in enumerate(answers):
      f.write(
        json.dumps(
          {
            "problem": f"What is {a} + 0?",
            "answer": str(a),
            "unique_id": f"p{i}",
          }
        )
        + "\n"
      )
  return str(path)


@pytest.fixture(scope="module")
def tiny_run_dir(tmp_path_factory):
  """A run directory of the tiny model: config.json + one checkpoint."""
  run_dir = tmp_path_factory.mktemp("run")
  cfg = apply_preset(
    "grpo",
    {
      "model.name": "tiny",
      "rollout.quant": "none",
      "run.run_dir": str(run_dir),
    },
  )
  with open(run_dir / "config.json", "w") as f:
    json.dump(dataclasses.asdict(cfg), f)
  model = loop_lib.load_policy(cfg, 0)
  ckpt = RunCheckpointer(str(run_dir / "checkpoints"), 1, 2)
  ckpt.save(1, {"params": model.params}, {"step": 1, "uaq_scale": 1.0})
  ckpt.close()
  return str(run_dir)


@pytest.mark.slow  # a whole script run
def test_two_files_of_one_loader_keep_both_results(tiny_run_dir, tmp_path):
  a = _math_file(tmp_path / "a.jsonl", [1, 2])
  b = _math_file(tmp_path / "b.jsonl", [3, 4, 5])
  out = tmp_path / "out"
  proc = _run(
    f"--model={tiny_run_dir}",
    f"--datasets=a=math500:{a},b=math500:{b}",
    "--max_new_tokens=2",
    "--max_batch=4",
    f"--out_dir={out}",
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  results = json.load(open(out / "summary.json"))["results"]
  assert {k: v["examples"] for k, v in results.items()} == {"a": 2, "b": 3}
  assert results["a"]["path"] == a and results["b"]["dataset"] == "math500"
  # What produced the numbers.
  meta = json.load(open(out / "summary.json"))["meta"]
  assert meta["cpu"] and meta["jax_version"] and meta["jax_backend"] == "cpu"
  assert meta["compute_dtype"] == "float32"
  for label, n in (("a", 2), ("b", 3)):
    assert len(open(out / f"{label}.jsonl").read().splitlines()) == n


def test_duplicate_labels_are_refused_before_the_model_loads(tmp_path):
  a = _math_file(tmp_path / "a.jsonl", [1])
  b = _math_file(tmp_path / "b.jsonl", [2])
  proc = _run(
    "--model=/no/such/model",
    f"--datasets=math500:{a},math500:{b}",
    f"--out_dir={tmp_path / 'out'}",
  )
  assert proc.returncode != 0
  assert "duplicate dataset labels: 'math500'" in proc.stderr
  assert "/no/such/model" not in proc.stderr  # no model load was tried
  assert not os.path.exists(tmp_path / "out")


def _no_traceback(proc):
  """A user error: exit status 2, the message, no traceback."""
  assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "error: " in proc.stderr


def test_every_dataset_is_read_before_the_model_loads(tiny_run_dir, tmp_path):
  # b's rows lack the math500 fields: refused before a's answers are
  # generated (they would be lost in b's traceback).
  a = _math_file(tmp_path / "a.jsonl", [1])
  b = tmp_path / "b.jsonl"
  b.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
  out = tmp_path / "out"
  proc = _run(
    f"--model={tiny_run_dir}",
    f"--datasets=a=math500:{a},b=math500:{b}",
    f"--out_dir={out}",
  )
  _no_traceback(proc)
  assert "b: " in proc.stderr and "no question field problem" in proc.stderr
  assert "[eval] a:" not in proc.stdout  # nothing generated before
  assert not out.exists()


def test_a_directory_of_runs_names_its_runs(tmp_path):
  # An ablation's --out_dir is not a model.
  for name in ("a_s0", "b_s0"):
    run = tmp_path / "abl" / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"algorithm": "grpo"}))
  proc = _run(f"--model={tmp_path / 'abl'}", f"--out_dir={tmp_path / 'out'}")
  _no_traceback(proc)
  assert "a directory of 2 runs" in proc.stderr
  assert str(tmp_path / "abl" / "a_s0") in proc.stderr


def test_usage_error_prints_the_message_only(tmp_path):
  # Not absl's UsageError, which prints 50 lines of help first.
  proc = _run("--samples=1", "--k=4", f"--out_dir={tmp_path / 'out'}")
  _no_traceback(proc)
  assert proc.stderr.strip().splitlines()[-1] == (
    "error: --k=4 exceeds --samples=1"
  )
  assert "--max_new_tokens" not in proc.stderr  # no help text


@pytest.mark.parametrize("limit", ["-1", "0"])
def test_a_limit_below_one_is_refused_naming_the_field(tmp_path, limit):
  # -1 sliced every row but the last; 0 read every row.
  a = _math_file(tmp_path / "a.jsonl", [1, 2, 3])
  proc = _run(
    "--model=/no/such/model",
    f"--datasets=math500:{a}:{limit}",
    f"--out_dir={tmp_path / 'out'}",
  )
  _no_traceback(proc)
  assert f"LIMIT={limit}; expected an integer >= 1" in proc.stderr
  assert "/no/such/model" not in proc.stderr  # refused before the model
  assert not os.path.exists(tmp_path / "out")


def test_an_unknown_dataset_is_named_with_the_known_ones(tmp_path):
  # It said "no such file ''" (the missing PATH), not the unknown name.
  proc = _run("--datasets=foo", f"--out_dir={tmp_path / 'out'}")
  _no_traceback(proc)
  assert "unknown dataset 'foo' (known: " in proc.stderr
  assert "gsm8k" in proc.stderr and "arithmetic" in proc.stderr
  assert "no such file" not in proc.stderr
