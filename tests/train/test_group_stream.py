"""Streaming mode's group-level emission (`group_stream`): the earliest-
deadline choice of a step's groups, and a step that takes a later request's
finished group instead of waiting for its own longest response, on the real
continuous JAX engine."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rljax.rollout import base
from rljax.train import collect as collect_lib
from rljax.train import group_stream, stream_pick
from tests.rollout.test_inflight_updates import _engine, _sharp

choose = stream_pick.choose


class TestChoose:
  """(slack, block step, index, complete) candidates; P groups a step."""

  def test_too_few_complete_waits(self):
    assert choose([(0, 1, 0, True), (0, 1, 1, False)], 2) is None

  def test_a_later_request_fills_in_for_a_straggler_with_slack(self):
    # The straggler (1, 0) may still be trained next step (slack 1): the
    # step takes (1, 1) and the later request's finished (2, 0).
    got = choose([(1, 1, 0, False), (1, 1, 1, True), (1, 2, 0, True)], 2)
    assert got == [(1, 1), (2, 0)]

  def test_a_straggler_at_its_deadline_is_waited_for(self):
    cands = [
      (0, 1, 0, False),
      (0, 1, 1, True),
      (1, 2, 0, True),
      (1, 2, 1, True),
    ]
    assert choose(cands, 2) is None
    done = [(s, b, i, True) for s, b, i, _ in cands]
    assert choose(done, 2) == [(1, 0), (1, 1)]

  def test_later_deadlines_reserve_room(self):
    # Three groups due within two steps, P = 1: this step takes one, the
    # next one more; one would be overdue. It waits while a group is in
    # flight, then takes the earliest (the trainer's lag check then names
    # the overdue token).
    cands = [(1, 1, 0, True), (1, 1, 1, True), (1, 1, 2, False)]
    assert choose(cands, 1) is None
    done = [(s, b, i, True) for s, b, i, _ in cands]
    assert choose(done, 1) == [(1, 0)]

  def test_earliest_deadline_then_block_then_index(self):
    cands = [(2, 1, 1, True), (1, 3, 0, True), (1, 2, 1, True), (2, 1, 0, True)]
    assert choose(cands, 3) == [(2, 1), (3, 0), (1, 0)]

  def test_staleness_0_takes_exactly_its_own_request(self):
    cands = [(0, 4, 0, True), (0, 4, 1, True)]
    assert choose(cands, 2) == [(4, 0), (4, 1)]
    assert choose(cands[:1] + [(0, 4, 1, False)], 2) is None


class EngineActor:
  """The two calls `GroupStream` makes of `actor.Actor` (push, stream),
  over a real `JaxSampler`; a test adapter, since the trainer's Actor
  needs a whole TrainConfig."""

  def __init__(self, engine):
    self.engine = engine
    self.version = None

  def push(self, rparams, diag):
    self.engine.update_weights(rparams)
    self.version = int(diag["version"])
    return {}

  def generate_stream(
    self, feed, shape, sampling, weight_updates, before_retry=None
  ):
    del before_retry  # the JAX engine is not restarted
    stats = self.engine.generate_stream(
      feed, shape, sampling, weight_updates=weight_updates, version=self.version
    )
    self.version = int(stats.get("final_version", self.version))
    return stats


@pytest.fixture(scope="module")
def w0():
  return _sharp(0)


LONG, SHORT = [4, 8, 15, 16, 23, 42, 7], [5, 17, 3]


def _stop_id(engine):
  """A token SHORT's greedy answer emits by its third token and LONG's
  never does: SHORT's rows stop early, LONG's run to the limit."""
  probe = base.SamplingConfig(n=1, greedy=True, max_new_tokens=24)
  out = engine.generate([LONG, SHORT], probe).response_ids
  for tok in out[1][:3]:
    if tok not in out[0]:
      return tok
  # A failure, not a skip: this is the only end-to-end test of a step
  # taking another request's group, and the weights are fixed.
  raise AssertionError("no stop id separates the two prompts' answers")


def _unpack(taken):
  return taken.batch, taken.examples, taken.metrics


def test_a_step_does_not_wait_for_its_own_longest_response(w0):
  """max_staleness 1, P = 2 groups of 2 rows, slots for one request at a
  time. Request 1 = [LONG, SHORT], request 2 = [SHORT, SHORT]. Step 1 takes
  request 1's short group and request 2's first (LONG may still be trained
  at step 2); step 2 must take LONG (its deadline) and waits for it. A
  checkpoint's blocks, restored into a new stream, give step 3 the same
  batch."""
  engine = _engine(w0)
  stop = _stop_id(engine)
  sampling = base.SamplingConfig(
    n=2, greedy=True, max_new_tokens=24, stop_token_ids=(stop,)
  )
  mailbox = collect_lib.Mailbox()
  mailbox.publish(0, w0, {"version": 0})
  actor = EngineActor(engine)

  def new_stream():
    return group_stream.GroupStream(actor, mailbox, lambda s: sampling, 2, 1)

  stream = new_stream()
  requests = {1: [LONG, SHORT], 2: [SHORT, SHORT], 3: [SHORT, LONG]}
  try:
    for step in (1, 2):
      stream.admit(step, [f"{step}.{i}" for i in range(2)], requests[step],
                   seed=step, data_state={"at": step})  # fmt: skip
    rb1, ex1, m1 = _unpack(stream.take(1, 0))
    assert ex1 == ["1.1", "2.0"]
    assert rb1.prompt_ids == [SHORT, SHORT]
    assert all(r[-1] == stop for r in rb1.response_ids)
    assert m1["stream_groups_other_request"] == 1.0
    mailbox.publish(1, w0, {"version": 1})
    stream.admit(3, ["3.0", "3.1"], requests[3], seed=3, data_state={"at": 3})
    rb2, ex2, m2 = _unpack(stream.take(2, 1))
    assert ex2 == ["1.0", "2.1"]
    assert rb2.prompt_ids == [LONG, SHORT]
    assert [len(r) for r in rb2.response_ids[:2]] == [24, 24]
    assert rb2.policy_version[0][0] == 0 and m2["rollout_staleness"] == 1.0
    # Where the threads met varies; what the requests fix does not: one
    # group of another request, none expired, request 3's two groups each
    # either in flight or ended (queued), at most one swap (θ_1).
    assert m2["stream_groups_other_request"] == 1.0
    assert m2["stream_groups_expired"] == 0.0
    assert m2["stream_groups_queued"] + m2["stream_groups_in_flight"] == 2.0
    assert m2["rollout_weight_swaps"] in (0.0, 1.0)
    for key in ("trainer_idle_fraction", "engine_idle_fraction"):
      assert 0.0 <= m2[key] <= 1.0 and m1[key] <= 1.0
    saved = stream.saved()
    assert [int(e["stream_step"]) for _, e in saved] == [3]
    assert stream.data_state() == {"at": 3}
    rb3, ex3, _ = _unpack(stream.take(3, 2))
  finally:
    stream.close()
  assert ex3 == ["3.0", "3.1"]
  restored = new_stream()
  try:
    restored.restore(saved, lambda: (["3.0", "3.1"], requests[3], {"at": 3}))
    again, ex, _ = _unpack(restored.take(3, 2))
  finally:
    restored.close()
  assert ex == ex3 and again.response_ids == rb3.response_ids
  np.testing.assert_array_equal(
    np.concatenate(again.behav_logp), np.concatenate(rb3.behav_logp)
  )
  assert [v.tolist() for v in again.policy_version] == [
    v.tolist() for v in rb3.policy_version
  ]


def test_a_restore_refuses_prompts_that_changed(w0):
  stream = group_stream.GroupStream(None, None, lambda s: None, 1, 0)
  rb = base.RolloutBatch(
    prompt_ids=[[1, 2]], response_ids=[[3]], behav_logp=[np.zeros(1)],
    finish_reason=["length"], n=1,
  )  # fmt: skip
  saved = [(rb, {"stream_step": 1.0, "stream_trained_0": 0.0,
                 "stream_version_0": 0.0})]  # fmt: skip
  with pytest.raises(ValueError, match="re-drawn for streamed step 1"):
    stream.restore(saved, lambda: (["x"], [[9, 9]], {}))


class CutAtFirstStart(group_stream.GroupStream):
  """A stream whose trainer asks for a checkpoint's cut, before θ_1, as
  soon as the engine started request 1 (from the worker's thread, so the
  cut lands at the swap point after the first decode chunk: rows in
  flight)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.asked = threading.Event()

  def started(self, tag, version):
    super().started(tag, version)
    if tag == ((1, 0), 1) and not self.asked.is_set():
      self.request_cut(1)
      self.mailbox.publish(1, self.w0, {"version": 1})
      self.asked.set()


