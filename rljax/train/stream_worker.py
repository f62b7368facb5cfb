"""Streaming mode's worker: the engine side of `group_stream`.

The worker thread runs the engine's streamed slot runs over the queue of
admitted prompts and is the `prompt_feed.PromptFeed` they read: `poll`
hands the engine the queued prompts, `started` / `done` record each
group's first version and rows, `cut` / `handback` end a run for a
checkpoint and take its unfinished prompts back. It takes the newest
published θ at the start of a run and at every swap point
(`weight_updates`), and after an engine failure puts the prompts the
engine held back into the queue (`_readmit`, called by
`Actor.generate_stream`'s recovery).

`StreamWorker` is a base class of `group_stream.GroupStream`, not a class
on its own: the state it reads (requests, queue, mailbox, actor) is
GroupStream's.
"""

from __future__ import annotations

import time
from typing import Any

from rljax.rollout import prompt_feed
from rljax.train.stream_pick import Key, group_batch


class StreamWorker:
  """The worker's half of a `GroupStream` (see the module doc)."""

  def poll(self, prompt_len: int) -> list[prompt_feed.StreamPrompt]:
    out = []
    with self._cv:
      while self._queue and len(self._queue[0].ids) <= prompt_len:
        item = self._queue.popleft()
        self._polled[item.tag] = item
        out.append(item)
    return out

  def started(self, tag: Any, version: int) -> None:
    key, i = tag
    with self._cv:
      block = self._blocks[key]
      if block.started[i] is None:
        block.started[i] = int(version)
        self._cv.notify_all()

  def done(self, group: prompt_feed.DoneGroup) -> None:
    key, i = group.tag
    if group.versions is None:
      raise ValueError(
        f"streamed group {group.tag!r} came back without per-token "
        "policy versions; expected the engine to stamp every token (a "
        "streamed run with a weight_updates hook)"
      )
    with self._cv:
      block = self._blocks[key]
      block.groups[i] = group_batch(group, self.sampling_for(key))
      block.partial[i] = None
      self._polled.pop(group.tag, None)
      self._cv.notify_all()

  def stopped(self) -> bool:
    return self._closed

  def cut(self) -> bool:
    """Asked by the engine at each swap point: end the run here (a cut is
    due, before newer weights are taken)."""
    with self._cv:
      return self._cut_due()

  def handback(self, prompts: list[prompt_feed.StreamPrompt]) -> None:
    """A cut's unfinished prompts, each with its rows so far: back to the
    front of the queue, in the engine's order."""
    with self._cv:
      for item in prompts:
        key, i = item.tag
        self._blocks[key].partial[i] = item.partial
        self._polled.pop(item.tag, None)
      self._queue.extendleft(reversed(prompts))
      self._cv.notify_all()

  def _newest(self):
    """The newest published weights, as the worker sees them."""
    return self.mailbox.latest()

  def _work(self) -> None:
    try:
      while True:
        with self._cv:
          self._idle_since = time.perf_counter()
          while not self._queue and not self._closed and not self._cut_due():
            self._cv.wait(timeout=1.0)
          self._idle += time.perf_counter() - self._idle_since
          self._idle_since = None
          if self._closed:
            return
          if self._cut_due():  # between runs: nothing is in flight
            self._make_cut()
          if not self._queue:
            continue
          key = self._queue[0].tag[0]
          shape = self._blocks[key].prompts
          self._in_run = True
        try:
          if self.episodes is not None:  # a multi-turn task's requests
            self._run_episodes(key)
          else:
            self._run(key, shape)
        finally:
          with self._cv:
            self._in_run = False
            self._cv.notify_all()
    except BaseException as e:  # pylint: disable=broad-except
      with self._cv:
        self._error = e
        self._cv.notify_all()

  def _push_newest(self, what: str) -> None:
    newest = self._newest()
    if newest is None:
      raise RuntimeError(f"streaming rollout {what}: no weights published yet")
    self.actor.push(newest.rparams, dict(newest.diag))
    self._pushed = True
    self._running = newest.version

  def _readmit(self) -> None:
    """After an engine failure: the prompts it held go back to the front
    of the queue (their rows were lost with it: they start again), and
    the newest θ is pushed to the restarted engine."""
    with self._cv:
      lost = list(self._polled.values())
      self._polled.clear()
      for item in lost:
        key, i = item.tag
        if item.partial is None:
          self._blocks[key].started[i] = None
      self._queue.extendleft(reversed(lost))
    self._push_newest("after an engine restart")

  def _start_from_newest(self, key: Key) -> None:
    """The engine holds the newest published θ before request `key`'s run
    (pushed if it does not yet)."""
    newest = self._newest()
    if newest is None:
      raise RuntimeError(
        f"streaming rollout of step {key[0]}: no weights published yet"
      )
    if newest.version != self._running or not self._pushed:
      # The JAX engine starts without weights: the first run pushes.
      self._push_newest(f"of step {key[0]}")

  def _run(self, key: Key, shape: list) -> None:
    """One streamed slot run, from the newest published θ."""
    self._start_from_newest(key)

    def weight_updates():
      item = self._newest()
      if item is None or item.version <= self._running:
        return None
      self._running = item.version
      with self._cv:
        self._swaps += 1
      return item.rparams, item.version

    if not hasattr(self.actor.engine, "generate_stream"):
      raise TypeError(
        f"streaming rollout: engine {type(self.actor.engine).__name__} has no "
        "generate_stream (a streamed run with in-flight updates: JaxSampler, "
        "VLLMSidecar); expected one of those, or --run.async_mode=one_step"
      )
    self.actor.generate_stream(
      self, shape, self.sampling_for(key), weight_updates,
      before_retry=self._readmit,
    )  # fmt: skip
