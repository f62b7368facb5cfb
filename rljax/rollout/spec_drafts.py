"""Drafts that cost nothing on the accelerator: suffix matches over the
text a prompt group has already produced.

A group is one prompt's rows (its n samples). Its index (`GroupIndex`)
holds token sequences of three sources:

  self     the prompt and each row's own response: a row repeats itself
           (a number of the question, a formula it wrote, a closing line);
  sibling  the other rows' responses so far: GRPO samples of one prompt
           share most of their text;
  history  earlier responses to the same prompt (`spec_store`): a prompt
           recurs every epoch, answered by a slightly older policy.

A draft for a row is the continuation of the longest match of the row's
last tokens: for n from `max_ngram` down to `min_ngram`, the n-grams equal
to the row's last n tokens are looked up (a dict from n-gram to its last
few occurrences per sequence); the occurrence whose match extends furthest
back wins (ties: self, then sibling, then history; then the latest end;
then the latest sequence),
and the tokens that followed it there are the draft (up to `max_len`).
This is prompt-lookup / suffix decoding (Saxena, 2023, "Prompt Lookup
Decoding"; Oliaro et al., 2024, "SuffixDecoding") over the group's text.

Everything is host-side Python on small ints: an index update is a few
dict writes per new token, a lookup a few dict reads and short
comparisons (tests/rollout/test_spec_drafts.py measures µs per row).
Drafts only set how many tokens a verify step may emit, never which
(`spec_accept`), so any draft is safe; a bad one costs a wasted position.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

SOURCES = ("self", "sibling", "history")
# Occurrences kept per (n-gram, sequence): the latest few suffice (recent
# text predicts best; a bound keeps a lookup O(1)).
_PER_SEQUENCE = 2
# How far back a candidate's match is extended to rank it.
_MATCH_CAP = 24


@dataclasses.dataclass(frozen=True)
class DraftSettings:
  """The matcher's knobs: n-gram lengths tried, longest draft."""

  min_ngram: int = 2
  max_ngram: int = 4
  max_len: int = 32

  def __post_init__(self):
    if not 1 <= self.min_ngram <= self.max_ngram:
      raise ValueError(
        f"DraftSettings: min_ngram={self.min_ngram}, max_ngram="
        f"{self.max_ngram}; expected 1 <= min_ngram <= max_ngram"
      )
    if self.max_len < 1:
      raise ValueError(f"DraftSettings: max_len={self.max_len}; expected >= 1")


@dataclasses.dataclass
class Draft:
  """A proposed continuation, where it came from and how long its match."""

  tokens: np.ndarray
  source: str
  match: int


class GroupIndex:
  """The n-gram index of one prompt group (module doc).

  Sequences: the prompt (source "self" for every row), each row's
  prompt + response (its own "self", a sibling's "sibling"), and earlier
  responses (prompt + response, "history"). Rows grow with `extend`.
  """

  def __init__(
    self,
    prompt: Sequence[int],
    rows: int,
    settings: DraftSettings = DraftSettings(),
    history: Sequence[Sequence[int]] = (),
  ):
    self.settings = settings
    self.prompt = [int(t) for t in prompt]
    self.seqs: list[list[int]] = []
    self.owner: list[int] = []  # -1 prompt, -2 history, else the row
    # n-gram -> {sequence: [end positions, latest last]}
    self.table: dict[tuple[int, ...], dict[int, list[int]]] = {}
    self._add(list(self.prompt), -1, 0)
    for response in history:
      self._add(self.prompt + [int(t) for t in response], -2, len(self.prompt))
    self.row_seq = []
    for r in range(rows):
      self.row_seq.append(len(self.seqs))
      self._add(list(self.prompt), r, len(self.prompt))

  def _add(self, tokens: list[int], owner: int, first_end: int) -> None:
    self.seqs.append([])
    self.owner.append(owner)
    self._append(len(self.seqs) - 1, tokens, first_end)

  def _append(self, s: int, tokens: Sequence[int], first_end: int = 0):
    """Appends tokens to sequence s, indexing every n-gram that ends at a
    position >= first_end (rows do not index the prompt again)."""
    seq = self.seqs[s]
    lo, hi = self.settings.min_ngram, self.settings.max_ngram
    for tok in tokens:
      seq.append(int(tok))
      end = len(seq)
      if end <= first_end:
        continue
      for n in range(lo, min(hi, end) + 1):
        key = tuple(seq[end - n : end])
        ends = self.table.setdefault(key, {}).setdefault(s, [])
        ends.append(end)
        if len(ends) > _PER_SEQUENCE:
          del ends[0]

  def row_length(self, r: int) -> int:
    """Response tokens of row r the index holds."""
    return len(self.seqs[self.row_seq[r]]) - len(self.prompt)

  def extend(self, r: int, tokens: Sequence[int]) -> None:
    """Row r's new response tokens."""
    self._append(self.row_seq[r], tokens)

  def sync(self, r: int, response: Sequence[int]) -> None:
    """Brings row r up to `response` (its full response so far)."""
    have = self.row_length(r)
    if len(response) > have:
      self.extend(r, response[have:])

  def _source(self, s: int, r: int) -> str:
    owner = self.owner[s]
    if owner == -2:
      return "history"
    return "self" if owner in (-1, r) else "sibling"

  def propose(self, r: int, max_len: int | None = None) -> Draft | None:
    """The draft for row r (the module doc), or None without a match."""
    cap = self.settings.max_len if max_len is None else max_len
    own = self.seqs[self.row_seq[r]]
    size = len(own)
    rank = {"self": 2, "sibling": 1, "history": 0}
    for n in range(min(self.settings.max_ngram, size), 0, -1):
      if n < self.settings.min_ngram:
        return None
      hits = self.table.get(tuple(own[size - n :]))
      if not hits:
        continue
      best, best_key = None, None
      for s, ends in hits.items():
        seq = self.seqs[s]
        for end in ends:
          if end >= len(seq) or (s == self.row_seq[r] and end == size):
            continue  # nothing follows it (or it is the row's own tail)
          match = _match_length(seq, end, own, size, n)
          source = self._source(s, r)
          key = (match, rank[source], end, s)
          if best_key is None or key > best_key:
            best, best_key = (s, end, source), key
      if best is not None:
        s, end, source = best
        tokens = np.asarray(self.seqs[s][end : end + cap], np.int32)
        return Draft(tokens, source, best_key[0])
    return None


def _match_length(seq, end, own, size, known) -> int:
  """How far seq[:end] and own[:size] agree backward from their ends (at
  least `known`, at most `_MATCH_CAP`): a binary search over slice
  comparisons, which run in C, instead of a token-by-token loop."""
  lo, hi = known, min(_MATCH_CAP, end, size)
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if seq[end - mid : end] == own[size - mid : size]:
      lo = mid
    else:
      hi = mid - 1
  return lo
