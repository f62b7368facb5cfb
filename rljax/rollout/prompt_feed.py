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
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np


@dataclasses.dataclass(frozen=True)
class StreamPrompt:
  """One admitted prompt: token ids, its index in its request and the
  request's seed (its PRNG keys), and the caller's tag for `done`."""

  ids: list[int]
  index: int
  seed: int
  tag: Any


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
