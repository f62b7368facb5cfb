"""Tool (multi-turn) tasks in the asynchronous modes: one_step (pipelined)
and streaming, on the forced tiny decoder of test_tool_training.py (every
episode: call, observation, call; `task.max_turns=2` ends it, reward 0).

one_step: the worker runs step k+1's episodes while step k trains; their
rewards and tool counters reach the step (and a checkpoint) with the batch.
"""

import numpy as np
import pytest

from rljax.rollout.base import RolloutBatch
from rljax.rollout.multiturn import MultiTurnRollout
from rljax.train import collect as collect_lib
from rljax.train import episode_saved
from rljax.train.metrics import read_metrics
from tests.train.test_tool_training import TURN, _config, _train

# The metrics of a step that say what it trained on (not how long it took).
_SAME = (
  "loss",
  "reward_mean",
  "reward_all_mean",
  "tool_call_rate",
  "turns_mean",
  "tool_calls_mean",
  "malformed_call_rate",
  "episodes",
  "engine_calls",
  "rollout_staleness",
  "rollout_tokens",
  "version_lag_mean",
  "version_lag_max",
  "response_model_tokens_mean",
)


def _one_step(run_dir, **overrides):
  return _config(
    run_dir,
    **{"run.async_mode": "one_step", "run.eval_every": 0, **overrides},
  )


def _check_tool_rows(rows, collected):
  for row, rollout in zip(rows, collected):
    assert np.isfinite(row["loss"]) and row["applied"] == 1.0
    assert row["tool_call_rate"] == 1.0
    assert row["turns_mean"] == 2.0
    assert row["tool_calls_mean"] == 2.0
    assert row["episodes"] == 4.0  # 2 prompts × 2 samples
    assert row["engine_calls"] >= 2.0
    assert row["rollout_tokens"] == 4 * 2 * len(TURN)  # model ids only
    mask = rollout.batch.action_mask
    assert mask is not None
    assert all(m.sum() == 2 * len(TURN) for m in mask)


def test_episode_floats_round_trip():
  rb = RolloutBatch(
    prompt_ids=[[1, 2]],
    response_ids=[[3, 4, 5], [6]],
    behav_logp=[np.zeros(3, np.float32), np.zeros(1, np.float32)],
    finish_reason=["stop", "length"],
    n=2,
  )
  infos = [
    {"turns": 2, "tool_calls": 1, "malformed_calls": 1, "tool_errors": {}},
    {"turns": 1, "tool_calls": 0, "malformed_calls": 0,
     "tool_errors": {"timeout": 2}},
  ]  # fmt: skip
  out = MultiTurnRollout(
    rb, np.array([1.0, 0.0], np.float32), infos,
    {"engine_calls": 3.0, "continuations": 1.0, "turns_mean": 1.5},
  )  # fmt: skip
  extra = {"rollout_staleness": 1.0, **episode_saved.encode(out)}
  saved, rest = episode_saved.split(extra)
  assert rest == {"rollout_staleness": 1.0}
  back = episode_saved.decode(rb, saved)
  np.testing.assert_array_equal(back.rewards, out.rewards)
  assert collect_lib.episode_metrics([back]) == collect_lib.episode_metrics(
    [out]
  )
  with pytest.raises(ValueError, match="one per row"):
    episode_saved.decode(RolloutBatch.concat([rb, rb]), saved)


def test_one_step_trains_on_episodes(tmp_path, monkeypatch):
  rows, collected, _ = _train(
    _one_step(tmp_path, **{"run.steps": 3}), monkeypatch
  )
  assert [r["step"] for r in rows] == [1, 2, 3]
  _check_tool_rows(rows, collected)
  # Step k trains on episodes θ_{k-2} sampled (θ_0 for the first two).
  assert [r["rollout_staleness"] for r in rows] == [0.0, 1.0, 1.0]
  versions = [
    sorted({int(v) for row in c.batch.policy_version for v in row})
    for c in collected
  ]
  assert versions == [[0], [0], [1]]
  assert [r["version_lag_max"] for r in rows] == [0.0, 1.0, 1.0]


@pytest.mark.slow  # three trainer runs
def test_one_step_resume_trains_what_the_uninterrupted_run_did(
  tmp_path, monkeypatch
):
  full_rows, full_collected, _ = _train(
    _one_step(tmp_path / "full", **{"run.steps": 3}), monkeypatch
  )
  # Cut after step 2: its checkpoint holds step 3's episodes, in flight.
  _train(
    _one_step(tmp_path / "cut", **{"run.steps": 2, "run.checkpoint_every": 1}),
    monkeypatch,
  )
  rows, collected, _ = _train(
    _one_step(tmp_path / "cut", **{"run.steps": 3, "run.resume": True}),
    monkeypatch,
  )
  assert [r["step"] for r in rows] == [3]
  _check_tool_rows(rows, collected)
  want, got = full_rows[2], rows[0]
  for key in _SAME:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
  a, b = full_collected[2].batch, collected[0].batch
  assert a.response_ids == b.response_ids
  assert [m.tolist() for m in a.action_mask] == [
    m.tolist() for m in b.action_mask
  ]
  assert [v.tolist() for v in a.policy_version] == [
    v.tolist() for v in b.policy_version
  ]
  np.testing.assert_array_equal(full_collected[2].rewards, collected[0].rewards)
  logged = read_metrics(str(tmp_path / "cut"))
  assert [r["step"] for r in logged] == [1, 2, 3]
