"""The reward scripts end to end on the tiny random model, run as a user
would (subprocess): experiments/train_reward_model.py trains and saves a
Bradley–Terry RM that the trainer loads as `--reward=reward_model`, and each
example experiment (reward_model_grpo / reward_vrcli / reward_judge) runs
one RL step on its reward and writes metrics.jsonl and plots.png. The judge
example talks to a deterministic stub OpenAI-compatible server on 127.0.0.1
(a real HTTP server; vLLM itself is covered by test_judge.py, slow)."""

import http.server
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import compile_cache_util
from rljax.rewards import reward_model as rm
from rljax.rewards.pool import make_inputs
from rljax.train import tasks
from rljax.train.config import TrainConfig
from rljax.train.metrics import read_metrics

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
SCRIPTS = os.path.join(ROOT, "experiments")
# One RL step on the tiny model, small enough for a shared CPU.
TINY_RL = [
  "--model.name=tiny",
  "--run.steps=1",
  "--rollout.prompts_per_step=2",
  "--rollout.group_size=2",
  "--rollout.max_new_tokens=6",
  "--task.reward_workers=0",
  "--run.tensorboard=false",
]


def _run(script, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  # One device is enough, and compiles fast (compile_cache_util).
  env["XLA_FLAGS"] = compile_cache_util.FAST_COMPILE_XLA_FLAGS
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


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("rm") / "tiny_rm")
  proc = _run(
    "train_reward_model.py",
    "--model=tiny",
    "--num_pairs=160",
    "--steps=40",
    "--batch_size=8",
    "--learning_rate=3e-3",
    "--eval_every=20",
    "--max_len=128",
    f"--out_dir={out}",
  )
  return out, proc.stdout


@pytest.mark.slow
class TestTrainRewardModelScript:
  def test_trains_on_the_synthetic_rule_and_saves_both_formats(self, rm_dir):
    out, stdout = rm_dir
    assert "held-out accuracy" in stdout
    for name in (
      "reward_model.json",
      "orbax",
      "hf/config.json",
      "hf/model.safetensors",
      "rm_metrics.jsonl",
      "rm_curve.png",
      "summary.json",
    ):
      assert os.path.exists(os.path.join(out, name)), name
    with open(os.path.join(out, "rm_metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == list(range(41))
    evaluated = [r for r in rows if "eval_accuracy" in r]
    assert [r["step"] for r in evaluated] == [0, 20, 40]
    # A zero head starts at chance; the rule's easy half (an answer vs none)
    # is learned by the tiny model within 40 steps.
    assert evaluated[0]["eval_accuracy"] == 0.5
    assert evaluated[-1]["eval_accuracy_no_answer"] >= 0.9, evaluated[-1]
    assert evaluated[-1]["eval_accuracy"] > 0.6, evaluated[-1]
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["eval_accuracy"] == evaluated[-1]["eval_accuracy"]

  def test_saved_model_loads_as_the_trainer_reward(self, rm_dir):
    out, _ = rm_dir
    cfg = TrainConfig().replace(
      {
        "model.name": "tiny",
        "reward.name": "reward_model",
        "reward.model_path": out,
      }
    )
    reward = tasks.build_reward(cfg, tokenizer=None)
    assert isinstance(reward, rm.RewardModelReward)
    prompt = (
      "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    batch = reward.score(
      make_inputs(
        [prompt] * 2, ["The answer is \\boxed{5}.", "I don't know."], ["5"] * 2
      )
    )
    assert np.all(np.isfinite(batch.scores))
    # The trained RM prefers an answer to no answer.
    assert batch.scores[0] > batch.scores[1]

  def test_user_pairs_file_and_bad_file(self, tmp_path):
    good = tmp_path / "pairs.jsonl"
    rm.write_preference_pairs(
      good, [rm.PreferencePair(f"Q{i}", "yes", "no") for i in range(10)]
    )
    out = str(tmp_path / "rm")
    _run(
      "train_reward_model.py",
      "--model=tiny",
      f"--pairs={good}",
      "--steps=2",
      "--eval_every=0",
      "--held_out_fraction=0.3",
      f"--out_dir={out}",
    )
    assert os.path.isfile(os.path.join(out, "reward_model.json"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Q", "chosen": "a"}\n')
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    proc = subprocess.run(
      [
        sys.executable,
        os.path.join(SCRIPTS, "train_reward_model.py"),
        "--model=tiny",
        f"--pairs={bad}",
        f"--out_dir={tmp_path / 'x'}",
      ],
      capture_output=True,
      text=True,
      env=env,
      cwd=ROOT,
      timeout=300,
    )
    assert proc.returncode != 0
    assert "bad.jsonl:1: field 'rejected' is missing" in proc.stderr


def _check_run(run_dir, component):
  rows = [r for r in read_metrics(run_dir) if "reward_mean" in r]
  assert len(rows) == 1, rows
  assert f"reward_{component}" in rows[0] and "reward_correct" not in rows[0]
  assert np.isfinite(rows[0]["reward_mean"])
  assert os.path.isfile(os.path.join(run_dir, "plots.png"))
  return rows[0]


@pytest.mark.slow
class TestExampleExperiments:
  def test_reward_model_grpo(self, rm_dir, tmp_path):
    run = str(tmp_path / "run")
    _run(
      "reward_model_grpo.py",
      *TINY_RL,
      "--task.eval_size=2",
      f"--reward.model_path={rm_dir[0]}",
      f"--run.run_dir={run}",
    )
    _check_run(run, "reward_model")

  def test_reward_vrcli_on_the_checked_in_gold_continuations(self, tmp_path):
    run = str(tmp_path / "run")
    _run("reward_vrcli.py", *TINY_RL, f"--run.run_dir={run}")
    row = _check_run(run, "vrcli")
    assert row["reward_mean"] <= 100.0

  def test_reward_judge_against_a_stub_server(self, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StubJudge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
      run = str(tmp_path / "run")
      _run(
        "reward_judge.py",
        *TINY_RL,
        "--task.eval_size=2",
        "--serve_judge=false",
        f"--reward.judge_url=http://127.0.0.1:{server.server_address[1]}",
        f"--run.run_dir={run}",
      )
    finally:
      server.shutdown()
    row = _check_run(run, "judge")
    # Every answer got "Score: 7" on 0-10: reward 0.7, nothing failed.
    assert row["reward_mean"] == pytest.approx(0.7)
    # The rubric file shipped with the example reached the judge.
    assert any(
      "Format: the final answer is written inside" in body
      for body in _StubJudge.bodies
    )


class _StubJudge(http.server.BaseHTTPRequestHandler):
  """A fake judge (named as such): every chat request is answered
  "Score: 7"; request bodies are kept for the test."""

  bodies: list = []

  def log_message(self, *args):
    pass

  def _send(self, payload):
    raw = json.dumps(payload).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(raw)))
    self.end_headers()
    self.wfile.write(raw)

  def do_GET(self):
    self._send({"data": [{"id": "stub-judge"}]})

  def do_POST(self):
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    _StubJudge.bodies.append(json.dumps(body))
    self._send(
      {"choices": [{"message": {"role": "assistant", "content": "Score: 7"}}]}
    )
