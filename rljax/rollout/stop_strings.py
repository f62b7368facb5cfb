"""Stops by string, not by token: an automaton over token ids.

A turn ends where its text first holds a stop string (a closing tag such as
``</calculator>``), wherever the tokenizer split that string: over several
tokens, or inside one token that also carries text after it. Stopping on
every token that holds the tag's last character (``>``) instead ends many
engine calls on a ``>`` that closes nothing, including the opening tag's
own.

The matcher is a deterministic automaton over characters (Aho-Corasick over
the stop strings: a state is the longest suffix of the text so far that is
a prefix of some stop string), lifted to tokens: for every state ``s`` and
token ``t``,

    next[s, t]  = the state after feeding text(t) from s
    match[s, t] = some stop string ends inside text(t), fed from s

so one table lookup per sampled token says whether the turn is complete,
on the host (``StopMatcher.first_stop``) or in a decode loop on the device
(the two int tables, ``[states, vocab]``; ~14 × 49,152 for one closing tag).

text(t) is the token decoded on its own. That the text of a sequence is
its tokens' texts concatenated holds for byte-level BPE tokenizers (GPT-2,
Llama 3, Qwen, SmolLM2) except inside a multi-byte UTF-8 character split
across tokens, which decodes to U+FFFD on its own and matches no character
of an ASCII stop string; tokenizers that drop a leading space when
decoding one token (SentencePiece) can differ there (stop strings that
begin with a space are refused).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

import numpy as np

from rljax.core import _validation as v

__all__ = ["StopMatcher", "stop_matcher"]


def _automaton(stops: Sequence[str]):
  """(delta: list of dict char -> state, accepting) of the Aho-Corasick
  automaton of ``stops``: the trie with its failure links folded in, so
  that every (state, char) has one next state (a char not listed: 0)."""
  trie: list[dict[str, int]] = [{}]
  accepting = [False]
  for stop in stops:
    state = 0
    for ch in stop:
      if ch not in trie[state]:
        trie.append({})
        accepting.append(False)
        trie[state][ch] = len(trie) - 1
      state = trie[state][ch]
    accepting[state] = True
  fail = [0] * len(trie)
  delta: list[dict[str, int]] = [dict(trie[0])] + [{} for _ in trie[1:]]
  queue = collections.deque(trie[0].values())
  while queue:  # breadth first: a state's failure is shallower, done
    state = queue.popleft()
    accepting[state] = accepting[state] or accepting[fail[state]]
    delta[state] = {**delta[fail[state]], **trie[state]}
    for ch, child in trie[state].items():
      fail[child] = delta[fail[state]].get(ch, 0)
      queue.append(child)
  return delta, accepting


@dataclasses.dataclass(frozen=True)
class StopMatcher:
  """The token-level automaton of ``stop_sequences`` (see the module doc).

  Attributes:
    stop_sequences: the strings that end a turn.
    next_state: int32 [states, vocab].
    match: bool [states, vocab], a stop string ends inside the token.
  """

  stop_sequences: tuple[str, ...]
  next_state: np.ndarray
  match: np.ndarray

  @property
  def num_states(self) -> int:
    return int(self.next_state.shape[0])

  def step(self, state: int, token: int) -> tuple[int, bool]:
    return int(self.next_state[state, token]), bool(self.match[state, token])

  def first_stop(self, ids: Sequence[int], state: int = 0) -> int | None:
    """The count of ids up to and including the one that completes a stop
    string (None if none does), fed from ``state``."""
    for k, token in enumerate(ids):
      if self.match[state, token]:
        return k + 1
      state = int(self.next_state[state, token])
    return None

  def state_after(self, ids: Sequence[int], state: int = 0) -> int:
    for token in ids:
      state = int(self.next_state[state, token])
    return state


def build_matcher(
  token_texts: Sequence[str], stop_sequences: Sequence[str]
) -> StopMatcher:
  """The matcher of ``stop_sequences`` over a vocabulary whose token ``i``
  reads ``token_texts[i]``."""
  stops = tuple(stop_sequences)
  if not stops or any(
    not isinstance(s, str) or not s or s[0].isspace() for s in stops
  ):
    raise ValueError(
      v.field_message(
        "stop_sequences",
        stop_sequences,
        "a non-empty list of non-empty strings that do not begin with "
        "whitespace",
      )
    )
  goto, accepting = _automaton(stops)
  states, vocab = len(goto), len(token_texts)
  alphabet = set("".join(stops))
  next_state = np.zeros((states, vocab), np.int32)
  match = np.zeros((states, vocab), bool)
  for t, text in enumerate(token_texts):
    if not any(ch in alphabet for ch in text):
      continue  # every state goes back to the root, matching nothing
    for s in range(states):
      state, hit = s, False
      for ch in text:
        state = goto[state].get(ch, 0)
        hit = hit or accepting[state]
      next_state[s, t], match[s, t] = state, hit
  return StopMatcher(stops, next_state, match)


# (id(tokenizer), stops) -> (the tokenizer, kept alive so that its id is
# not reused, and its matcher).
_CACHE: dict[tuple[int, tuple[str, ...]], tuple[Any, StopMatcher]] = {}


def stop_matcher(tokenizer, stop_sequences: Sequence[str]) -> StopMatcher:
  """``build_matcher`` over ``tokenizer``'s vocabulary, each token decoded
  on its own (cached per tokenizer and stop strings)."""
  key = (id(tokenizer), tuple(stop_sequences))
  if key not in _CACHE:
    single = [[i] for i in range(len(tokenizer))]
    batch_decode = getattr(tokenizer, "batch_decode", None)
    texts = (
      batch_decode(single)
      if batch_decode is not None
      else [tokenizer.decode(ids) for ids in single]
    )
    _CACHE[key] = (tokenizer, build_matcher(texts, stop_sequences))
  return _CACHE[key][1]
