"""Dynamic sampling in streaming mode (the filter applies on arrival): each group is scored as it arrives, a group
with no reward variance is retired there, and a step short of kept groups
admits its refill requests into the running stream. At max_staleness=0 this
is the synchronous refill loop, bit for bit; at max_staleness=1 every
trained group carries a signal and no token is more than one version old.
"""

import jax
import numpy as np
import pytest

from rljax.rollout import base
from rljax.train import group_stream, stream_pick
from tests.train.test_streaming import (
  CONTINUOUS,
  _assert_same_params,
  _assert_same_rows,
)
from tests.train.test_trainer import LetterTask, make_trainer, small_config


class HalfDullTask(LetterTask):
  """LetterTask's reward (it varies across a random model's samples), but
  a prompt whose answer is even scores 0.5 for every sample: dynamic
  sampling drops its group. Whether a group is dull depends only on its
  prompt, so the synchronous loop (one score call per round) and the
  stream (one call per arrival) see the same filter."""

  def score(self, completions, examples, n):
    scores, _ = super().score(completions, examples, n)
    dull = np.repeat([int(e.answer) % 2 == 0 for e in examples], n)
    scores = np.where(dull, np.float32(0.5), scores).astype(np.float32)
    return scores, {"e_share": scores}


DAPO = {
  **CONTINUOUS,
  "advantage.dynamic_sampling": True,
  "advantage.max_resample_rounds": 2,
}


def _trainer_run(cfg):
  trainer = make_trainer(cfg, HalfDullTask)
  try:
    rows = trainer.run()
    return rows, jax.device_get(trainer.state.params)
  finally:
    trainer.close()


def test_streaming_refills_at_staleness_0_are_the_synchronous_loop(tmp_path):
  """Same prompts drawn in the same order (a refill is admitted as soon
  as the kept groups and those to come cannot make P), same seeds, same
  kept groups in the same order, the same masked filler when the rounds
  run out: the same rows and params as async_mode=off. The exposure: the
  refill loop acted (some step filtered groups and drew a refill)."""
  off = _trainer_run(small_config("grpo", tmp_path / "off", steps=3, **DAPO))
  streamed = _trainer_run(
    small_config(
      "grpo", tmp_path / "stream", steps=3, **DAPO,
      **{"run.async_mode": "streaming", "run.max_staleness": 0},
    )
  )  # fmt: skip
  rows = off[0]
  assert sum(r["dynamic_sampling_filtered_groups"] for r in rows) > 0
  assert max(r["dynamic_sampling_rounds"] for r in rows) > 1
  for key in ("dynamic_sampling_rounds", "dynamic_sampling_kept_groups"):
    assert [r[key] for r in streamed[0]] == [r[key] for r in rows]
  # rollout_tokens: the synchronous loop counts a refill's surplus kept
  # group in its step; the stream leaves it queued (it expires unused, at
  # max_staleness 0, and is counted in stream_groups_expired), so it
  # counts the batch and the filtered groups only.
  for got, want in zip(streamed[0], rows):
    assert got.pop("rollout_tokens") <= want.pop("rollout_tokens")
  _assert_same_rows(streamed[0], rows)
  _assert_same_params(streamed[1], off[1])


def test_streaming_with_staleness_trains_only_groups_with_a_signal(tmp_path):
  """max_staleness=1: the trained groups are the kept ones (their rewards
  vary), the lag bound holds, and the filter and the refills acted."""
  seen = []
  cfg = small_config(
    "grpo", tmp_path, steps=4, **DAPO,
    **{"run.async_mode": "streaming", "run.max_staleness": 1},
  )  # fmt: skip
  trainer = make_trainer(cfg, HalfDullTask)
  real = trainer.collector.collect

  def spy(step):
    out = real(step)
    seen.append(out)
    return out

  trainer.collector.collect = spy
  try:
    rows = trainer.run()
    expired = trainer.collector._stream._expired  # pylint: disable=protected-access
  finally:
    trainer.close()
  n = cfg.rollout.group_size
  for step, (out, row) in enumerate(zip(seen, rows), start=1):
    rewards = out.rewards.reshape(-1, n)
    valid = out.valid.reshape(-1, n)[:, 0]
    assert (rewards[valid].std(axis=1) > 0).all()
    assert (rewards[~valid].std(axis=1) == 0).all()  # filler only
    # The lag of the trained tokens, recounted from their versions (θ_old
    # of step s is version s - 1): what the step logged, within the bound.
    lags = [
      step - 1 - v
      for r, v in enumerate(out.batch.policy_version)
      if out.valid[r]
      for v in v.tolist()
    ]
    assert row["version_lag_max"] == max(lags) <= 1
    assert row["version_lag_mean"] == pytest.approx(np.mean(lags))
  assert sum(r["dynamic_sampling_filtered_groups"] for r in rows) > 0
  assert max(r["dynamic_sampling_rounds"] for r in rows) > 1
  # Every group retired past its deadline is in some step's count.
  assert sum(r["stream_groups_expired"] for r in rows) == expired


