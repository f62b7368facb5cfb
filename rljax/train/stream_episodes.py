"""Streaming mode's worker for multi-turn (tool) tasks: each admitted
request's episodes run through `rollout_multiturn` on the actor's engine,
and the newest published θ is taken at every turn boundary.

The token stream's worker (`stream_worker`) hands the engine single
prompts and takes new weights between decode chunks; an episode needs the
environment between its turns, so here the unit of work is the queued
groups of one request (a `Block`): their episodes run together, one engine
call per turn (`task.episodes`), and before each call `_between_turns`
loads the newest weights from the mailbox if they are newer than the
engine's. Each call's ids are stamped with the version that sampled them,
so one episode's tokens may carry several versions (the batch's
`policy_version` says which); a group's deadline counts from the version
its episodes started with. When the episodes end, each group's rows, its
rewards and tool counters (a `MultiTurnRollout` per group) go to the
block, where the trainer's `take` scores them (the episodes' rewards) and
sums the step's tool metrics.

Checkpoints: environments hold state no checkpoint can keep, so an
episode is never cut in the middle. While a cut is due the worker takes no
newer weights at a turn boundary; the cut is made when the episodes in
flight end (a checkpoint's trainer waits for them), and it saves every
complete group with its rewards and counters (`encode_block`), so a resume
trains on exactly what the uninterrupted run did. With an engine without
cuts (vLLM), episodes in flight are saved as queued: a resume runs them
again.

`StreamEpisodes` is a base class of `group_stream.GroupStream`, not a
class on its own: the state it reads (requests, queue, mailbox, actor,
`episodes`) is GroupStream's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rljax.rollout.base import RolloutBatch
from rljax.rollout.multiturn import MultiTurnRollout
from rljax.train import episode_saved
from rljax.train.stream_pick import Key


class _Closed(Exception):
  """The stream closed while episodes ran: they end at the next turn."""


def _prefix(i: int) -> str:
  return f"episode{i}/"


def group_episodes(out: MultiTurnRollout, g: int) -> MultiTurnRollout:
  """Group `g` of a request's episodes: its n rows, rewards and infos; the
  driver's counts of the whole run ride on group 0 (summed over a step's
  groups, they count each run once when the step takes its group 0)."""
  n = out.batch.n
  rows = slice(g * n, (g + 1) * n)
  metrics = dict(out.metrics) if g == 0 else {}
  return MultiTurnRollout(
    out.batch.select_groups(np.array([g])),
    np.asarray(out.rewards[rows], np.float32),
    list(out.infos[rows]),
    {k: float(v) for k, v in metrics.items()},
  )


def encode_block(block, rb: RolloutBatch, extra: dict):
  """A saved block (`stream_saved.encode`'s rb, extra) with its complete
  groups' action masks, per-turn rewards, rewards and tool counters."""
  n = rb.n
  masks, turn_rewards = [], []
  extra = dict(extra)
  for i, out in enumerate(block.episodes):
    group = block.groups[i]
    if out is None or group is None:
      masks += [
        np.ones((len(r),), bool) for r in rb.response_ids[i * n : (i + 1) * n]
      ]
      turn_rewards += [[] for _ in range(n)]
      continue
    masks += [np.asarray(m, bool) for m in group.action_mask]
    turn_rewards += [list(t) for t in (group.turn_rewards or [[]] * n)]
    extra.update(episode_saved.encode(out, prefix=_prefix(i)))
  rb = dataclasses.replace(
    rb,
    action_mask=masks,
    turn_rewards=turn_rewards if any(turn_rewards) else None,
  )
  return rb, extra


def decode_block(block, extra: dict) -> None:
  """Puts back the episodes `encode_block` saved of `block`'s complete
  groups."""
  for i, group in enumerate(block.groups):
    if group is not None and f"{_prefix(i)}rows" in extra:
      block.episodes[i] = episode_saved.decode(group, extra, prefix=_prefix(i))


class StreamEpisodes:
  """The episode worker's half of a `GroupStream` (see the module doc)."""

  def _between_turns(self, key: Key) -> int:
    """Before each engine call of request `key`'s episodes: the newest
    published weights into the engine if they are newer (none while a cut
    is due: the cut comes first); returns the version the engine holds."""
    with self._cv:
      if self._closed:  # `close` waits for the worker: stop at this turn
        raise _Closed()
      due = self._cut_due()
    item = self._newest()
    if not due and item is not None and item.version > self._running:
      self.actor.push(item.rparams, dict(item.diag))
      self._running = item.version
      with self._cv:
        self._swaps += 1
    return self._running

  def _run_episodes(self, key: Key) -> None:
    """The episodes of request `key`'s queued groups, from the newest θ."""
    with self._cv:
      items = [q for q in self._queue if q.tag[0] == key]
      for item in items:
        self._queue.remove(item)
        self._polled[item.tag] = item
    self._start_from_newest(key)  # StreamWorker's
    block = self._blocks[key]
    with self._cv:
      for item in items:
        block.started[item.index] = int(self._running)
      self._cv.notify_all()
    try:
      out = self.episodes(
        key,
        [block.examples[item.index] for item in items],
        lambda: self._between_turns(key),
      )
    except _Closed:
      return
    with self._cv:
      for g, item in enumerate(items):
        group = group_episodes(out, g)
        # The deadline counts from the group's oldest token: its first
        # turn may have sampled with weights newer than the run began with.
        block.started[item.index] = int(
          min(int(np.min(v)) for v in group.batch.policy_version if len(v))
        )
        block.groups[item.index] = group.batch
        block.episodes[item.index] = group
        block.partial[item.index] = None
        self._polled.pop(item.tag, None)
      self._cv.notify_all()
