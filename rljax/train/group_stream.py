"""Streaming mode's rollout side (issue 47 items 1 and 4): one engine worker
over a paced prompt stream, groups handed to the trainer as they complete.

  trainer thread                        worker thread (the engine)
  ──────────────                        ──────────────────────────────
  admit(block j) once step j−1−k   ──►  admitted prompts, in order
  has trained (the pace)                      │
                                              ▼
                                        a streamed slot run
                                        (`JaxSampler.generate_stream`):
                                        prompts join free slots, the newest
                                        θ (`collect.Mailbox`) is taken
                                        before a prefill and between chunks
                                              │
  take(step t) ◄── complete groups ◄──────────┘ a group's n rows all ended
     earliest deadline first: a group's oldest token, of version v, may be
     trained while θ_old's version V ≤ v + k; the step takes the P complete
     groups whose deadlines come first, and waits while a group still in
     flight would otherwise miss its own
  checkpoint: drain (nothing is admitted while the trainer saves; what is in
     flight finishes), then every admitted block with an untrained group is
     saved; a resume re-draws their prompts from the oldest one's data
     position and queues their untrained groups again

So a step does not wait for its own request's longest response: a group of
a later request that ended sooner fills its place, and the straggler goes
into a later step (within its deadline). With k = 0 a step can take only
the groups of its own request, all of them: the synchronous run. vLLM (one
server) has no streamed slot run here: its worker runs one request at a
time with in-flight weight updates (pause, update, resume), so its groups
come back when their request ends.

The engine's idle share is the time the worker had nothing admitted; the
trainer's is its wait in `take`.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Callable

import numpy as np

from rljax.rollout import prompt_feed
from rljax.rollout.base import RolloutBatch, SamplingConfig

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
)

_STEP = "stream_step"
_TRAINED = "stream_trained_"  # + group index: 1.0 if a step trained it
_STARTED = "stream_version_"  # + group index: the version of its prefill


@dataclasses.dataclass
class Block:
  """The prompts one step admitted (a request) and what became of them."""

  step: int
  examples: list
  prompts: list[list[int]]
  seed: int
  data_state: dict  # the task's position before these prompts were drawn
  started: list[int | None]  # each group's first prefill version
  groups: list[RolloutBatch | None]  # each group's rows once all ended
  trained: np.ndarray  # bool [P]

  @property
  def open(self) -> bool:
    """Some group not trained on yet."""
    return not bool(self.trained.all())


def choose(
  candidates: list[tuple[int, int, int, bool]], prompts: int
) -> list[tuple[int, int]] | None:
  """The step's groups by earliest deadline first, or None to wait.

  Args:
    candidates: (slack, block step, index, complete) of every untrained
      group already prefilled; slack m = v + k − V is how many steps after
      this one the group may still be trained (v: its oldest token's
      version, V: θ_old's, k: max_staleness).
    prompts: P, the groups a step takes.

  Returns the (block step, index) of P complete groups, or None when fewer
  are complete, or when a group in flight with slack ≤ h could still be
  needed: the next h steps take h·P groups, so this one must take at least
  (groups with slack ≤ h) − h·P of them. When no group in flight could make
  up a shortfall, the earliest P are returned anyway (the trainer's lag
  check then names the token that is too old).
  """
  done = sorted(c for c in candidates if c[3])
  if len(done) < prompts:
    return None
  chosen = done[:prompts]
  for h in sorted({c[0] for c in candidates}):
    need = sum(c[0] <= h for c in candidates) - h * prompts
    have = sum(c[0] <= h for c in chosen)
    waiting = any(c[0] <= h and not c[3] for c in candidates)
    if have < need and waiting:
      return None
  return [(c[1], c[2]) for c in chosen]


def group_batch(
  group: prompt_feed.DoneGroup, sampling: SamplingConfig
) -> RolloutBatch:
  """One prompt's n rows as a `RolloutBatch` (finish reasons as the
  engine's own: "stop" when the last token is a stop id)."""
  stop = set(sampling.stop_token_ids or ())
  return RolloutBatch(
    prompt_ids=[list(group.prompt_ids)],
    response_ids=group.tokens,
    behav_logp=group.logp,
    finish_reason=[
      "stop" if ids and ids[-1] in stop else "length" for ids in group.tokens
    ],
    n=len(group.tokens),
    policy_version=group.versions,
  )


class GroupStream:
  """The worker, the admitted blocks and the trainer's `take` (see the
  module docstring). `sampling_for(step)` is the step's SamplingConfig;
  `mailbox` holds the newest published θ (`collect.Mailbox`)."""

  def __init__(
    self,
    actor: Any,
    mailbox: Any,
    sampling_for: Callable[[int], SamplingConfig],
    prompts: int,
    max_staleness: int,
  ):
    self.actor = actor
    self.mailbox = mailbox
    self.sampling_for = sampling_for
    self.prompts = prompts
    self.k = max_staleness
    self._cv = threading.Condition()
    self._blocks: collections.OrderedDict[int, Block] = (
      collections.OrderedDict()
    )
    self._queue: collections.deque[prompt_feed.StreamPrompt] = (
      collections.deque()
    )
    self._thread: threading.Thread | None = None
    self._closed = False
    self._error: BaseException | None = None
    self.admitted_through = 0  # the newest admitted block's step
    # Idle accounting: the worker's seconds with nothing admitted, the
    # swaps it took, both read (as differences) at every take.
    self._idle = 0.0
    self._idle_since: float | None = None
    self._swaps = 0
    self._last_take = time.perf_counter()
    self._idle_at_take = 0.0
    self._swaps_at_take = 0
    self._pushed = False  # the worker pushed weights once

  # -- the trainer's side -----------------------------------------------------

  def admit(
    self, step: int, examples: list, prompts: list, seed: int, data_state
  ) -> None:
    """Queues the prompts of `step` (drawn by the caller, in step order)."""
    if step != self.admitted_through + 1:
      raise ValueError(
        f"GroupStream.admit: step {step} after {self.admitted_through}; "
        "expected the steps in order, each once"
      )
    p = len(prompts)
    with self._cv:
      self._blocks[step] = Block(
        step, list(examples), [list(x) for x in prompts], int(seed),
        data_state, [None] * p, [None] * p, np.zeros((p,), bool),
      )  # fmt: skip
      self._queue.extend(
        prompt_feed.StreamPrompt(ids, i, int(seed), (step, i))
        for i, ids in enumerate(self._blocks[step].prompts)
      )
      self.admitted_through = step
      self._cv.notify_all()
    if self._thread is None:
      self._thread = threading.Thread(
        target=self._work, name="rljax-stream", daemon=True
      )
      self._thread.start()

  def take(
    self, step: int, version: int
  ) -> tuple[RolloutBatch, list, dict[str, float]]:
    """(batch, examples, metrics) of `step`, whose θ_old is `version`: P
    complete groups by earliest deadline (`choose`), in block order; waits
    for them."""
    t0 = time.perf_counter()
    with self._cv:
      while True:
        if self._error is not None:
          raise RuntimeError(
            f"the streaming rollout worker failed: {self._error!r}"
          ) from self._error
        picked = choose(self._candidates(version), self.prompts)
        if picked is not None:
          break
        if self._closed:
          raise RuntimeError("GroupStream.take after close")
        self._cv.wait(timeout=1.0)
      picked.sort()
      rbs, examples, oldest = [], [], None
      for step, i in picked:
        block = self._blocks[step]
        block.trained[i] = True
        rbs.append(block.groups[i])
        examples.append(block.examples[i])
        v = block.started[i]
        oldest = v if oldest is None else min(oldest, v)
      other = sum(s != step for s, _ in picked)
      queued = sum(
        g is not None and not b.trained[i]
        for b in self._blocks.values()
        for i, g in enumerate(b.groups)
      )
      in_flight = sum(
        g is None for b in self._blocks.values() for g in b.groups
      )
      self._forget_trained()
      now = time.perf_counter()
      idle = self._idle + (now - self._idle_since if self._idle_since else 0)
      span = max(now - self._last_take, 1e-9)
      metrics = {
        "time_rollout_wait": now - t0,
        "trainer_idle_fraction": min(1.0, (now - t0) / span),
        "engine_idle_fraction": min(1.0, (idle - self._idle_at_take) / span),
        "rollout_weight_swaps": float(self._swaps - self._swaps_at_take),
        "rollout_staleness": float(version - oldest),
        "stream_groups_other_request": float(other),
        "stream_groups_queued": float(queued),
        "stream_groups_in_flight": float(in_flight),
      }
      self._last_take, self._idle_at_take = now, idle
      self._swaps_at_take = self._swaps
    return RolloutBatch.concat(rbs), examples, metrics

  def _candidates(self, version: int) -> list[tuple[int, int, int, bool]]:
    out = []
    for block in self._blocks.values():
      for i, started in enumerate(block.started):
        if started is not None and not block.trained[i]:
          slack = started + self.k - version
          out.append((slack, block.step, i, block.groups[i] is not None))
    return out

  def _forget_trained(self) -> None:
    """Drops the oldest blocks whose groups all trained (a checkpoint
    starts from the oldest open one)."""
    while self._blocks:
      step, block = next(iter(self._blocks.items()))
      if block.open:
        return
      del self._blocks[step]

  def open_blocks(self) -> list[Block]:
    """The admitted blocks from the oldest with an untrained group on."""
    with self._cv:
      blocks = list(self._blocks.values())
    for j, block in enumerate(blocks):
      if block.open:
        return blocks[j:]
    return []

  def drain(self) -> None:
    """Waits until every admitted prompt's rows ended (the trainer admits
    nothing meanwhile: it is saving)."""
    with self._cv:
      while not self._error and (
        self._queue
        or any(g is None for b in self._blocks.values() for g in b.groups)
      ):
        self._cv.wait(timeout=1.0)
      if self._error is not None:
        raise RuntimeError(
          f"the streaming rollout worker failed: {self._error!r}"
        ) from self._error

  def saved(self) -> list[tuple[RolloutBatch, dict]]:
    """What a checkpoint keeps (after `drain`): each open block's groups
    and, in its metrics dict, its step, which groups trained and each
    group's first version."""
    self.drain()
    out = []
    for block in self.open_blocks():
      extra = {_STEP: float(block.step)}
      for i in range(len(block.groups)):
        extra[f"{_TRAINED}{i}"] = float(block.trained[i])
        extra[f"{_STARTED}{i}"] = float(block.started[i])
      out.append((RolloutBatch.concat(block.groups), extra))
    return out

  def restore(
    self,
    saved: list[tuple[RolloutBatch, dict]],
    draw: Callable[[], tuple[list, list, dict]],
  ) -> None:
    """Queues a checkpoint's blocks again: `draw()` re-draws each one's
    (examples, prompts, data state) from the restored data position."""
    for rb, extra in saved:
      examples, prompts, data_state = draw()
      step = int(extra[_STEP])
      p = len(prompts)
      block = Block(
        step, examples, prompts, 0, data_state,
        [int(extra[f"{_STARTED}{i}"]) for i in range(p)],
        [rb.select_groups(np.array([i])) for i in range(p)],
        np.array([extra[f"{_TRAINED}{i}"] > 0 for i in range(p)]),
      )  # fmt: skip
      if [g.prompt_ids[0] for g in block.groups] != [list(x) for x in prompts]:
        raise ValueError(
          f"resume: the prompts re-drawn for streamed step {step} are not "
          "the ones its saved rollouts answer (the task's data order changed)"
        )
      with self._cv:
        self._blocks[step] = block
        self.admitted_through = step

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

  # -- the worker's side (prompt_feed.PromptFeed) -----------------------------

  def poll(self, prompt_len: int) -> list[prompt_feed.StreamPrompt]:
    out = []
    with self._cv:
      while self._queue and len(self._queue[0].ids) <= prompt_len:
        out.append(self._queue.popleft())
    return out

  def started(self, tag: Any, version: int) -> None:
    step, i = tag
    with self._cv:
      block = self._blocks[step]
      if block.started[i] is None:
        block.started[i] = int(version)
        self._cv.notify_all()

  def done(self, group: prompt_feed.DoneGroup) -> None:
    step, i = group.tag
    with self._cv:
      block = self._blocks[step]
      block.groups[i] = group_batch(group, self.sampling_for(step))
      self._cv.notify_all()

  def stopped(self) -> bool:
    return self._closed

  def _work(self) -> None:
    try:
      while True:
        with self._cv:
          self._idle_since = time.perf_counter()
          while not self._queue and not self._closed:
            self._cv.wait()
          self._idle += time.perf_counter() - self._idle_since
          self._idle_since = None
          if self._closed:
            return
          step = self._queue[0].tag[0]
          shape = self._blocks[step].prompts
        self._run(step, shape)
    except BaseException as e:  # pylint: disable=broad-except
      with self._cv:
        self._error = e
        self._cv.notify_all()

  def _run(self, step: int, shape: list) -> None:
    """One streamed slot run, from the newest published θ."""
    start = self.mailbox.latest()
    if start is None:
      raise RuntimeError(
        f"streaming rollout of step {step}: no weights published yet"
      )
    if start.version != self.actor.version or not self._pushed:
      # The JAX engine starts without weights: the first run pushes.
      self.actor.push(start.rparams, dict(start.diag))
      self._pushed = True
    taken = [self.actor.version]

    def weight_updates():
      item = self.mailbox.newer(taken[0])
      if item is None:
        return None
      taken[0] = item.version
      with self._cv:
        self._swaps += 1
      return item.rparams, item.version

    if not hasattr(self.actor.engine, "generate_stream"):
      self._run_request(step, weight_updates)
      return
    self.actor.generate_stream(
      self, shape, self.sampling_for(step), weight_updates
    )

  def _run_request(self, step: int, weight_updates: Callable) -> None:
    """An engine without a streamed slot run (vLLM: one server, paused and
    resumed for each new θ, `VLLMSidecar.generate_inflight`): the oldest
    queued request as one call, its groups handed back when it ends."""
    with self._cv:
      items = []
      while self._queue and self._queue[0].tag[0] == step:
        items.append(self._queue.popleft())
    start = self.actor.version
    rb = self.actor.generate_inflight(
      [item.ids for item in items], self.sampling_for(step), weight_updates
    )
    for g, item in enumerate(items):
      group = rb.select_groups(np.array([g]))
      first = [int(v[0]) for v in group.policy_version or () if len(v)]
      self.started(item.tag, min(first) if first else start)
      with self._cv:
        self._blocks[step].groups[item.index] = group
        self._cv.notify_all()
