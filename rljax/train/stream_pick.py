"""The bookkeeping of streaming mode's requests and which groups a step
takes (`group_stream.GroupStream` runs them): a request's `Block` of
prompts and what became of each group (started, ended, scored, trained,
expired), the `Scored` rewards of an arriving group, the `Taken` batch, and
the rules, pure functions of the requests: `choose` (earliest deadline
first, with the wait rule), `short_of` (when a step must refill),
`expire` (kept groups past their deadline), and `decide`, which combines
them into the step's next move (take, refill or wait).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rljax.rollout import prompt_feed
from rljax.rollout.base import RolloutBatch, SamplingConfig

Key = tuple[int, int]  # (step, round): a request


@dataclasses.dataclass(frozen=True)
class Scored:
  """One group's rewards as its arrival scored them."""

  rewards: np.ndarray  # float32 [n], non-finite ones replaced by 0
  components: dict[str, np.ndarray]  # each [n]
  keep: bool  # a signal (dynamic sampling) and every reward finite
  nonfinite: int  # samples whose reward was NaN or inf


@dataclasses.dataclass
class Block:
  """The prompts one request admitted and what became of them."""

  key: Key
  examples: list
  prompts: list[list[int]]
  seed: int
  data_state: dict  # the task's position before these prompts were drawn
  started: list[int | None]  # each group's first prefill version
  groups: list[RolloutBatch | None]  # each group's rows once all ended
  trained: np.ndarray  # bool [P]: in a step's batch (filler included)
  scores: list[Scored | None] = dataclasses.field(default_factory=list)
  expired: np.ndarray | None = None  # bool [P]: kept, missed its deadline
  # Each group's rows as the last cut (or a restore) left them in flight.
  partial: list[prompt_feed.PartialRows | None] = dataclasses.field(
    default_factory=list
  )
  # A multi-turn task's complete groups: each one's episodes (rows,
  # rewards, tool counters; `stream_episodes`).
  episodes: list = dataclasses.field(default_factory=list)

  def __post_init__(self):
    p = len(self.prompts)
    self.scores = self.scores or [None] * p
    self.partial = self.partial or [None] * p
    self.episodes = self.episodes or [None] * p
    if self.expired is None:
      self.expired = np.zeros((p,), bool)

  def filtered(self, i: int) -> bool:
    return self.scores[i] is not None and not self.scores[i].keep

  def retired(self, i: int) -> bool:
    """Trained, filtered on arrival, or expired: no step will train it."""
    return bool(self.trained[i] or self.expired[i] or self.filtered(i))

  @property
  def open(self) -> bool:
    """Some group a step may still train."""
    return not all(self.retired(i) for i in range(len(self.prompts)))


@dataclasses.dataclass
class Taken:
  """A step's batch from the stream: P groups, the kept ones first, then
  filler (filtered groups, masked out: `valid` False) when the refills ran
  out; rewards and components are None when the stream has no scorer."""

  batch: RolloutBatch
  examples: list
  valid: np.ndarray  # bool [P' * n]
  rewards: np.ndarray | None  # float32 [P' * n]
  components: dict[str, np.ndarray] | None  # each [P' * n]
  kept_groups: int
  metrics: dict[str, float]
  episodes: list | None = None  # a multi-turn task's, one per group


