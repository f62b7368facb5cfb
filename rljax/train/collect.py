"""Rollout and rewards of a step, with dynamic sampling (DAPO).

`Collector.collect(step)` generates (or takes the pipelined rollout queued
for the step), scores it, and refills with fresh prompts while too few
groups carry a signal; `select` picks the step's groups over the rounds with
`RolloutBatch.select_groups`. In pipelined mode `Collector.schedule` queues
(sync, generate) on a worker thread so that step k+s's rollout is generated
with θ_k while step k trains.

Streaming mode (`--run.async_mode=streaming`, `group_stream.py`): the
worker runs the prompts of the next max_staleness + 1 steps through one
continuous engine run (`Collector.stream_through` admits them, paced: the
prompts of step j once step j − 1 − k has trained), takes each θ the
trainer publishes (`Collector.publish` into a one-slot `Mailbox`) before a
prefill and between decode chunks, and hands back each group as its n rows
end. A step takes the P finished groups whose deadlines come first (a
token of version v may be trained while θ_old's version ≤ v + k), so it
need not wait for its own request's longest response; no token is more
than k versions behind θ_old. Groups are scored as they arrive (`_score`,
the same scoring and dynamic-sampling filter as the synchronous loop's), and
a step short of kept groups admits its refill requests into the stream.

A task that says `multi_turn` (`tool_task.ToolTask`) is rolled out as
episodes (`task.episodes`: `rollout_multiturn` on the actor's engine, which
holds the synced weights): the rewards are the episodes' (the environment's
verdict on each final answer), not `task.score`'s, and the episodes' tool
metrics join the step's (`episode_metrics`). Dynamic sampling refills with
more episodes. In pipelined mode the worker runs the episodes of the step
ahead; their rewards and tool counters travel with the batch as floats
(`episode_saved`), through the queue and a checkpoint's in-flight
rollouts alike. Streaming mode runs them in the stream (`stream_episodes`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

import numpy as np

from rljax.rewards import finite as finite_lib
from rljax.rollout.base import RolloutBatch, SamplingConfig
from rljax.train import batch as batch_lib
from rljax.train import critic_pretrain
from rljax.train import episode_saved
from rljax.train import group_stream
from rljax.train.collect_stream import Mailbox, StreamCollecting
from rljax.train.collected import (
  Collected,
  episode_metrics,
  model_tokens,
  refuse_all_nonfinite,
)
from rljax.train.config import TrainConfig


@dataclasses.dataclass
class Round:
  """One rollout round: the groups, their scores and which to keep."""

  batch: RolloutBatch
  rewards: np.ndarray  # [P * n]
  components: dict[str, np.ndarray]  # reward components, each [P * n]
  keep: np.ndarray  # bool [P], a group with a useful signal


def select(rounds: list[Round], prompts: int) -> Collected:
  """The first `prompts` kept groups over the rounds, in sampling order,
  padded with dropped groups (masked out: `valid` is False) when too few
  were kept; P' = min(prompts, groups sampled)."""
  every = RolloutBatch.concat([r.batch for r in rounds])
  keep = np.concatenate([np.asarray(r.keep, bool) for r in rounds])
  kept = np.flatnonzero(keep)[:prompts]
  filler = np.flatnonzero(~keep)[: prompts - len(kept)]
  order = np.concatenate([kept, filler]).astype(np.int64)
  n = every.n
  rows = (order[:, None] * n + np.arange(n)).reshape(-1)
  rewards = np.concatenate([r.rewards for r in rounds])[rows]
  components = {
    k: np.concatenate([r.components[k] for r in rounds])[rows]
    for k in rounds[0].components
  }
  return Collected(
    batch=every.select_groups(order),
    valid=np.repeat(np.arange(len(order)) < len(kept), n),
    rewards=rewards.astype(np.float32),
    components=components,
    kept_groups=len(kept),
    dropped_groups=int((~keep).sum()),
  )


def reward_metrics(rollout: Collected, task: Any) -> dict[str, float]:
  """reward_mean: the sequences trained on (dynamic sampling may pad the
  batch with masked-out groups); reward_all_mean: everything sampled;
  prompts_filtered_long: the task's prompts dropped for length so far."""
  rewards, valid = rollout.rewards, rollout.valid
  return {
    "reward_mean": float(
      rewards[valid].mean() if valid.any() else rewards.mean()
    ),
    "reward_all_mean": float(rewards.mean()),
    "accuracy": float((rewards >= 1.0).mean()),
    "prompts_filtered_long": float(getattr(task, "prompts_filtered_long", 0)),
  }


