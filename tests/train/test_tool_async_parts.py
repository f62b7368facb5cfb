"""The asynchronous modes' episode plumbing, without a model: one_step's
queue (`Collector.schedule` / `collect`, a checkpoint's pending rollouts)
and streaming's episode worker (`GroupStream` with `episodes`), on a fake
actor and a fake multi-turn task whose two turns ask `between_turns` for
the engine's version. The whole runs are in test_tool_async.py."""

import time

import numpy as np

from rljax.data.records import Example
from rljax.rollout.base import RolloutBatch, SamplingConfig
from rljax.rollout.multiturn import MultiTurnRollout
from rljax.train import actor as actor_lib
from rljax.train import collect as collect_lib
from rljax.train import group_stream
from rljax.train.collect_stream import Mailbox
from rljax.train.config import apply_preset
from rljax.train.stream_pick import Scored

P, N = 2, 2


class FakeTask:
  """Episodes of two model turns (ids 5, 6) around one observation id (7);
  sample j of each prompt earns reward j % 2, so every group has a signal."""

  multi_turn = True
  stop_token_ids = (2,)

  def __init__(self, between=None):
    self.pos, self.between = 0, between  # called between the two turns

  def state_dict(self):
    return {"pos": self.pos}

  def load_state_dict(self, state):
    self.pos = state["pos"]

  def next_train_batch(self, p):
    out = [
      Example(question=f"q{k}", answer="1", uid=str(k))
      for k in range(self.pos, self.pos + p)
    ]
    self.pos += p
    return out

  def prompt_ids(self, example):
    return [1, 3 + int(example.uid)]

  def episodes(self, engine, examples, sampling, between_turns=None):
    first = between_turns() if between_turns else 0
    if self.between is not None:
      self.between(examples)
    second = between_turns() if between_turns else 0
    rows = len(examples) * sampling.n
    stamped = np.array([first, second, second], np.int32)
    batch = RolloutBatch(
      prompt_ids=[self.prompt_ids(e) for e in examples],
      response_ids=[[5, 7, 6]] * rows,
      behav_logp=[np.full(3, -0.5, np.float32)] * rows,
      finish_reason=["stop"] * rows,
      n=sampling.n,
      action_mask=[np.array([1, 0, 1], bool)] * rows,
      policy_version=[stamped] * rows if between_turns else None,
    )
    infos = [
      {"turns": 2, "tool_calls": 1, "malformed_calls": 0, "tool_errors": {}}
    ] * rows
    rewards = np.array([j % 2 for j in range(rows)], np.float32)
    # A kept-KV run's counts ride along (`slot_episodes`).
    kept = {"engine/prefills": 2.0, "engine/appended_tokens": 3.0}
    kept.update({"engine/slot_steps": 10.0, "engine/live_row_steps": 5.0})
    return MultiTurnRollout(
      batch, rewards, infos, {"engine_calls": 2.0, **kept}
    )


class FakeActor:
  """Weights are their version; `with_engine` runs the call at once."""

  engine = object()  # no stream_cuts: a save takes the state as it is

  def __init__(self):
    self.version, self.pushes = None, []

  def prepare(self, params, version):
    return params, {actor_lib.VERSION_KEY: version}

  def push(self, rparams, diag):
    self.version = diag[actor_lib.VERSION_KEY]
    self.pushes.append(self.version)
    return {}

  def with_engine(self, what, call):
    return call(self.engine), self.version


def _one_step_collector(task=None):
  cfg = apply_preset(
    "grpo",
    {
      "rollout.prompts_per_step": P,
      "rollout.group_size": N,
      "run.async_mode": "one_step",
    },
  )
  return collect_lib.Collector(cfg, task or FakeTask(), FakeActor(), None)


def test_one_step_episodes_travel_through_the_queue():
  c = _one_step_collector()
  try:
    c.schedule(1, "θ0", 0)
    got = c.collect(1)
  finally:
    c.close()
  np.testing.assert_array_equal(got.rewards, [0, 1, 0, 1])
  assert got.batch.action_mask is not None
  m = got.metrics
  assert m["tool_call_rate"] == 1.0 and m["turns_mean"] == 2.0
  assert m["episodes"] == 4.0 and m["engine_calls"] == 2.0
  assert m["kv_episode_prefills"] == 2.0
  assert m["kv_episode_appended_tokens"] == 3.0
  assert m["kv_episode_occupancy"] == 0.5
  assert m["rollout_staleness"] == 0.0
  assert m["rollout_tokens"] == 4 * 2  # model ids, not the observation's
  assert not any(k.startswith("episode/") for k in m)
  # One engine, one version for the whole rollout (no hook in one_step).
  assert {int(v) for r in got.batch.policy_version for v in r} == {0}