def choose(
  candidates: list[tuple[int, Key, int, bool]], prompts: int
) -> list[tuple[Key, int]] | None:
  """The step's groups by earliest deadline first, or None to wait.

  Args:
    candidates: (slack, request key, index, complete) of every kept or not
      yet scored group already prefilled, untrained and within its
      deadline; slack m = v + k − V ≥ 0 is how many steps after this one
      the group may still be trained (v: its oldest token's version, V:
      θ_old's, k: max_staleness).
    prompts: P, the groups a step takes.

  Returns the (request key, index) of P complete groups, or None when
  fewer are complete, or when a group in flight with slack ≤ h could still
  be needed: the next h steps take h·P groups, so this one must take at
  least (groups with slack ≤ h) − h·P of them. When no group in flight
  could make up a shortfall, the earliest P are returned anyway.
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


def short_of(candidates: list, queued: int, prompts: int) -> bool:
  """True when the kept groups, those in flight and the queued prompts
  together cannot make a step's P groups even if every one is kept: a
  refill is due now, before the rest arrive (a group scored later can only
  lower the count, so the synchronous loop would refill too)."""
  return len(candidates) + queued < prompts


def group_batch(
  group: prompt_feed.DoneGroup, sampling: SamplingConfig
) -> RolloutBatch:
  """One prompt's n rows as a `RolloutBatch` (finish reasons the engine's
  own, or as the JAX engine gives them: "stop" when the last token is a
  stop id)."""
  stop = set(sampling.stop_token_ids or ())
  return RolloutBatch(
    prompt_ids=[list(group.prompt_ids)],
    response_ids=group.tokens,
    behav_logp=group.logp,
    finish_reason=list(group.finish)
    if group.finish is not None
    else [
      "stop" if ids and ids[-1] in stop else "length" for ids in group.tokens
    ],
    n=len(group.tokens),
    policy_version=group.versions,
  )


def expire(blocks, version: int, k: int) -> int:
  """Retires the kept groups that ended past their deadline (v + k < V,
  V = `version`); returns how many."""
  count = 0
  for block in blocks:
    for i, started in enumerate(block.started):
      if (
        started is not None
        and started + k < version
        and block.groups[i] is not None
        and not block.retired(i)
      ):
        block.expired[i] = True
        count += 1
  return count


def candidates(
  blocks, version: int, k: int
) -> list[tuple[int, Key, int, bool]]:
  """`choose`'s candidates: (slack, key, index, complete) of every group
  prefilled, not retired and within its deadline (slack ≥ 0)."""
  out = []
  for block in blocks:
    for i, started in enumerate(block.started):
      if started is None or block.retired(i):
        continue
      slack = started + k - version
      if slack >= 0:
        out.append((slack, block.key, i, block.groups[i] is not None))
  return out


def decide(
  blocks: list[Block],
  step: int,
  version: int,
  k: int,
  prompts: int,
  refill_left: bool,
):
  """What step `step` (θ_old of `version`) does next, every group that
  ended being scored: ("take", kept, filler) with the (key, index) of the
  groups to train, ("refill", None, None) to admit its next refill round,
  or ("wait", None, None) for groups in flight or still to start (admitted
  prompts the worker has not prefilled yet, queued or being prefilled).

  Take P kept groups as soon as `choose` allows. Refill when `short_of`
  and a round is left. With no round left, wait for what this step's
  requests (and older ones) still have in flight or to start, then take
  every kept group and pad with filtered groups in request order (masked
  out by the caller), as the synchronous loop's `select` pads.
  """
  cands = candidates(blocks, version, k)
  queued = [b.key for b in blocks for v in b.started if v is None]
  picked = choose(cands, prompts)
  if picked is not None:
    return "take", picked, []
  if not short_of(cands, len(queued), prompts):
    return "wait", None, None
  if refill_left:
    return "refill", None, None
  mine = any(key[0] <= step for _, key, _, done in cands if not done)
  if mine or any(key[0] <= step for key in queued):
    return "wait", None, None
  kept = [(c[1], c[2]) for c in cands if c[3]]
  filler = sorted(
    (b.key, i)
    for b in blocks
    for i in range(len(b.prompts))
    if b.filtered(i) and not b.trained[i]
  )[: prompts - len(kept)]
  if kept or filler:
    return "take", kept, filler
  if not cands and not queued:
    raise RuntimeError(
      f"streamed step {step}: no group is left to train (every one was "
      "trained, filtered or expired, and none is in flight)"
    )
  return "wait", None, None
