"""A prompt stream for one continuous-batching slot run.

A plain request hands `slot_scheduler.run` all its prompts at once and gets
every row back at the end. A streamed run also polls a `PromptFeed` between
decode chunks for prompts admitted since (other requests' prompts join the
free slots while a long row finishes), and hands each prompt's n rows back
as soon as the last of them ends (`done`), so the caller can train on a
group before the run is over:

  feed.poll(Lp) ──► prompts that fit the run's prompt bucket, in admission
        ▲           order (the first that does not fit waits for a new run)
        │                     │
  between chunks              ▼
        │            slots: prefill, decode chunk ... (slot_scheduler)
        │                     │
  feed.stopped? ◄── a prompt's n rows all ended ──► feed.done(tag, rows)
                    (feed.started(tag, version) at each prefill)

A prompt carries its own seed and index: its rows' PRNG keys are the ones
its own request would give them (`token_sampling.sample_keys`), whatever
else shares the slots.

A cut (engines that support it, `JaxSampler`): at a swap point where
`feed.cut()` is True, before any newer weights are taken, the run ends and
hands every prompt it has not finished back (`feed.handback`), each with
its rows as far as they got (`PartialRows`: tokens, behaviour log-probs,
versions, which rows ended). A prompt admitted with `partial` continues
them: its rows keep those tokens, their KV is recomputed from prompt and
tokens with the weights of the new run, and they sample on from where they
stopped with the keys they would have used (`fold_in(key, t)`). A
checkpoint is such a cut, so a resumed run continues the same rows the
uninterrupted one continues, from the same state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np


@dataclasses.dataclass(frozen=True)
class PartialRows:
  """A prompt's n rows as a cut left them, in sample order: each row's
  tokens, behaviour log-probs and policy versions so far (empty: the row
  had not started), and which rows had ended."""

  tokens: list[np.ndarray]  # int32 each
  logp: list[np.ndarray]  # float32 each
  versions: list[np.ndarray]  # int32 each
  ended: np.ndarray  # bool [n]

  def __post_init__(self):
    n = len(self.tokens)
    if not (len(self.logp) == len(self.versions) == n == len(self.ended)):
      raise ValueError(
        f"PartialRows: {n} token rows, {len(self.logp)} log-prob rows, "
        f"{len(self.versions)} version rows and {len(self.ended)} ended "
        "flags; expected one of each per sample"
      )
    for j in range(n):
      size = len(self.tokens[j])
      if len(self.logp[j]) != size or len(self.versions[j]) != size:
        raise ValueError(
          f"PartialRows row {j}: {size} tokens, {len(self.logp[j])} "
          f"log-probs, {len(self.versions[j])} versions; expected equal"
        )
      if self.ended[j] and not size:
        raise ValueError(f"PartialRows row {j} ended with no token")

  @property
  def started(self) -> np.ndarray:
    """bool [n]: the rows that sampled a token."""
    return np.array([len(t) > 0 for t in self.tokens], bool)


@dataclasses.dataclass(frozen=True)
class StreamPrompt:
  """One admitted prompt: token ids, its index in its request and the
  request's seed (its PRNG keys), the caller's tag for `done`, and, for a
  prompt a cut handed back, its rows so far (`partial`)."""

  ids: list[int]
  index: int
  seed: int
  tag: Any
  partial: PartialRows | None = None


@dataclasses.dataclass(frozen=True)
class DoneGroup:
  """The n rows of one prompt, in sample order: tokens, behaviour
  log-probs, each token's policy version (None without a swap hook), and
  the engine's finish reasons when it reports them (None: inferred from
  the stop ids, `group_stream`)."""

  tag: Any
  prompt_ids: list[int]
  tokens: list[list[int]]
  logp: list[np.ndarray]
  versions: list[np.ndarray] | None
  finish: list[str] | None = None


class PromptFeed(Protocol):
  """What a streamed slot run reads (see the module docstring)."""

  def poll(self, prompt_len: int) -> list[StreamPrompt]:
    """Prompts admitted since the last poll that fit `prompt_len`, in
    admission order ([] when none); never blocks."""

  def started(self, tag: Any, version: int) -> None:
    """A block of the prompt's rows was prefilled by weights `version`."""

  def done(self, group: DoneGroup) -> None:
    """A prompt's rows all ended."""

  def stopped(self) -> bool:
    """True: end the run now (the caller is closing)."""


def cut_requested(feed: Any) -> bool:
  """`feed.cut()` for a feed that can take a cut (has `cut` and
  `handback`); False for the others."""
  cut = getattr(feed, "cut", None)
  return bool(cut is not None and hasattr(feed, "handback") and cut())
