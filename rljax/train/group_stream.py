"""Streaming mode's rollout side: one engine worker over a paced prompt
stream, groups handed to the trainer as they complete.

  trainer thread                        worker thread (the engine)
  ──────────────                        ──────────────────────────────
  admit(block j) once step j−1−k   ──►  admitted prompts, in order
  has trained (the pace)                      │
                                              ▼
                                        a streamed slot run
                                        (`JaxSampler.generate_stream`):
                                        prompts join free slots, the newest
                                        θ (`collect_stream.Mailbox`) is taken
                                        before a prefill and between chunks
                                              │
  take(step t) ◄── complete groups ◄──────────┘ a group's n rows all ended
     scored on arrival (the trainer's thread, `score`); dynamic sampling's
     filter retires a group with no signal there, and a refill request of
     P fresh prompts for step t goes to the front of the queue as soon as
     the groups kept or still to come cannot make P (at most
     max_resample_rounds of them; then the batch is padded with filtered
     groups, masked out, as the synchronous loop pads it)
     earliest deadline first: a group's oldest token, of version v, may be
     trained while θ_old's version V ≤ v + k; the step takes the P complete
     kept groups whose deadlines come first, and waits while a group still
     in flight would otherwise miss its own
  checkpoint: a cut, not a drain. The θ of a step that checkpoints is
     published with a cut request: before taking it, the worker ends its
     slot run at the next swap point, the engine hands every unfinished
     prompt back with its rows so far, and the stream's state there
     (complete, partial and queued groups, the queue's order) is what the
     checkpoint saves (`stream_saved`); the worker goes on at once with
     that θ, continuing the partial rows (their KV recomputed by it). A
     resume queues the same partial rows in the same order, so it
     continues them from the state the uninterrupted run continued them
     from. The trainer waits at most one decode chunk, not for the longest
     response in flight. An engine without cuts (vLLM: its requests return
     whole) saves the prompts in flight as queued: a resume samples them
     again.
  engine failure: a vLLM server that dies mid-stream is restarted once
     (`Actor.generate_stream`, the recovery of every other mode); the
     prompts it had in flight go back to the front of the queue, the
     newest θ is pushed again, and the stream goes on.

So a step does not wait for its own request's longest response: a group of
a later request that ended sooner fills its place, and the straggler goes
into a later step (within its deadline). With k = 0 a step can take only
the groups of its own request and its refills, in their order: the
synchronous run, refill loop included. A kept group that was not taken
before its deadline (a refill's surplus; with k = 0 every surplus) is
retired unused and counted (`stream_groups_expired`): the bound on lag
wins over keeping it. Requests are keyed (step, round): round 0 is the
paced request, rounds 1, 2, ... a step's refills. On vLLM (one server,
`VLLMSidecar.generate_stream`) each admitted prompt is a request of its
own, sent at once (the server batches running requests), and its group
comes back when that request ends; new θ pause the server, are applied in
place and generation resumes.

The engine's idle share is the time the worker had nothing admitted; the
trainer's is its wait in `take`.

Reproducibility: a resume continues exactly the state its checkpoint's
cut saved, so a run killed and resumed is the uninterrupted run whenever
the worker's schedule is a function of its own progress (the tests impose
one: tests/train/stream_gate.py). With free-running threads, which decode
chunk a new θ lands at depends on how the threads meet, so two streaming
runs at max_staleness >= 1 may differ, interrupted or not; at
max_staleness 0 nothing newer exists while a request decodes, and the run
is the synchronous one, bit for bit.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

import numpy as np

from rljax.rollout import prompt_feed
from rljax.rollout.base import RolloutBatch, SamplingConfig
from rljax.train.collected import model_tokens
from rljax.train.stream_cuts import StreamCuts
from rljax.train.stream_episodes import StreamEpisodes
from rljax.train.stream_worker import StreamWorker
from rljax.train.stream_pick import (
  Block,
  Key,
  Scored,
  Taken,
  decide,
  expire,
)

# The metrics of a step that measure how the two threads met (time, the
# swaps the engine happened to take, where the other groups were), not the
# batch: two runs that train on the same batches may differ in them.
SCHEDULE_METRICS = (
  "trainer_idle_fraction",
  "engine_idle_fraction",
  "rollout_weight_swaps",
  "stream_groups_other_request",
  "stream_groups_queued",
  "stream_groups_in_flight",
  "stream_groups_expired",
)


class GroupStream(StreamCuts, StreamEpisodes, StreamWorker):
  """The worker, the admitted requests and the trainer's `take` (see the
  module docstring). `sampling_for(key)` is a request's SamplingConfig;
  `mailbox` holds the newest published θ (`collect_stream.Mailbox`); `score(groups,
  examples)` scores arriving groups on the trainer's thread (a `Scored`
  each; None: every group is kept, unscored); `refill_rounds` bounds a
  step's refill requests (dynamic sampling's max_resample_rounds).
  `episodes(key, examples, between_turns)`, for a multi-turn task: runs
  the episodes of request `key`'s `examples` (`stream_episodes`); the
  scorer then gets each group's episodes as a third argument."""

  def __init__(
    self,
    actor: Any,
    mailbox: Any,
    sampling_for: Callable[[Key], SamplingConfig],
    prompts: int,
    max_staleness: int,
    score: Callable[[list[RolloutBatch], list], list[Scored]] | None = None,
    refill_rounds: int = 0,
    episodes: Callable | None = None,
  ):
    self.actor = actor
    self.mailbox = mailbox
    self.sampling_for = sampling_for
    self.prompts = prompts
    self.k = max_staleness
    self.score = score
    self.refill_rounds = refill_rounds
    self.episodes = episodes
    self._cv = threading.Condition()
    # In admission order, which is the order their prompts were drawn (a
    # resume re-draws them in it).
    self._blocks: collections.OrderedDict[Key, Block] = (
      collections.OrderedDict()
    )
    self._queue: collections.deque[prompt_feed.StreamPrompt] = (
      collections.deque()
    )
    self._thread: threading.Thread | None = None
    self._closed = False
    self._error: BaseException | None = None
    self.admitted_through = 0  # the newest paced (round 0) request's step
    self._rounds: dict[int, int] = {}  # step → its newest refill round
    # Idle accounting: the worker's seconds with nothing admitted, the
    # swaps it took, both read (as differences) at every take.
    self._idle = 0.0
    self._idle_since: float | None = None
    self._swaps = 0
    self._expired = 0
    self._last_take = time.perf_counter()
    self._idle_at_take = 0.0
    self._swaps_at_take = 0
    self._expired_at_take = 0
    self._pushed = False  # the worker pushed weights once
    self._running: int | None = None  # the version the engine samples with
    # Prompts the engine took from the queue and has not ended or handed
    # back, in the order taken (a failed engine's are queued again).
    self._polled: collections.OrderedDict[Any, prompt_feed.StreamPrompt] = (
      collections.OrderedDict()
    )
    self._in_run = False  # the worker is inside an engine run
    # Cuts (see the module docstring): requests counted, the version a cut
    # comes before (None: the next swap point), and the last one made: its
    # number and the state then.
    self._cut_wanted = 0
    self._cut_version: int | None = None
    self._cut_made = 0
    self._cut_returned = 0  # the last cut a `saved` call returned
    self._snapshot: list[tuple[RolloutBatch, dict]] = []

  # -- the trainer's side -----------------------------------------------------

  def admit(
    self,
    step: int,
    examples: list,
    prompts: list,
    seed: int,
    data_state,
    round_: int = 0,
  ) -> None:
    """Queues the prompts of request (`step`, `round_`), drawn by the
    caller in order: round 0 paced, step after step; a refill (round r ≥ 1
    of an admitted step, after its round r − 1) goes to the queue's front,
    since the step waiting for it is the oldest."""
    key = (int(step), int(round_))
    if round_ == 0 and step != self.admitted_through + 1:
      raise ValueError(
        f"GroupStream.admit: step {step} after {self.admitted_through}; "
        "expected the steps in order, each once"
      )
    if round_ > 0 and self._rounds.get(step, -1) != round_ - 1:
      raise ValueError(
        f"GroupStream.admit: refill round {round_} of step {step}; expected "
        f"round {self._rounds.get(step, -1) + 1} of an admitted step"
      )
    p = len(prompts)
    with self._cv:
      self._blocks[key] = Block(
        key, list(examples), [list(x) for x in prompts], int(seed),
        data_state, [None] * p, [None] * p, np.zeros((p,), bool),
      )  # fmt: skip
      items = [
        prompt_feed.StreamPrompt(ids, i, int(seed), (key, i))
        for i, ids in enumerate(self._blocks[key].prompts)
      ]
      if round_ == 0:
        self._queue.extend(items)
        self.admitted_through = step
      else:
        self._queue.extendleft(reversed(items))
      self._rounds[step] = round_
      self._cv.notify_all()
    self.start()

  def start(self) -> None:
    """Starts the worker (idempotent): at the first admission, or after a
    restore once weights are published."""
    if self._thread is None:
      self._thread = threading.Thread(
        target=self._work, name="rljax-stream", daemon=True
      )
      self._thread.start()

  def take(
    self,
    step: int,
    version: int,
    refill: Callable[[int], None] | None = None,
  ) -> Taken:
    """The batch of `step`, whose θ_old is `version`: P complete kept
    groups by earliest deadline (`choose`), in request order; waits for
    them. Groups that arrived are scored first; when too few can be kept,
    `refill(r)` is asked to admit round r of `step` (r ≤ refill_rounds),
    and past the last round the batch is padded with filtered groups."""
    t0 = time.perf_counter()
    # (score, tokens, (key, index)) of the groups that arrived meanwhile
    scored: list[tuple[Scored, int, tuple[Key, int]]] = []
    t_score = 0.0
    while True:
      with self._cv:
        self._raise_if_failed()
        fresh = self._unscored()
      if fresh and self.score is not None:
        ts = time.perf_counter()
        args = [[g for _, _, g, _ in fresh], [e for *_, e in fresh]]
        if self.episodes is not None:
          args.append([self._blocks[k].episodes[i] for k, i, _, _ in fresh])
        got = self.score(*args)
        t_score += time.perf_counter() - ts
        with self._cv:
          for (key, i, g, _), s in zip(fresh, got):
            self._blocks[key].scores[i] = s
            scored.append((s, model_tokens(g), (key, i)))
        continue
      with self._cv:
        action, picked, filler = self._decide(step, version, refill is not None)
        if action == "take":
          waited = time.perf_counter() - t0 - t_score
          taken = self._take(step, version, picked, filler, waited)
          break
        if action == "wait":
          if self._closed:
            raise RuntimeError("GroupStream.take after close")
          self._cv.wait(timeout=1.0)
          continue
      refill(self._rounds[step] + 1)  # outside the lock: it draws prompts
    # Tokens: the batch's, and those of the groups the filter retired
    # meanwhile (the synchronous loop counts its filtered rounds too); not
    # the kept groups that arrived for later steps, so that the count is
    # the batch's when nothing is filtered, however the threads met.
    filler = set(filler)
    thrown = sum(t for s, t, g in scored if not s.keep and g not in filler)
    taken.metrics.update(
      time_reward=t_score,
      dynamic_sampling_filtered_groups=float(
        sum(not s.keep for s, *_ in scored)
      ),
      dynamic_sampling_rounds=float(1 + self._rounds.get(step, 0)),
      rollout_tokens=float(model_tokens(taken.batch) + thrown),
      reward_nonfinite=float(sum(s.nonfinite for s, *_ in scored)),
      reward_sampled=float(sum(len(s.rewards) for s, *_ in scored)),
    )
    return taken

  def _raise_if_failed(self) -> None:
    if self._error is not None:
      raise RuntimeError(
        f"the streaming rollout worker failed: {self._error!r}"
      ) from self._error

  def _unscored(self) -> list[tuple[Key, int, RolloutBatch, Any]]:
    """Groups that ended and are neither scored nor retired."""
    return [
      (b.key, i, g, b.examples[i])
      for b in self._blocks.values()
      for i, g in enumerate(b.groups)
      if g is not None and b.scores[i] is None and not b.retired(i)
    ]

  def _decide(self, step: int, version: int, can_refill: bool):
    """`stream_pick.decide` on this stream's requests (under the lock)."""
    self._expired += expire(self._blocks.values(), version, self.k)
    refill_left = can_refill and self._rounds.get(step, 0) < self.refill_rounds
    return decide(
      list(self._blocks.values()),
      step, version, self.k, self.prompts, refill_left,
    )  # fmt: skip

  def _take(self, step, version, picked, filler, waited) -> Taken:
    """Marks the chosen groups trained and gathers the step's batch."""
    picked = sorted(picked)
    rbs, examples, scores, oldest, episodes = [], [], [], None, []
    for key, i in picked + filler:
      block = self._blocks[key]
      block.trained[i] = True
      rbs.append(block.groups[i])
      episodes.append(block.episodes[i])
      examples.append(block.examples[i])
      scores.append(block.scores[i])
      v = block.started[i]
      oldest = v if oldest is None else min(oldest, v)
    n = rbs[0].n
    valid = np.repeat(np.arange(len(rbs)) < len(picked), n)
    rewards = components = None
    if self.score is not None:
      rewards = np.concatenate([s.rewards for s in scores]).astype(np.float32)
      components = {
        name: np.concatenate([s.components[name] for s in scores])
        for name in scores[0].components
      }
    other = sum(key[0] != step for key, _ in picked + filler)
    queued = sum(
      g is not None and not b.retired(i)
      for b in self._blocks.values()
      for i, g in enumerate(b.groups)
    )
    in_flight = sum(g is None for b in self._blocks.values() for g in b.groups)
    self._forget_retired()
    now = time.perf_counter()
    idle = self._idle + (now - self._idle_since if self._idle_since else 0)
    span = max(now - self._last_take, 1e-9)
    metrics = {
      "time_rollout_wait": waited,
      "trainer_idle_fraction": min(1.0, waited / span),
      "engine_idle_fraction": min(1.0, (idle - self._idle_at_take) / span),
      "rollout_weight_swaps": float(self._swaps - self._swaps_at_take),
      "rollout_staleness": float(version - oldest),
      "stream_groups_other_request": float(other),
      "stream_groups_queued": float(queued),
      "stream_groups_in_flight": float(in_flight),
      "stream_groups_expired": float(self._expired - self._expired_at_take),
      "dynamic_sampling_kept_groups": float(len(picked)),
    }
    self._last_take, self._idle_at_take = now, idle
    self._swaps_at_take, self._expired_at_take = self._swaps, self._expired
    return Taken(
      RolloutBatch.concat(rbs), examples, valid, rewards, components,
      len(picked), metrics,
      episodes if self.episodes is not None else None,
    )  # fmt: skip

  def _forget_retired(self) -> None:
    """Drops the oldest requests whose groups all retired (a checkpoint
    starts from the oldest open one)."""
    while self._blocks:
      key, block = next(iter(self._blocks.items()))
      if block.open:
        return
      del self._blocks[key]

  def open_blocks(self) -> list[Block]:
    """The admitted requests from the oldest with a group not retired on,
    in admission order."""
    with self._cv:
      return self.open_blocks_locked()

  def open_blocks_locked(self) -> list[Block]:
    blocks = list(self._blocks.values())
    for j, block in enumerate(blocks):
      if block.open:
        return blocks[j:]
    return []

  @property
  def pending(self) -> int:
    return len(self.open_blocks())

  def data_state(self) -> dict | None:
    """The oldest open block's data position (None: every admitted group
    trained)."""
    blocks = self.open_blocks()
    return blocks[0].data_state if blocks else None

  def close(self) -> None:
    with self._cv:
      self._closed = True
      self._cv.notify_all()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
