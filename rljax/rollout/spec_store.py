"""Earlier responses per prompt: the "history" drafts of speculative
decoding (`spec_drafts`), bounded, and kept in a run directory across a
resume.

A prompt recurs every epoch of an RL run; its earlier responses, from a
slightly older policy, predict much of what the policy writes now. The
store keeps the `per_prompt` latest responses of the `prompts` most
recently seen prompts (least recently used dropped), keyed by the prompt's
token ids.

With a `path`, every `add` is appended to a JSON-lines log there and a new
store replays it, so a resumed run drafts from what the run had seen; the
log is rewritten with only what the store holds once it has grown past
twice that. A log line that does not parse (a crash mid-write) is skipped:
drafts are guesses, and a lost one costs speed, never a sample.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Sequence


# The store's log in a run directory (`rollout.factory.make_engine`).
RUN_FILE = "spec_drafts.jsonl"


def _key(prompt: Sequence[int]) -> tuple[int, ...]:
  return tuple(int(t) for t in prompt)


class PromptStore:
  """The latest responses of the latest prompts (module doc)."""

  def __init__(
    self, prompts: int = 4096, per_prompt: int = 8, path: str | None = None
  ):
    for name, value in (("prompts", prompts), ("per_prompt", per_prompt)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"PromptStore: {name}={value!r}; expected an int >= 1")
    self.prompts = prompts
    self.per_prompt = per_prompt
    self.path = path
    self._items: collections.OrderedDict[tuple, collections.deque] = (
      collections.OrderedDict()
    )
    self._logged = 0
    if path is not None and os.path.exists(path):
      self._replay(path)

  def __len__(self) -> int:
    return len(self._items)

  def get(self, prompt: Sequence[int]) -> list[list[int]]:
    """The stored responses to `prompt`, oldest first (may be none)."""
    item = self._items.get(_key(prompt))
    return [] if item is None else [list(r) for r in item]

  def add(
    self, prompt: Sequence[int], responses: Sequence[Sequence[int]]
  ) -> None:
    """Records responses to `prompt` (and logs them with a path)."""
    responses = [[int(t) for t in r] for r in responses if len(r)]
    if not responses:
      return
    self._insert(_key(prompt), responses)
    if self.path is None:
      return
    line = json.dumps({"prompt": list(_key(prompt)), "responses": responses})
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(line + "\n")
    self._logged += 1
    if self._logged > 2 * max(len(self._items), 1) + 64:
      self._compact()

  def _insert(self, key, responses) -> None:
    item = self._items.pop(key, None)
    if item is None:
      item = collections.deque(maxlen=self.per_prompt)
    item.extend(tuple(r) for r in responses)
    self._items[key] = item
    while len(self._items) > self.prompts:
      self._items.popitem(last=False)

  def _replay(self, path: str) -> None:
    with open(path, encoding="utf-8") as f:
      for line in f:
        try:
          record = json.loads(line)
          key = _key(record["prompt"])
          responses = [[int(t) for t in r] for r in record["responses"]]
        except (ValueError, KeyError, TypeError):
          continue
        self._insert(key, responses)
        self._logged += 1
    if self._logged > 2 * max(len(self._items), 1) + 64:
      self._compact()

  def _compact(self) -> None:
    """Rewrites the log with one line per stored prompt."""
    lines = [
      json.dumps({"prompt": list(k), "responses": [list(r) for r in v]})
      for k, v in self._items.items()
    ]
    tmp = self.path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write("".join(line + "\n" for line in lines))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self.path)  # the old log or the new one, never half
    self._logged = len(lines)
