"""experiments/bench_async.py: its summary arithmetic on hand-made steps, and
a smoke run (tiny model, 3 steps, sync and streaming) whose JSON has every
field the asynchronous-training benchmark reports (machine, per-step wall
time, idle fractions, version lag, untrained tokens, the speed-up ratio),
with values that hold in any run.

The script defines absl flags (every training flag, as ablate.py does), so
it is imported in a subprocess, never into the test process."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "bench_async.py")


def _env():
  # The scripts import rljax from the checkout, whatever pip recorded.
  path = os.environ.get("PYTHONPATH", "")
  return {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, path])),
  }


def _call(code: str):
  """Runs `code` with bench_async imported as `b`; the JSON it prints."""
  prog = (
    "import collections, json, sys, types\n"
    "sys.path.insert(0, 'experiments')\n"
    "import bench_async as b\n" + code
  )
  proc = subprocess.run(
    [sys.executable, "-c", prog],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=ROOT,
    env=_env(),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


_ROWS = """
rows = [
  dict(step=1, time_step=9.0, time_rollout=5.0, time_rollout_wait=8.0),
  dict(step=2, time_step=2.0, time_rollout=1.0, time_rollout_wait=1.0),
  dict(step=3, time_step=3.0, time_rollout=1.5, time_rollout_wait=0.0),
  dict(step=4, time_step=4.0, time_rollout=1.0, time_rollout_wait=2.0),
]
lags = collections.Counter({0: 10, 1: 6, 4: 4})
args = ([0.0, 10.0, 12.0, 15.0], 19.0, lags, dict(queued=7, masked=3), 1)
"""


def test_summary_by_hand():
  out = _call(
    _ROWS
    + """
s = b.summarize("streaming_keep", rows, *args)
y = b.summarize("sync", rows, *args)
logged = [dict(r, trainer_idle_fraction=0.5, engine_idle_fraction=0.25)
          for r in rows]
g = b.summarize("one_step", logged, *args)
print(json.dumps(dict(s=s, y=y, g=g)))
"""
  )
  s, y, g = out["s"], out["y"], out["g"]
  # Walls 10, 2, 3, 4; the first (compiles) left out: 2, 3, 4.
  assert s["wall_per_step_s"] == [10.0, 2.0, 3.0, 4.0]
  assert s["measured_steps"] == 3
  assert s["wall_per_step_mean_s"] == pytest.approx(3.0)
  assert s["wall_per_step_median_s"] == pytest.approx(3.0)
  assert s["steps_per_hour"] == pytest.approx(1200.0)
  # Trainer idle: waits (1 + 0 + 2) s of (2 + 3 + 4) s; engine not logged.
  assert s["trainer_idle_fraction"] == pytest.approx(3.0 / 9.0)
  assert s["engine_idle_fraction"] is None
  # Sync is serial: rollout (1 + 1.5 + 1) s of 9 s, the engine the rest.
  assert y["trainer_idle_fraction"] == pytest.approx(3.5 / 9.0)
  assert y["engine_idle_fraction"] == pytest.approx(5.5 / 9.0)
  # Logged fractions win over the fallbacks.
  assert g["trainer_idle_fraction"] == pytest.approx(0.5)
  assert g["engine_idle_fraction"] == pytest.approx(0.25)
  assert g["idle_source"] == "logged"
  # 20 tokens: lags 0 x10, 1 x6, 4 x4.
  assert s["trained_tokens"] == 20
  assert s["version_lag_mean"] == pytest.approx((6 + 16) / 20)
  assert s["version_lag_max"] == 4
  assert s["version_lag_ge1"] == pytest.approx(0.5)
  assert s["version_lag_ge4"] == pytest.approx(0.2)
  assert s["version_lag_tokens"] == {"0": 10, "1": 6, "4": 4}
  assert s["untrained_tokens"] == 10
  assert s["untrained_tokens_queued"] == 7


def test_lag_counts_ratios_and_modes():
  out = _call(
    """
import numpy as np
batch = types.SimpleNamespace(
  policy_version=[np.array([3, 3, 2]), np.array([0, 0]), np.array([1, 3])],
  action_mask=[np.array([1, 1, 1]), np.array([1, 1]), np.array([0, 1])],
)
counts = b.lag_counts(batch, 3, [True, False, True])
sums = {m: dict(steps_per_hour=v) for m, v in
        dict(sync=1000.0, one_step=1500.0, streaming_keep=1600.0).items()}
print(json.dumps(dict(
  counts={str(k): v for k, v in counts.items()},
  ratios=b.ratios(sums),
  modes=b.parse_modes(["off", "streaming", "one_step"]),
)))
"""
  )
  # Row 1 is masked out; row 2's first token is not the model's.
  assert out["counts"] == {"0": 3, "1": 1}
  by = {r["ratio"]: r for r in out["ratios"]}
  assert by["streaming_keep / sync"]["value"] == pytest.approx(1.6)
  assert by["streaming_keep / sync"]["met"] is True
  assert by["streaming_keep / one_step"]["value"] == pytest.approx(1600 / 1500)
  assert by["streaming_keep / one_step"]["met"] is False
  assert out["modes"] == ["sync", "streaming_keep", "one_step"]


@pytest.mark.slow
def test_smoke_tiny_sync_and_streaming(tmp_path):
  proc = subprocess.run(
    [
      sys.executable,
      SCRIPT,
      "--model=tiny",
      "--steps=3",
      "--modes=off,streaming",
      "--rollout.prompts_per_step=2",
      "--rollout.group_size=4",
      "--rollout.max_new_tokens=8",
      "--update.micro_batches=1",
      f"--out_dir={tmp_path}",
    ],
    capture_output=True,
    text=True,
    timeout=900,
    cwd=ROOT,
    env=_env(),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "engine placement: JAX engine on a worker thread" in proc.stdout
  assert "streaming_keep / sync" in proc.stdout
  result = json.loads((tmp_path / "async_overlap.json").read_text())
  assert (tmp_path / "async_overlap.png").stat().st_size > 0
  assert result["machine"]["cpu_model"] and result["machine"]["cores"] >= 1
  assert list(result["modes"]) == ["sync", "streaming_keep"]
  for mode, s in result["modes"].items():
    assert s["steps"] == 3 and s["measured_steps"] == 2, mode
    assert len(s["wall_per_step_s"]) == 3 and len(s["rows"]) == 3
    assert s["wall_per_step_mean_s"] > 0 and s["steps_per_hour"] > 0
    assert 0.0 <= s["trainer_idle_fraction"] <= 1.0
    # 3 steps x 2 prompts x 4 samples x at most 8 tokens, all trained.
    assert 0 < s["trained_tokens"] <= 3 * 2 * 4 * 8
    assert s["trained_tokens"] == sum(s["version_lag_tokens"].values())
    assert s["untrained_tokens_masked"] == 0  # no dynamic sampling
  sync, stream = result["modes"]["sync"], result["modes"]["streaming_keep"]
  assert 0.0 <= sync["engine_idle_fraction"] <= 1.0
  assert sync["version_lag_tokens"].keys() == {"0"}  # never stale
  assert sync["untrained_tokens"] == 0
  # k = 1: no token more than one version behind; at most the k + 1
  # requests past the last step are left queued.
  assert stream["version_lag_max"] <= 1
  assert 0 <= stream["untrained_tokens_queued"] <= 2 * 2 * 4 * 8
  (ratio,) = result["ratios"]
  assert ratio["ratio"] == "streaming_keep / sync" and ratio["target"] == 1.5
