"""What a checkpoint keeps of streaming mode's requests, and how a resume
puts them back (`group_stream.GroupStream.saved` / `restore`).

Each request with a group no step has trained is kept as one
`RolloutBatch` of its P groups' rows and a dict of floats (the
checkpoint's `rollout_to_arrays` stores both):

  group state   complete  its rows as they ended (scores are not kept: the
                          resumed trainer scores them again on arrival)
                partial   the rows a cut left in flight: tokens, behaviour
                          log-probs, versions so far, which rows ended
                queued    admitted, not started: no rows
  per group     trained (1: a step took it, or it expired: retired), the
                version of its first prefill, its place in the engine's
                queue (partial and queued groups, in the order the worker
                would have taken them)

A resume re-draws each request's prompts from the oldest one's data
position, refuses prompts that changed, and queues the partial and queued
groups again in the saved order: the worker continues the partial rows
from their tokens (`prompt_feed`'s continuation), as the uninterrupted run
did after the same cut.
"""

from __future__ import annotations

import numpy as np

from rljax.rollout import prompt_feed
from rljax.rollout.base import RolloutBatch

STEP = "stream_step"
ROUND = "stream_round"
SEED = "stream_seed"  # the request's sampling seed (its rows' PRNG keys)
TRAINED = "stream_trained_"  # + group: 1.0 if retired (trained or expired)
STARTED = "stream_version_"  # + group: its first prefill's version, or -1
STATE = "stream_state_"  # + group: COMPLETE, PARTIAL or QUEUED
QUEUE = "stream_queue_"  # + group: place in the engine's queue, or -1
ENDED = "stream_ended_"  # + group _ row: 1.0 if the partial row ended

COMPLETE, PARTIAL, QUEUED = 0.0, 1.0, 2.0


def encode(
  block, n: int, queue_place: dict[int, int]
) -> tuple[RolloutBatch, dict]:
  """A `stream_pick.Block` as (its P groups' rows, their state): group i
  complete (`block.groups`), partial (`block.partial`) or queued;
  `queue_place`: index -> place in the worker's queue."""
  extra = {
    STEP: float(block.key[0]),
    ROUND: float(block.key[1]),
    SEED: float(block.seed),
  }
  tokens, logp, versions, finish = [], [], [], []
  for i in range(len(block.prompts)):
    group, part = block.groups[i], block.partial[i]
    extra[f"{TRAINED}{i}"] = float(block.trained[i] or block.expired[i])
    started = block.started[i]
    extra[f"{STARTED}{i}"] = -1.0 if started is None else float(started)
    extra[f"{QUEUE}{i}"] = float(queue_place.get(i, -1))
    if group is not None:
      extra[f"{STATE}{i}"] = COMPLETE
      tokens += [list(r) for r in group.response_ids]
      logp += [np.asarray(x, np.float32) for x in group.behav_logp]
      versions += (
        [None] * n
        if group.policy_version is None
        else [np.asarray(v, np.int32) for v in group.policy_version]
      )
      finish += list(group.finish_reason)
      continue
    if part is not None:
      extra[f"{STATE}{i}"] = PARTIAL
      tokens += [r.tolist() for r in part.tokens]
      logp += list(part.logp)
      versions += list(part.versions)
      for j, ended in enumerate(part.ended):
        extra[f"{ENDED}{i}_{j}"] = float(ended)
    else:
      extra[f"{STATE}{i}"] = QUEUED
      tokens += [[] for _ in range(n)]
      logp += [np.zeros((0,), np.float32) for _ in range(n)]
      versions += [np.zeros((0,), np.int32) for _ in range(n)]
    finish += ["length"] * n  # a placeholder: these rows have not ended
  rb = RolloutBatch(
    prompt_ids=[list(p) for p in block.prompts],
    response_ids=tokens,
    behav_logp=logp,
    finish_reason=finish,
    n=n,
    # None where a complete group has none (it could not be trained:
    # `staleness.rollout_lag_metrics` refuses it).
    policy_version=None if any(v is None for v in versions) else versions,
  )
  return rb, extra


def decode(rb: RolloutBatch, extra: dict, prompts: list[list[int]]):
  """`encode` inverted against the re-drawn `prompts`: (key, seed or None,
  started, groups, partial, trained, queue places {index: place}).

  Raises:
    ValueError: the prompts are not the ones the saved rows answer.
  """
  step = int(extra[STEP])
  key = (step, int(extra.get(ROUND, 0.0)))
  if [list(p) for p in rb.prompt_ids] != [list(x) for x in prompts]:
    raise ValueError(
      f"resume: the prompts re-drawn for streamed step {step} are not "
      "the ones its saved rollouts answer (the task's data order changed)"
    )
  n, p = rb.n, len(prompts)
  started, groups, partial, places = [], [], [], {}
  for i in range(p):
    v = int(extra[f"{STARTED}{i}"])
    started.append(None if v < 0 else v)
    # Checkpoints without a state per group held complete groups only.
    state = extra.get(f"{STATE}{i}", COMPLETE)
    place = int(extra.get(f"{QUEUE}{i}", -1))
    if place >= 0:
      places[i] = place
    group = rb.select_groups(np.array([i]))
    if state == COMPLETE:
      groups.append(group)
      partial.append(None)
      continue
    groups.append(None)
    if state == PARTIAL:
      partial.append(
        prompt_feed.PartialRows(
          tokens=[np.asarray(r, np.int32) for r in group.response_ids],
          logp=[np.asarray(x, np.float32) for x in group.behav_logp],
          versions=[np.asarray(x, np.int32) for x in group.policy_version],
          ended=np.array(
            [extra[f"{ENDED}{i}_{j}"] > 0 for j in range(n)], bool
          ),
        )
      )
    else:
      partial.append(None)
  trained = np.array([extra[f"{TRAINED}{i}"] > 0 for i in range(p)])
  seed = int(extra[SEED]) if SEED in extra else None
  return key, seed, started, groups, partial, trained, places
