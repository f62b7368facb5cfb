"""experiments/qurl_replay.py: the ACR-vs-TIS mechanism replay.

End to end on its --dry path (a tiny instrument SFT'd by long_horizon.py's
phase 1, the real Trainer, INT8 rollouts): with K = 1 update per batch
R ≡ 1, so ACR must be TIS bit for bit (same updated weights, same numbers);
a rerun with K = 2 reuses the frozen batches. The statistics and the
exposure gate on hand-made rows.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import compile_cache_util

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from qurl_report_lib import replay as replay_lib  # noqa: E402

PER_CORRECTION = set(replay_lib.METRICS) | {"applied", "params_digest"}


def _run(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = compile_cache_util.FAST_COMPILE_XLA_FLAGS
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "qurl_replay.py"),
      *args,
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=900,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


@pytest.mark.slow  # a whole script run
def test_dry_replay_acr_equals_tis_at_k1_and_reuses_batches(tmp_path):
  out, inst = tmp_path / "out", tmp_path / "inst"
  common = ["--dry", f"--out_dir={out}", f"--instrument_dir={inst}"]
  first = _run(*common, "--minibatches=1")
  result = json.loads((out / "replay.json").read_text())
  assert result["config"]["minibatches"] == 1
  assert result["config"]["quant"] == "int8"
  assert result["config"]["cap"] == 1.02  # q6_acr_fair's int8_tis cap
  assert len(result["per_batch"]) == result["config"]["batches"] == 2
  for b in result["per_batch"]:
    assert set(b["tis"]) == set(b["acr"]) == PER_CORRECTION
    assert b["tis"]["applied"] == 1.0
    # R ≡ 1 at the only update: ACR is TIS exactly, weights and numbers.
    assert b["acr"] == b["tis"]
    assert b["acr"]["acr_grad_share"] == 0.0
  # ... and the updates did move θ, so the equality is not that of no-ops.
  assert any(b["tis"]["dlogp_all"] != 0.0 for b in result["per_batch"])
  assert set(result["summary"]) == set(replay_lib.METRICS)
  for entry in result["summary"].values():
    assert set(entry) == {"tis", "acr", "acr_minus_tis"}
  assert result["summary"]["kl_after"]["acr_minus_tis"]["mean"] == 0.0
  assert not result["verdict"]["exposed"]
  assert "not exercised" in result["verdict"]["dlogp_eligible"]["verdict"]
  assert "| acr_grad_share |" in first.stdout
  # The page renders the archived file, not numbers typed by hand.
  page = "\n".join(replay_lib.page_section([str(out / "replay.json")]))
  assert "### INT8, C = 1.02, K = 1, SFT θ, fresh Adam" in page
  assert "not in the page's Holm family" in page
  assert replay_lib.table(result) in page
  assert result["machine"]["cpu"] and result["date"]
  batches = sorted(p.name for p in (out / "batches" / "int8_s0").iterdir())
  assert batches == ["batch_000.npz", "batch_001.npz", "meta.json"]

  second = _run(*common, "--minibatches=2")
  assert "reusing 2 frozen batches" in second.stdout
  again = json.loads((out / "replay.json").read_text())
  assert again["config"]["minibatches"] == 2
  assert again["theta"] == result["theta"]
  # The same frozen rollouts: the same tokens and eligibility.
  assert [b["n_eligible"] for b in again["per_batch"]] == [
    b["n_eligible"] for b in result["per_batch"]
  ]
  assert [b["kl_before"] for b in again["per_batch"]] == [
    b["kl_before"] for b in result["per_batch"]
  ]


@pytest.mark.slow  # a whole script run
def test_dry_replay_from_an_rl_checkpoint(tmp_path):
  # A 2-step RL run of the dry instrument (q6's int8_tis arm), then the
  # replay from its checkpoint's θ and Adam state (`--init_run_dir`).
  inst, rl, out = tmp_path / "inst", tmp_path / "rl", tmp_path / "out"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = compile_cache_util.FAST_COMPILE_XLA_FLAGS
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "long_horizon.py"),
      "--configs=experiments/configs/q6_acr_fair.json",
      "--only=int8_tis",
      "--seeds=0",
      f"--instrument_dir={inst}",
      f"--out_dir={rl}",
      "--hidden_size=32",
      "--num_layers=1",
      "--sft_steps=4",
      "--sft_eval_every=2",
      "--sft_batch_size=8",
      "--task.difficulty=easy",
      "--task.eval_size=8",
      "--rollout.prompts_per_step=2",
      "--rollout.group_size=4",
      "--rollout.max_new_tokens=3",
      "--run.steps=2",
      "--run.checkpoint_every=2",
      "--run.eval_every=0",
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=900,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  run_dir = rl / "int8_tis_s0"
  replay = _run(
    "--dry",
    f"--out_dir={out}",
    f"--instrument_dir={inst}",
    f"--init_run_dir={run_dir}",
  )
  assert f"θ and Adam state of {run_dir} step 2" in replay.stdout
  result = json.loads((out / "replay.json").read_text())
  assert result["config"]["init_run_dir"] == str(run_dir)
  assert result["config"]["minibatches"] == 4
  assert len(result["per_batch"]) == 2


def _row(share, dlogp, kl):
  return {
    "acr_grad_share": share,
    "acr_would_change_fraction": share / 2,
    "acr_active_given_eligible": 0.5,
    "clip_fraction_high": 0.01,
    "dlogp_eligible": dlogp,
    "dlogp_all": 0.0,
    "kl_after": kl,
  }


def test_summary_pairs_batches_and_gates_on_exposure():
  per_batch = [
    {"tis": _row(0.0, 0.01, 1e-4), "acr": _row(0.02, 0.03, 1e-4 + d)}
    for d in (1e-6, 2e-6, 3e-6)
  ]
  s = replay_lib.summarize(per_batch)
  d = s["dlogp_eligible"]["acr_minus_tis"]
  assert d["mean"] == pytest.approx(0.02) and d["n"] == 3
  assert d["low"] == pytest.approx(0.02) and d["high"] == pytest.approx(0.02)
  assert s["kl_after"]["acr_minus_tis"]["mean"] == pytest.approx(2e-6)
  assert s["kl_after"]["acr"]["std"] == pytest.approx(1e-6)
  v = replay_lib.verdicts(s)
  assert v["exposed"] and v["acr_grad_share"] == pytest.approx(0.02)
  assert v["dlogp_eligible"]["verdict"].startswith("supported")
  assert v["kl_after"]["verdict"].startswith("supported")
  # A batch without eligible tokens (None) is left out of the pairs.
  per_batch[0]["acr"]["dlogp_eligible"] = None
  assert replay_lib.summarize(per_batch)["dlogp_eligible"]["acr"]["n"] == 2
  # Under the 1e-3 gate nothing is read, whatever the differences.
  quiet = [
    {"tis": _row(0.0, 0.01, 1e-4), "acr": _row(5e-4, 0.05, 2e-4)}
    for _ in range(3)
  ]
  v = replay_lib.verdicts(replay_lib.summarize(quiet))
  assert not v["exposed"]
  assert v["dlogp_eligible"]["verdict"].startswith("not exercised")
  assert np.isclose(v["acr_grad_share"], 5e-4)