def _group(prompt):
  return base.RolloutBatch(
    prompt_ids=[prompt], response_ids=[[3], [4]],
    behav_logp=[np.zeros(1), np.zeros(1)], finish_reason=["length"] * 2, n=2,
  )  # fmt: skip


def test_a_checkpoint_keeps_each_refill_request_with_its_round():
  """Saved requests (step 3, round 0) and (step 3, round 1) come back as
  the same requests: the round is kept, and a further refill of step 3 is
  round 2."""
  stream = group_stream.GroupStream(None, None, lambda key: None, 1, 1)
  saved = [
    (_group([1, 2]), {"stream_step": 3.0, "stream_round": 0.0,
                      "stream_trained_0": 1.0, "stream_version_0": 2.0}),
    (_group([5, 6]), {"stream_step": 3.0, "stream_round": 1.0,
                      "stream_trained_0": 0.0, "stream_version_0": 2.0}),
  ]  # fmt: skip
  draws = iter([(["a"], [[1, 2]], {"at": 0}), (["b"], [[5, 6]], {"at": 1})])
  stream.restore(saved, lambda: next(draws))
  ((rb, extra),) = stream.saved()  # the trained request is not open
  assert rb.response_ids == saved[1][0].response_ids
  assert {k: extra[k] for k in saved[1][1]} == saved[1][1]
  assert stream.data_state() == {"at": 1}
  with pytest.raises(ValueError, match="refill round 1 of step 3"):
    stream.admit(3, ["c"], [[7]], seed=0, data_state={}, round_=1)


def _block(key, kept, ended=None, started=0):
  """A request whose group i is kept (True), filtered (False) or not yet
  scored (None); `ended[i]` False: still in flight."""
  p = len(kept)
  ended = [True] * p if ended is None else ended
  score = {
    True: stream_pick.Scored(np.array([0.0, 1.0]), {}, True, 0),
    False: stream_pick.Scored(np.array([0.5, 0.5]), {}, False, 0),
    None: None,
  }
  return stream_pick.Block(
    key, [f"{key}.{i}" for i in range(p)], [[i] for i in range(p)], 0, {},
    [started] * p, [_group([i]) if e else None for i, e in enumerate(ended)],
    np.zeros((p,), bool), [score[s] if e else None for s, e in zip(kept, ended)],
  )  # fmt: skip


class TestDecide:
  """`stream_pick.decide`, P = 2, max_staleness k = 1, θ_old version 0."""

  def decide(self, blocks, refill_left=True, step=1):
    return stream_pick.decide(blocks, step, 0, 1, 2, refill_left)

  def test_two_kept_groups_are_taken(self):
    got = self.decide([_block((1, 0), [True, False, True])])
    assert got == ("take", [((1, 0), 0), ((1, 0), 2)], [])

  def test_one_kept_and_nothing_to_come_refills(self):
    assert self.decide([_block((1, 0), [True, False])])[0] == "refill"

  def test_a_prompt_not_started_could_make_p_so_it_waits(self):
    queued = _block((2, 0), [None], ended=[False])
    queued.started[0] = None  # admitted, not prefilled yet
    got = self.decide([_block((1, 0), [True, False]), queued])
    assert got[0] == "wait"

  def test_no_round_left_pads_with_filtered_groups(self):
    got = self.decide([_block((1, 0), [False, True])], refill_left=False)
    assert got == ("take", [((1, 0), 1)], [((1, 0), 0)])

  def test_no_round_left_waits_for_its_own_group_in_flight(self):
    block = _block((1, 0), [False, False, None], ended=[True, True, False])
    got = self.decide([block], refill_left=False)
    assert got[0] == "wait"

  def test_nothing_left_is_an_error(self):
    block = _block((1, 0), [True, True])
    block.trained[:] = True
    with pytest.raises(RuntimeError, match="no group is left to train"):
      self.decide([block], refill_left=False)


def test_expire_retires_kept_groups_past_their_deadline():
  """Started at version 0, k = 1: at θ_old version 2 a kept group that
  ended is retired (counted); a filtered one and one in flight are not."""
  block = _block((1, 0), [True, False, None], ended=[True, True, False])
  assert stream_pick.expire([block], 2, 1) == 1
  assert block.expired.tolist() == [True, False, False]
  assert stream_pick.candidates([block], 2, 1) == []
  assert stream_pick.candidates([block], 1, 1) == [(0, (1, 0), 2, False)]