def test_one_step_checkpoint_keeps_the_pending_episodes():
  live = _one_step_collector()
  try:
    live.schedule(1, "θ0", 0)
    live.collect(1)
    live.schedule(2, "θ0", 0)
    data_state = live.data_state()
    saved = live.pending_rollouts()
    want = live.collect(2)
  finally:
    live.close()
  assert data_state == {"pos": P}  # before step 2's prompts
  task = FakeTask()
  task.load_state_dict(data_state)
  resumed = _one_step_collector(task)
  try:
    resumed.restore_pending(saved)
    got = resumed.collect(2)
  finally:
    resumed.close()
  np.testing.assert_array_equal(got.rewards, want.rewards)
  assert got.batch.response_ids == want.batch.response_ids
  for key in ("tool_call_rate", "turns_mean", "episodes", "engine_calls"):
    assert got.metrics[key] == want.metrics[key], key
  assert got.metrics["rollout_staleness"] == want.metrics["rollout_staleness"]


def _score(groups, examples, episodes):
  return [Scored(e.rewards, {}, True, 0) for e in episodes]


def _stream(task, actor, mailbox):
  sampling = SamplingConfig(n=N, max_new_tokens=4, stop_token_ids=(2,))

  def run(key, examples, between_turns):
    return task.episodes(None, examples, sampling, between_turns)

  return group_stream.GroupStream(
    actor, mailbox, lambda key: sampling, P, max_staleness=1, score=_score,
    episodes=run,
  )  # fmt: skip


def _admit(stream, task, step):
  state = task.state_dict()
  examples = task.next_train_batch(P)
  prompts = [task.prompt_ids(e) for e in examples]
  stream.admit(step, examples, prompts, step, state)


def _wait_complete(stream, key):
  deadline = time.monotonic() + 60
  while any(g is None for g in stream._blocks[key].groups):
    assert time.monotonic() < deadline
    time.sleep(0.01)


def test_streaming_episodes_take_new_weights_between_turns():
  mailbox = Mailbox()
  mailbox.publish(0, "θ0", {actor_lib.VERSION_KEY: 0})

  def trainer_publishes(examples):
    # Step 2's episodes, between their turns: θ_1 arrives.
    if examples[0].uid == str(P):
      mailbox.publish(1, "θ1", {actor_lib.VERSION_KEY: 1})

  task, actor = FakeTask(trainer_publishes), FakeActor()
  stream = _stream(task, actor, mailbox)
  try:
    _admit(stream, task, 1)
    _admit(stream, task, 2)
    first = stream.take(1, 0)
    _wait_complete(stream, (2, 0))
    saved = stream.saved()  # step 2's complete groups, with their episodes
    second = stream.take(2, 1)
  finally:
    stream.close()
  assert {int(v) for r in first.batch.policy_version for v in r} == {0}
  for versions in second.batch.policy_version:
    assert versions.tolist() == [0, 1, 1]  # one episode, two versions
  assert actor.pushes == [0, 1]
  assert second.metrics["rollout_staleness"] == 1.0
  assert len(second.episodes) == P
  np.testing.assert_array_equal(second.rewards, [0, 1, 0, 1])
  # A resume puts the saved groups back with their rewards and counters.
  again = FakeTask()
  again.load_state_dict({"pos": P})
  mailbox = Mailbox()
  mailbox.publish(1, "θ1", {actor_lib.VERSION_KEY: 1})
  resumed = _stream(again, FakeActor(), mailbox)

  def draw():
    state = again.state_dict()
    examples = again.next_train_batch(P)
    return examples, [again.prompt_ids(e) for e in examples], state

  try:
    resumed.restore(saved, draw)
    got = resumed.take(2, 1)
  finally:
    resumed.close()
  np.testing.assert_array_equal(got.rewards, second.rewards)
  assert [v.tolist() for v in got.batch.policy_version] == [
    v.tolist() for v in second.batch.policy_version
  ]
  assert [m.tolist() for m in got.batch.action_mask] == [
    m.tolist() for m in second.batch.action_mask
  ]
  assert collect_lib.episode_metrics(got.episodes) == (
    collect_lib.episode_metrics(second.episodes)
  )