def test_a_checkpoint_cuts_the_rows_in_flight_and_a_resume_continues_them(w0):
  """A checkpoint does not wait for the responses in flight: it saves the
  stream as the cut left it, LONG's rows part-way (tokens, log-probs,
  versions so far). The stream itself goes on from there with θ_1; a new
  stream restored from the checkpoint gives step 1 the same batch, token
  for token (the same rows continued from the same state)."""
  engine = _engine(w0)
  sampling = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=24)
  requests = {1: [LONG, SHORT]}

  def new_stream(cls):
    mailbox = collect_lib.Mailbox()
    mailbox.publish(0, w0, {"version": 0})
    stream = cls(EngineActor(engine), mailbox, lambda key: sampling, 2, 1)
    stream.w0 = w0
    return stream

  stream = new_stream(CutAtFirstStart)
  try:
    stream.admit(1, ["1.0", "1.1"], requests[1], seed=5, data_state={"at": 1})
    assert stream.asked.wait(timeout=120)
    saved = stream.saved()
    want = stream.take(1, 0)
  finally:
    stream.close()
  ((rb, extra),) = saved
  states = [extra[f"stream_state_{i}"] for i in range(2)]
  assert 1.0 in states, f"no group was in flight at the cut: {states}"
  for i, state in enumerate(states):
    rows = rb.response_ids[2 * i : 2 * i + 2]
    if state == 1.0:  # partial: part-way, of θ_0 only
      assert all(0 < len(r) < 24 for r in rows)
      assert all(set(v.tolist()) == {0} for v in rb.policy_version[2 * i :][:2])
  assert set(np.concatenate(want.batch.policy_version).tolist()) == {0, 1}

  restored = new_stream(group_stream.GroupStream)
  try:
    restored.mailbox.publish(1, w0, {"version": 1})
    restored.restore(saved, lambda: (["1.0", "1.1"], requests[1], {"at": 1}))
    restored.start()
    got = restored.take(1, 0)
  finally:
    restored.close()
  assert got.examples == want.examples
  assert got.batch.response_ids == want.batch.response_ids
  for a, b in zip(got.batch.behav_logp, want.batch.behav_logp):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(got.batch.policy_version, want.batch.policy_version):
    np.testing.assert_array_equal(a, b)
