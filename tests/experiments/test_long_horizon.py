"""The long-horizon instrument (QuRL question 4): the character
tokenizer and SFT batches on hand-written examples, and
experiments/long_horizon.py end to end on a very small decoder (SFT, then an
INT8 RL run through the real Trainer); resuming is ablate.py's, tested there."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import compile_cache_util
from rljax import instrument
from rljax.data.records import Example

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def test_tokenizer_round_trip_and_prompt_format():
  tok = instrument.CharTokenizer()
  assert len(tok) == 20 and tok.eos_token_id == 2 and tok.pad_token_id == 0
  prompt = instrument.render_prompt("What is (3 + 4) \u00d7 2?")
  assert prompt == "(3+4)*2="
  ids = tok.encode(prompt)
  assert tok.decode(ids) == prompt
  assert tok.encode("12") == [4, 5]  # '0' is id 3
  assert tok.decode([4, 5, 2, 0]) == "12"
  assert tok.decode([4, 2], skip_special_tokens=False) == "1<eos>"
  with pytest.raises(ValueError, match=r"characters \['a'\]"):
    tok.encode("1a")


def test_sft_batch_masks_answer_and_eos_only():
  tok = instrument.CharTokenizer()
  ex = Example("What is 7 + 5?", "12", {}, uid="u")
  tokens, mask = instrument.sft_batch(tok, [ex], length=8)
  # "7+5=" "12" <eos> <pad>: targets at positions 4, 5, 6 are predicted
  # from positions 3, 4, 5.
  np.testing.assert_array_equal(tokens[0], tok.encode("7+5=12") + [2, 0])
  np.testing.assert_array_equal(mask[0], [0, 0, 0, 1, 1, 1, 0])
  with pytest.raises(ValueError, match="needs 7 tokens"):
    instrument.sft_batch(tok, [ex], length=6)


def test_data_order_spec():
  """`instrument:<dir>#order=<k>`: the same instrument, its training prompts
  in another order (a perturbed A/A arm); order 0 is the run's own."""
  assert instrument.parse_name("instrument:/a/b") == ("/a/b", 0)
  assert instrument.parse_name("/a/b#order=2") == ("/a/b", 2)
  with pytest.raises(ValueError, match="data order 'x'"):
    instrument.parse_name("instrument:/a#order=x")
  assert instrument.order_seed(3, 0) == 3
  assert instrument.order_seed(3, 1) == 3 + instrument.ORDER_STRIDE
  from rljax.train.config import apply_preset

  cfg = apply_preset(
    "grpo",
    {
      "task.difficulty": "medium",
      "task.eval_size": 16,
      "task.max_prompt_tokens": 16,
      "task.reward_workers": 0,
      "rollout.prompts_per_step": 8,
    },
  )
  tok = instrument.CharTokenizer()
  tasks = [instrument.build_task(cfg, tok, order=k) for k in (0, 0, 1)]
  try:
    firsts = [[e.uid for e in t.next_train_batch(8)] for t in tasks]
    held = [[e.uid for e in t.eval_examples()] for t in tasks]
  finally:
    for t in tasks:
      t.close()
  assert firsts[0] == firsts[1] != firsts[2]  # another order, same pool
  assert held[0] == held[2]  # the same held-out problems
  sys.path.insert(0, os.path.join(ROOT, "experiments"))
  import long_horizon

  run = {"name": "aa", "model": {"name": "instrument#order=1"}}
  assert long_horizon.with_instrument(run, "/i")["model"] == {
    "name": "instrument:/i#order=1"
  }
  assert long_horizon.with_instrument({"name": "x"}, "/i") == {"name": "x"}


def _run(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # One device is enough, and compiles fast (compile_cache_util).
  env["XLA_FLAGS"] = compile_cache_util.FAST_COMPILE_XLA_FLAGS
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "long_horizon.py"),
      *args,
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


@pytest.mark.slow  # a whole script run
def test_long_horizon_runs_sft_then_rl_and_resumes(tmp_path):
  config = {
    "base": {
      "task": "arithmetic",
      "task_difficulty": "easy",
      "steps": 3,
      "prompts_per_step": 2,
      "group_size": 4,
      "max_new_tokens": 3,
      "max_prompt_tokens": 16,
      "eval_size": 8,
      "eval_every": 1,
      "reward_workers": 0,
      "tensorboard": False,
      "checkpoint_every": 2,
      "learning_rate": 1e-3,
    },
    "seeds": [0],
    "runs": [
      {"name": "int8_acr", "rollout_quant": "int8", "correction": "acr"},
      {
        "name": "int8_acr_aa",
        "rollout_quant": "int8",
        "correction": "acr",
        "model": {"name": "instrument#order=1"},
      },
    ],
  }
  path = tmp_path / "q.json"
  path.write_text(json.dumps(config))
  inst, out = tmp_path / "inst", tmp_path / "out"
  args = [
    f"--configs={path}",
    f"--out_dir={out}",
    f"--instrument_dir={inst}",
    "--hidden_size=32",
    "--num_layers=1",
    "--sft_steps=4",
    "--sft_eval_every=2",
    "--sft_batch_size=8",
  ]
  first = _run(*args)
  record = json.loads((inst / "instrument.json").read_text())
  assert record["done"] and record["steps"] == 4
  assert [h["step"] for h in record["history"]] == [2, 4]
  assert "[long_horizon] instrument:" in first.stdout
  table = json.loads((out / "table.json").read_text())
  assert [(r["name"], r["status"], r["steps"]) for r in table] == [
    ("int8_acr", "done", 3),
    ("int8_acr_aa", "done", 3),
  ]
  run = out / "int8_acr_s0"
  rows = [json.loads(l) for l in open(run / "metrics.jsonl")]
  train = [r for r in rows if "loss" in r]
  assert [r["step"] for r in train] == [1, 2, 3]
  assert all("acr_active_fraction" in r and "behav_prox_kl" in r for r in train)
  cfg = json.loads((run / "config.json").read_text())
  assert cfg["model"]["name"] == f"instrument:{inst}"
  # Per-problem records at every evaluation (the readout averages the last
  # ones), agreeing with the logged accuracy.
  for step in (0, 1, 2, 3):
    recs = [json.loads(l) for l in open(run / f"eval_step{step}.jsonl")]
    assert len(recs) == 8
    logged = [
      r["eval_accuracy"]
      for r in rows
      if r["step"] == step and "eval_accuracy" in r
    ]
    assert logged[-1] == pytest.approx(np.mean([r["correct"] for r in recs]))
  # The perturbed A/A arm: the same instrument and held-out problems, its
  # training prompts in another order, recorded in its config.
  aa = out / "int8_acr_aa_s0"
  aa_cfg = json.loads((aa / "config.json").read_text())
  assert aa_cfg["model"]["name"] == f"instrument:{inst}#order=1"
  assert (aa / "eval_step0.jsonl").read_text() == (
    run / "eval_step0.jsonl"
  ).read_text()
  uids = lambda d: [json.loads(l)["uid"] for l in open(d / "eval_step3.jsonl")]
  assert uids(aa) == uids(run)


def test_mixed_version_fraction():
  """A response whose tokens came from two policy versions spanned a weight
  swap; masked-out rows (dynamic sampling's filler) do not count."""
  from rljax import study

  versions = [np.array([3, 3, 3]), np.array([3, 4]), np.array([5]), []]
  assert study.mixed_version_fraction(versions) == pytest.approx(1 / 3)
  valid = np.array([True, False, True, True])
  assert study.mixed_version_fraction(versions, valid) == 0.0
  assert study.mixed_version_fraction(None) is None
