"""Multi-turn episodes in one run of an engine that keeps their KV
(`rollout_multiturn(..., kv_reuse=True)`; `JaxSampler` with continuous
batching, `slot_episodes`).

The per-turn driver (`multiturn`) calls the engine once per turn for every
live row: a barrier (the next turn of every row waits for the slowest
tool and the longest row), and each call passes a row's whole history as
its prompt (a prefill of it per turn on the JAX engine). Here the engine
runs every episode in one run and asks this host at each segment's end:

  engine: a row stopped ──► host.stopped: `Turns.take` reads the segment
  (stop id or its limit)    (kept ids, stop matching, continuation, cut)
                               │
            ┌──────────────────┼───────────────────────┐
            ▼                  ▼                       ▼
       ended (cut, EOS     goes on (a '>' that    a turn ended: the
       of a final turn)    closed nothing, a      environment's step runs
                           chunk's end)           in a worker thread
                                                  (`tool_workers`), the row
                                                  leaves its slot
                                                       │
  engine, between chunks ◄── host.poll: finished steps: the observation's
                             ids (`Turns.answer`, on this thread) to append
                             onto the row's KV, or the episode's end

What is trained is what the per-turn driver builds: the kept ids and their
behaviour log-probs as the engine sampled them, the observations' own ids
(mask 0, log-prob 0), the same stop rules, limits and finish reasons. The
environments' steps run in worker threads (each row has its own
environment); tokenizing and decoding stay on the engine's thread.
"""

from __future__ import annotations

import concurrent.futures
import queue
from typing import Any

import numpy as np

from rljax.rollout.slot_episodes import EpisodeStep


def check_engine(engine: Any) -> None:
  """Refuses an engine without the kept-KV episode run."""
  if not bool(getattr(engine, "keeps_episode_kv", False)):
    raise ValueError(
      f"rollout_multiturn: kv_reuse=True with engine {engine!r:.80}; "
      "expected an engine that keeps episode KV (JaxSampler with "
      "batching='continuous'), or kv_reuse=False (one call per turn)"
    )


class _Host:
  """The driver's side of `slot_episodes.run` (`EpisodeHost`)."""

  def __init__(self, rows, turns, workers: int):
    self.rows, self.turns = rows, turns
    self.rooms = [turns.room(row) for row in rows]
    self.before = [0] * len(rows)  # ids of a row when its step began
    self.pool = concurrent.futures.ThreadPoolExecutor(
      max_workers=workers, thread_name_prefix="tool"
    )
    self.finished: queue.Queue = queue.Queue()

  def stopped(self, r: int, ids: np.ndarray, logp: np.ndarray) -> EpisodeStep:
    row = self.rows[r]
    before = len(row.ids)
    turn = self.turns.take(row, self.rooms[r], ids, logp)
    keep = len(row.ids) - before
    if turn is None:
      return EpisodeStep(keep=keep) if row.done else self._next(r, keep)
    self.before[r] = len(row.ids)
    text, final = turn
    future = self.pool.submit(self.turns.env_step, row, text, final)
    future.add_done_callback(
      lambda f, r=r, final=final: self.finished.put((r, f, final))
    )
    return EpisodeStep(keep=keep, pending=True)

  def poll(self, wait: bool) -> list[tuple[int, EpisodeStep]]:
    out = []
    while True:
      try:
        r, future, final = self.finished.get(block=wait and not out)
      except queue.Empty:
        return out
      row = self.rows[r]
      self.turns.answer(row, future.result(), final)  # a tool's error: here
      if row.done:
        out.append((r, EpisodeStep()))
      else:
        out.append((r, self._next(r, None, row.ids[self.before[r] :])))

  def _next(self, r: int, keep, append=()) -> EpisodeStep:
    """The row's next segment: up to the room its turn and budget leave."""
    self.rooms[r] = self.turns.room(self.rows[r])
    limit = len(self.rows[r].ids) + self.rooms[r]
    return EpisodeStep(keep=keep, append=tuple(append), limit=limit)


def drive(engine, prompts, rows, turns, sampling, config) -> dict[str, Any]:
  """Runs every row's episode in one `engine.run_episodes`; the rows come
  back filled in as the per-turn driver fills them. Returns the engine's
  figures."""
  host = _Host(rows, turns, config.tool_workers)
  try:
    return engine.run_episodes(
      prompts,
      sampling,
      host,
      budget=config.max_response_tokens,
      first_limits=list(host.rooms),
    )
  finally:
    host.pool.shutdown(wait=True, cancel_futures=True)
