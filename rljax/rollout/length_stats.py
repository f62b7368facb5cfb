"""Per-prompt response lengths seen so far, for longest-first admission.

An RL run draws the same prompts again epoch after epoch, and a prompt's
responses tend to be about as long as they were last time. The trainer
keeps a `ResponseLengths` and hands the continuous JAX engine
`expected(prompts)` with each request (`JaxSampler.generate`'s
`expected_lengths`): rows expected to be long are admitted first, so they
do not start last and decode alone at the end of the rollout. Samples do
not depend on it (a row's PRNG key is its own), only how soon the batch
ends.

  expected length of prompt p = mean of the last `window` rollouts' mean
                                response length of p (None: never seen)

A plain mean over a short window follows the policy as its answers grow or
shrink during training. The store keeps at most `capacity` prompts (the
least recently seen go first), and is not checkpointed: after a resume it
fills again in one epoch, and until then the order is the request's.
"""

from __future__ import annotations

import collections
from typing import Hashable, Sequence


class ResponseLengths:
  """Running per-prompt mean response length (see the module doc)."""

  def __init__(self, window: int = 4, capacity: int = 100_000):
    if window < 1 or capacity < 1:
      raise ValueError(
        f"ResponseLengths: window={window}, capacity={capacity}; expected "
        "both >= 1"
      )
    self.window = window
    self.capacity = capacity
    self._means: collections.OrderedDict[Hashable, collections.deque] = (
      collections.OrderedDict()
    )

  def __len__(self) -> int:
    return len(self._means)

  @staticmethod
  def key(prompt: Sequence[int]) -> Hashable:
    return tuple(int(t) for t in prompt)

  def expected(self, prompts: Sequence[Sequence[int]]) -> list[float | None]:
    """Each prompt's expected response length, None where never seen."""
    out = []
    for prompt in prompts:
      means = self._means.get(self.key(prompt))
      out.append(None if not means else sum(means) / len(means))
    return out

  def update(
    self, prompts: Sequence[Sequence[int]], lengths: Sequence[Sequence[int]]
  ) -> None:
    """Notes one rollout: `lengths[i]` are prompt i's responses' lengths."""
    if len(prompts) != len(lengths):
      raise ValueError(
        f"ResponseLengths.update: {len(prompts)} prompts, {len(lengths)} "
        "length lists; expected one list per prompt"
      )
    for prompt, group in zip(prompts, lengths):
      if not len(group):
        continue
      key = self.key(prompt)
      means = self._means.pop(key, None) or collections.deque(
        maxlen=self.window
      )
      means.append(sum(group) / len(group))
      self._means[key] = means
      while len(self._means) > self.capacity:
        self._means.popitem(last=False)
