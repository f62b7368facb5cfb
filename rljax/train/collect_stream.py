"""Streaming mode's half of `collect.Collector`: the trainer publishes
each θ into a one-slot `Mailbox` (with a checkpoint's cut request first,
when the step checkpoints), admits the paced requests into the
`group_stream.GroupStream`, and takes each step's groups from it, scored on
arrival by the synchronous loop's own scoring (`Collector._score`).

A multi-turn task's requests run as episodes (`stream_episodes`): the
stream hands `_score_arrivals` each group's episodes, whose rewards are the
scores, and a step's tool metrics are those of the episodes it takes.

`StreamCollecting` is a base class of `collect.Collector`, not a class on
its own: the config, task, actor and stream it reads are the Collector's.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from rljax.rollout.base import RolloutBatch
from rljax.train import actor as actor_lib
from rljax.train import critic_pretrain
from rljax.train import group_stream
from rljax.train import stream_pick
from rljax.train.collected import (
  Collected,
  episode_metrics,
  refuse_all_nonfinite,
)


@dataclasses.dataclass(frozen=True)
class Published:
  """Prepared rollout weights (`Actor.prepare`'s) and their version."""

  version: int
  rparams: Any
  diag: dict


class Mailbox:
  """One slot holding the newest weights the trainer published; the
  streaming worker reads it (at a request's start and between decode
  chunks). The weights are `Actor.prepare`'s fresh buffers, never θ's,
  which the next update donates."""

  def __init__(self):
    self._lock = threading.Lock()
    self._item: Published | None = None

  def publish(self, version: int, rparams: Any, diag: dict) -> None:
    with self._lock:
      if self._item is not None and version < self._item.version:
        raise ValueError(
          f"Mailbox.publish: version {version} after {self._item.version}; "
          "expected versions that never go back"
        )
      self._item = Published(int(version), rparams, diag)

  def latest(self) -> Published | None:
    with self._lock:
      return self._item

  def newer(self, than: int) -> Published | None:
    """The newest weights if their version is above `than`, else None."""
    item = self.latest()
    return item if item is not None and item.version > than else None


class StreamCollecting:
  """The streaming methods of a `Collector` (see the module doc)."""

  def _collect_streamed(self, step: int) -> Collected:
    """Streaming: the step's P groups from the stream (scored as they
    arrived, through `_score`; refills admitted as the stream asks)."""
    cfg = self.cfg
    self._streamed_step = step
    taken = self._stream.take(
      step,
      critic_pretrain.policy_version(cfg, step - 1),
      refill=lambda round_: self._admit(step, round_),
    )
    timing = dict(taken.metrics)
    sampled = timing.pop("reward_sampled")
    refuse_all_nonfinite(step, cfg, sampled, timing["reward_nonfinite"])
    timing["time_rollout"] = timing["time_rollout_wait"]
    timing["rollout_tokens_per_s"] = timing["rollout_tokens"] / max(
      timing["time_rollout"], 1e-9
    )
    return Collected(
      batch=taken.batch,
      valid=taken.valid,
      rewards=taken.rewards,
      components=taken.components,
      kept_groups=taken.kept_groups,
      dropped_groups=int(timing["dynamic_sampling_filtered_groups"]),
      metrics={
        **timing,
        **{
          f"reward_{k}": float(np.mean(v)) for k, v in taken.components.items()
        },
        **(episode_metrics(taken.episodes) if taken.episodes else {}),
      },
    )

  def _score_arrivals(
    self, groups: list[RolloutBatch], examples: list, episodes=None
  ):
    """The stream's scorer: one `_score` call over the groups that arrived
    (its messages name the step being collected); a multi-turn task's
    groups come with their `episodes`, whose rewards are the scores."""
    rb = RolloutBatch.concat(groups)
    raw = None
    if episodes is not None:
      raw = np.concatenate([e.rewards for e in episodes])
    scored, bad = self._score(self._streamed_step, rb, examples, raw)
    n, rows = rb.n, lambda g: slice(g * n, (g + 1) * n)
    return [
      stream_pick.Scored(
        rewards=scored.rewards[rows(g)],
        components={
          k: np.asarray(v)[rows(g)] for k, v in scored.components.items()
        },
        keep=bool(scored.keep[g]),
        nonfinite=int(np.sum(bad // n == g)),
      )
      for g in range(len(groups))
    ]

  def publish(self, params: Any, version: int) -> dict[str, float]:
    """Streaming: prepares θ = `params` (of `version`) for the engine on
    this (the trainer's) thread and makes it the newest weights, which the
    worker takes at its next request or decode chunk; returns the
    preparation's metrics (quantization diagnostics, time_quantize)."""
    rparams, diag = self.actor.prepare(params, version)
    if self._stream is not None and self._checkpoints(self._streamed_step):
      # The checkpoint after this step saves the stream as it is right
      # before the worker takes these weights (asked first, so that the
      # worker cannot take them before it knows).
      self._stream.request_cut(version)
    self.mailbox.publish(version, rparams, diag)
    metrics = dict(diag)
    metrics.pop(actor_lib.VERSION_KEY, None)
    return metrics

  def _checkpoints(self, step: int) -> bool:
    """Whether the trainer checkpoints after `step` (as
    `RunCheckpointer.should_save`: every checkpoint_every steps, and the
    last)."""
    run = self.cfg.run
    return step > 0 and (
      step % run.checkpoint_every == 0
      or step == critic_pretrain.total_steps(self.cfg)
    )

  def stream_through(self, last: int) -> None:
    """Streaming: admits the prompts of every step up to `last` not yet
    admitted (the caller keeps last = the trained step + 1 + max_staleness:
    the pace), drawn here in step order (`group_stream`)."""
    stream = self._group_stream()
    for step in range(stream.admitted_through + 1, last + 1):
      self._admit(step, 0)
    stream.start()  # a resume's restored requests, with nothing admitted

  def _admit(self, step: int, round_: int) -> None:
    """Draws the prompts of request (step, round_) here, on the trainer's
    thread, in the order the synchronous loop draws them, and queues them
    with the seed that loop's round would use."""
    data_state = self.task.state_dict()
    examples = self.task.next_train_batch(self.cfg.rollout.prompts_per_step)
    prompts = [self.task.prompt_ids(e) for e in examples]
    seed = self._sampling(step, round_).seed
    self._group_stream().admit(
      step, examples, prompts, seed, data_state, round_=round_
    )

  def _group_stream(self) -> group_stream.GroupStream:
    if self._stream is None:
      a = self.cfg.advantage
      self._stream = group_stream.GroupStream(
        self.actor,
        self.mailbox,
        lambda key: self._sampling(*key),
        self.cfg.rollout.prompts_per_step,
        self.cfg.run.max_staleness,
        score=self._score_arrivals,
        refill_rounds=a.max_resample_rounds if a.dynamic_sampling else 0,
        episodes=(
          self._stream_episodes
          if getattr(self.task, "multi_turn", False)
          else None
        ),
      )
    return self._stream

  def _stream_episodes(self, key, examples: list, between_turns):
    """The stream worker's episodes of request `key` = (step, round): the
    synchronous loop's sampling for that round, the engine held for the
    whole run (`Actor.with_engine`) while `between_turns` swaps weights."""
    sampling = self._sampling(*key)
    out, _ = self.actor.with_engine(
      "rollout",
      lambda engine: self.task.episodes(
        engine, examples, sampling, between_turns=between_turns
      ),
    )
    return out
