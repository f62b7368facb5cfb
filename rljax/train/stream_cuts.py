"""Streaming mode's checkpoints: the cut a checkpoint saves, and the
restore that puts it back (`group_stream`'s module docstring tells the
whole story; the saved format is `stream_saved`'s).

`StreamCuts` is a base class of `group_stream.GroupStream`, not a class on
its own: the state it reads (requests, queue, the worker's cut counters)
is GroupStream's.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from rljax.rollout import prompt_feed
from rljax.rollout.base import RolloutBatch
from rljax.train import stream_episodes
from rljax.train import stream_saved
from rljax.train.stream_pick import Block


class StreamCuts:
  """Cuts, saves and restores of a `GroupStream` (see the module doc)."""

  def request_cut(self, version: int | None = None) -> None:
    """Asks the worker for a cut before it takes weights of `version` or
    newer (None: at its next swap point); `saved` returns the state
    there. Call before publishing those weights, so that the worker
    cannot take them first."""
    with self._cv:
      self._cut_wanted = self._cut_made + 1
      self._cut_version = version
      self._cv.notify_all()

  def saved(self) -> list[tuple[RolloutBatch, dict]]:
    """What a checkpoint keeps (`stream_saved`): each open request's
    complete, partial and queued groups, as the cut the trainer asked for
    left them (one is asked for now if none is under way); with an engine
    without cuts, the state now, its prompts in flight as queued."""
    engine = getattr(self.actor, "engine", None)
    if not getattr(engine, "stream_cuts", False):
      with self._cv:
        self._raise_if_failed()
        return self._entries(in_flight=list(self._polled.values()))
    with self._cv:
      asked = self._cut_wanted > self._cut_returned
    if not asked:  # no cut came with the weights: one at the next point
      self.request_cut(None)
    with self._cv:
      want = self._cut_returned = self._cut_wanted
      while self._cut_made < want:
        self._raise_if_failed()
        if not self._in_run and not self._queue:
          self._make_cut()  # the worker is idle: nothing is in flight
          break
        self._cv.wait(timeout=1.0)
      self._raise_if_failed()
      return list(self._snapshot)

  def _cut_due(self) -> bool:
    """A cut is asked for and due now: no version named, or the newest
    weights are of that version or newer (under the lock)."""
    if self._cut_wanted <= self._cut_made:
      return False
    if self._cut_version is None:
      return True
    newest = self._newest()
    return newest is not None and newest.version >= self._cut_version

  def _make_cut(self) -> None:
    """Records the state between two engine runs as the cut's (under the
    lock)."""
    self._snapshot = self._entries(in_flight=[])
    self._cut_made = self._cut_wanted
    self._cv.notify_all()

  def _entries(self, in_flight: list) -> list[tuple[RolloutBatch, dict]]:
    """`stream_saved.encode` of every open request (under the lock);
    `in_flight`: prompts the engine holds, saved as queued ahead of the
    queue (their rows are not known until they end)."""
    order = [item.tag for item in in_flight] + [q.tag for q in self._queue]
    place = {tag: k for k, tag in enumerate(order)}
    held = {item.tag for item in in_flight}
    out = []
    for block in self.open_blocks_locked():
      if held:
        block = dataclasses.replace(
          block,
          started=[
            None if (block.key, i) in held else v
            for i, v in enumerate(block.started)
          ],
        )
      places = {
        i: place[(block.key, i)]
        for i in range(len(block.prompts))
        if (block.key, i) in place
      }
      complete = [g for g in block.groups if g is not None]
      n = complete[0].n if complete else self.sampling_for(block.key).n
      rb, extra = stream_saved.encode(block, n, places)
      if self.episodes is not None:  # rewards that no scorer can redo
        rb, extra = stream_episodes.encode_block(block, rb, extra)
      out.append((rb, extra))
    return out

  def restore(
    self,
    saved: list[tuple[RolloutBatch, dict]],
    draw: Callable[[], tuple[list, list, dict]],
  ) -> None:
    """Puts a checkpoint's requests back: `draw()` re-draws each one's
    (examples, prompts, data state) from the restored data position; their
    partial and queued groups are queued in the saved order."""
    queued = []
    for rb, extra in saved:
      examples, prompts, data_state = draw()
      key, seed, started, groups, partial, trained, places = (
        stream_saved.decode(rb, extra, prompts)
      )
      if seed is None and places:  # saved before seeds were: as at admit
        seed = self.sampling_for(key).seed
      block = Block(
        key, examples, [list(x) for x in prompts], int(seed or 0),
        data_state, started, groups, trained, partial=partial,
      )  # fmt: skip
      stream_episodes.decode_block(block, extra)
      for i, place in places.items():
        item = prompt_feed.StreamPrompt(
          block.prompts[i], i, block.seed, (key, i), partial[i]
        )
        queued.append((place, item))
      with self._cv:
        self._blocks[key] = block
        if key[1] == 0:
          self.admitted_through = max(self.admitted_through, key[0])
        self._rounds[key[0]] = max(self._rounds.get(key[0], 0), key[1])
    with self._cv:
      ordered = [item for _, item in sorted(queued, key=lambda q: q[0])]
      self._queue.extendleft(reversed(ordered))
      self._cv.notify_all()