class Collector(StreamCollecting):
  """The step's rollout and rewards from a task and an `actor.Actor`."""

  def __init__(self, cfg: TrainConfig, task: Any, actor: Any, tokenizer: Any):
    self.cfg = cfg
    self.task = task
    self.actor = actor
    self.tokenizer = tokenizer
    self._executor = None
    self._pending: list[concurrent.futures.Future] = []
    # The data position before each pending rollout took its prompts: a
    # checkpoint stores the oldest, so a resume draws those prompts again.
    self._pending_data_states: list[dict] = []
    self.mailbox = Mailbox()  # streaming mode's newest θ
    self._stream: group_stream.GroupStream | None = None
    self._streamed_step = 0  # the step a stream's arrivals are scored for
    # One-step mode's worker: (start, end or None) of each job, and when
    # the trainer last took a rollout (the engine's idle share between).
    self._jobs: list[list[float | None]] = []
    self._last_take = time.perf_counter()

  def _sampling(self, step: int, round_: int) -> SamplingConfig:
    cfg = self.cfg
    return SamplingConfig(
      n=cfg.rollout.group_size,
      temperature=cfg.rollout.temperature,
      top_p=cfg.rollout.top_p,
      max_new_tokens=cfg.rollout.max_new_tokens,
      stop_token_ids=self.task.stop_token_ids,
      seed=batch_lib.seed_for(cfg.run.seed, step, round_),
    )

  def _generate(self, step: int, round_: int, examples: list) -> tuple:
    t0 = time.perf_counter()
    prompts = [self.task.prompt_ids(e) for e in examples]
    rb = self.actor.generate(prompts, self._sampling(step, round_))
    return rb, examples, time.perf_counter() - t0

  def _episodes(self, step: int, round_: int, examples: list) -> tuple:
    """(the episodes of a multi-turn task, seconds): the actor's engine
    runs them with no weight push in between (`Actor.with_engine`; an
    engine that died is restarted and the rollout redone), and every token
    is stamped with the version of the weights that sampled it."""
    t0 = time.perf_counter()
    sampling = self._sampling(step, round_)
    out, version = self.actor.with_engine(
      "rollout", lambda engine: self.task.episodes(engine, examples, sampling)
    )
    out.batch = out.batch.with_policy_version(version)
    return out, time.perf_counter() - t0

  def _decode(self, rb: RolloutBatch) -> list[str]:
    return [
      self.tokenizer.decode(r, skip_special_tokens=True)
      for r in rb.response_ids
    ]

  def collect(self, step: int) -> Collected:
    """Rollout + rewards of `step`, with dynamic-sampling refills."""
    if self._stream is not None:
      return self._collect_streamed(step)
    cfg = self.cfg
    timing = {"time_rollout": 0.0, "time_reward": 0.0}
    rounds, episodes = [], []
    multi_turn = bool(getattr(self.task, "multi_turn", False))
    gen_tokens = sampled = nonfinite = 0
    max_rounds = 1 + (
      cfg.advantage.max_resample_rounds if cfg.advantage.dynamic_sampling else 0
    )
    for round_ in range(max_rounds):
      if round_ == 0 and self._pending:
        t_wait = time.perf_counter()
        rb, examples, t_gen, extra = self._pending.pop(0).result()
        # The trainer's idle time: how long it waited for the queue.
        now = time.perf_counter()
        timing["time_rollout_wait"] = now - t_wait
        timing.update(self._idle_shares(now, now - t_wait))
        self._pending_data_states.pop(0)
        if multi_turn:  # the episodes' rewards and counters rode along
          saved, extra = episode_saved.split(extra)
          episodes.append(episode_saved.decode(rb, saved))
        timing.update(extra)
      elif multi_turn:
        examples = self.task.next_train_batch(cfg.rollout.prompts_per_step)
        out, t_gen = self._episodes(step, round_, examples)
        episodes.append(out)
        rb = out.batch
      else:
        rb, examples, t_gen = self._generate(
          step, round_, self.task.next_train_batch(cfg.rollout.prompts_per_step)
        )
      timing["time_rollout"] += t_gen
      t0 = time.perf_counter()
      if multi_turn:  # scored by the environment as each episode ended
        gen_tokens += model_tokens(rb)
        raw = episodes[-1].rewards
      else:
        gen_tokens += int(rb.response_lengths.sum())
        raw = None
      round_out, bad = self._score(step, rb, examples, raw)
      timing["time_reward"] += time.perf_counter() - t0
      sampled += round_out.rewards.size
      nonfinite += len(bad)
      rounds.append(round_out)
      if (
        sum(int(np.sum(r.keep)) for r in rounds) >= cfg.rollout.prompts_per_step
      ):
        break
    refuse_all_nonfinite(step, cfg, sampled, nonfinite)
    out = select(rounds, cfg.rollout.prompts_per_step)
    timing["rollout_tokens"] = float(gen_tokens)
    timing["rollout_tokens_per_s"] = gen_tokens / max(
      timing["time_rollout"], 1e-9
    )
    timing["dynamic_sampling_kept_groups"] = float(out.kept_groups)
    timing["dynamic_sampling_filtered_groups"] = float(out.dropped_groups)
    timing["dynamic_sampling_rounds"] = float(round_ + 1)
    timing["reward_nonfinite"] = float(nonfinite)
    out.metrics = {
      **timing,
      **{f"reward_{k}": float(np.mean(v)) for k, v in out.components.items()},
      **(episode_metrics(episodes) if episodes else {}),
    }
    return out

  def _score(
    self, step: int, rb: RolloutBatch, examples: list, raw: Any = None
  ) -> tuple[Round, np.ndarray]:
    """(the round, the indices of its non-finite rewards): the task's scores of
    `rb` (or the episodes' `raw` rewards), non-finite ones named and their
    groups dropped (rewards/finite.py), and dynamic sampling's filter
    (`batch.group_keep`). Every path that trains scores through here."""
    cfg = self.cfg
    comps = {}
    if raw is None:
      raw, comps = self.task.score(self._decode(rb), examples, rb.n)
    raw = np.asarray(raw)
    scores, finite_groups, bad = finite_lib.drop_nonfinite_groups(raw, rb.n)
    if len(bad):
      print(
        f"[rljax] step {step}: {finite_lib.describe(raw, bad)} from "
        f"--reward.name={cfg.reward.name!r}; their groups are dropped",
        flush=True,
      )
    scores = scores.astype(np.float32)
    keep = batch_lib.group_keep(cfg, scores) & finite_groups
    return Round(rb, scores, comps, keep), bad

  def schedule(self, step: int, params: Any, version: int) -> None:
    """Queues (sync, generate the rollout of `step`) on the worker thread.

    The rollout weights of θ = `params` (after `version` steps) are prepared
    here, on the trainer's thread, so the worker never reads params that a
    later update donates; the prompts are drawn here too, in step order.
    """
    multi_turn = bool(getattr(self.task, "multi_turn", False))
    if self._executor is None:
      self._executor = concurrent.futures.ThreadPoolExecutor(1)
    self._pending_data_states.append(self.task.state_dict())
    examples = self.task.next_train_batch(self.cfg.rollout.prompts_per_step)
    rparams, diag = self.actor.prepare(params, version)

    span = [None, None]
    self._jobs.append(span)

    def job():
      span[0] = time.perf_counter()
      extra = self.actor.push(rparams, diag)
      if multi_turn:
        out, t_gen = self._episodes(step, 0, examples)
        rb, ex = out.batch, examples
        extra.update(episode_saved.encode(out))
      else:
        rb, ex, t_gen = self._generate(step, 0, examples)
      # Versions count policy updates (value-pretraining steps do not).
      trained_by = critic_pretrain.policy_version(self.cfg, step - 1)
      extra["rollout_staleness"] = float(trained_by - version)
      span[1] = time.perf_counter()
      return rb, ex, t_gen, extra

    self._pending.append(self._executor.submit(job))

  def _idle_shares(self, now: float, waited: float) -> dict[str, float]:
    """One-step mode: the trainer's and the worker's idle shares of the
    time since the last take (the worker is idle when no job runs)."""
    since, span = self._last_take, max(now - self._last_take, 1e-9)
    busy = sum(
      max(0.0, min(end or now, now) - max(start, since))
      for start, end in self._jobs
      if start is not None
    )
    self._jobs = [j for j in self._jobs if j[1] is None or j[1] > now]
    self._last_take = now
    return {
      "trainer_idle_fraction": min(1.0, waited / span),
      "engine_idle_fraction": min(1.0, max(0.0, 1.0 - busy / span)),
    }

  @property
  def pending(self) -> int:
    """How many rollouts are queued or in flight (streaming: admitted
    blocks from the oldest with an untrained group on)."""
    if self._stream is not None:
      return self._stream.pending
    return len(self._pending)

  def data_state(self) -> dict:
    """The data position a resume must start from: in pipelined mode the
    prompts of the in-flight rollouts are already drawn, so the position
    before them."""
    if self._stream is not None:
      oldest = self._stream.data_state()
      if oldest is not None:
        return oldest
    if self._pending_data_states:
      return self._pending_data_states[0]
    return self.task.state_dict()

  def pending_rollouts(self) -> list[tuple[RolloutBatch, dict]]:
    """(rollout, its metrics) of every queued rollout, waiting for each
    (streaming: every open request as the checkpoint's cut left it, rows
    in flight part-way; `group_stream`)."""
    if self._stream is not None:
      return self._stream.saved()
    out = []
    for fut in self._pending:
      rb, _, _, extra = fut.result()
      out.append((rb, extra))
    return out

  def restore_pending(self, rollouts: list[tuple[RolloutBatch, dict]]):
    """Queues rollouts a checkpoint saved, with the prompts they were drawn
    for (the task was restored to the position before them)."""
    if self.cfg.run.async_mode == "streaming":

      def draw():
        data_state = self.task.state_dict()
        examples = self.task.next_train_batch(self.cfg.rollout.prompts_per_step)
        return examples, [self.task.prompt_ids(e) for e in examples], data_state

      self._group_stream().restore(rollouts, draw)
      return
    for rb, extra in rollouts:
      self._pending_data_states.append(self.task.state_dict())
      examples = self.task.next_train_batch(self.cfg.rollout.prompts_per_step)
      fut = concurrent.futures.Future()
      fut.set_result((rb, examples, 0.0, extra))
      self._pending.append(fut)

  def close(self) -> None:
    """Waits for the worker thread and drops the queue (idempotent)."""
    if self._stream is not None:
      self._stream.close()
      self._stream = None
    if self._executor is not None:
      self._executor.shutdown(wait=True)
      self._executor = None
    self._pending = []
    self._pending_data_states = []
