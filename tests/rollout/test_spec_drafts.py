"""Suffix-match drafts (`spec_drafts`) and the per-prompt store of earlier
responses (`spec_store`): what a draft is, against a brute-force matcher;
sources; bounds; a store that survives a restart; the host cost per row."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.rollout import spec_drafts
from rljax.rollout import spec_store

_SETTINGS = spec_drafts.DraftSettings(min_ngram=2, max_ngram=4, max_len=6)


def _reference(index: spec_drafts.GroupIndex, r: int):
  """The matcher by brute force: every indexed n-gram occurrence (the last
  two per sequence, as the index keeps), the longest backward match
  (capped), then self > sibling > history, then the latest end, then the
  latest sequence."""
  cfg = index.settings
  own = index.seqs[index.row_seq[r]]
  rank = {"self": 2, "sibling": 1, "history": 0}
  prompt_len = len(index.prompt)
  for n in range(min(cfg.max_ngram, len(own)), cfg.min_ngram - 1, -1):
    key = own[len(own) - n :]
    best = None
    for s, seq in enumerate(index.seqs):
      first_end = 0 if index.owner[s] == -1 else prompt_len + 1
      ends = [
        e
        for e in range(max(n, first_end), len(seq) + 1)
        if seq[e - n : e] == key
      ][-2:]
      for e in ends:
        if e >= len(seq) or (s == index.row_seq[r] and e == len(own)):
          continue
        m = n
        while (
          m < spec_drafts._MATCH_CAP  # pylint: disable=protected-access
          and e - m - 1 >= 0
          and len(own) - m - 1 >= 0
          and seq[e - m - 1] == own[len(own) - m - 1]
        ):
          m += 1
        source = index._source(s, r)  # pylint: disable=protected-access
        cand = ((m, rank[source], e, s), seq[e : e + cfg.max_len], source)
        if best is None or cand[0] > best[0]:
          best = cand
    if best is not None:
      return best[1], best[2]
  return None


tokens_st = st.lists(st.integers(0, 3), min_size=0, max_size=30)


class TestGroupIndex:
  @settings(max_examples=200, deadline=None)
  @given(
    prompt=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    responses=st.lists(tokens_st, min_size=1, max_size=4),
    history=st.lists(tokens_st, max_size=2),
    data=st.data(),
  )
  def test_drafts_are_the_brute_force_matchers(
    self, prompt, responses, history, data
  ):
    """Over a 4-token alphabet (many matches, many ties), grown in random
    pieces: each row's draft is the brute-force matcher's."""
    index = spec_drafts.GroupIndex(prompt, len(responses), _SETTINGS, history)
    grown = [0] * len(responses)
    for _ in range(3):
      for r, resp in enumerate(responses):
        upto = data.draw(st.integers(grown[r], len(resp)))
        index.sync(r, resp[:upto])
        grown[r] = upto
      for r in range(len(responses)):
        got = index.propose(r)
        want = _reference(index, r)
        if want is None:
          assert got is None
        else:
          assert got is not None
          assert got.tokens.tolist() == want[0]
          assert got.source == want[1]

  @settings(max_examples=100, deadline=None)
  @given(
    prompt=st.lists(st.integers(0, 5), min_size=1, max_size=10),
    responses=st.lists(tokens_st, min_size=1, max_size=3),
  )
  def test_a_draft_follows_an_occurrence_of_the_rows_suffix(
    self, prompt, responses
  ):
    index = spec_drafts.GroupIndex(prompt, len(responses), _SETTINGS)
    for r, resp in enumerate(responses):
      index.sync(r, resp)
    for r in range(len(responses)):
      own = prompt + responses[r]
      draft = index.propose(r)
      if draft is None:
        continue
      n = min(draft.match, len(own))
      assert n >= _SETTINGS.min_ngram
      assert 1 <= draft.tokens.size <= _SETTINGS.max_len
      texts = [prompt] + [prompt + x for x in responses]
      found = any(
        seq[e - n : e] == own[len(own) - n :]
        and seq[e : e + draft.tokens.size] == draft.tokens.tolist()
        for seq in texts
        for e in range(n, len(seq))
      )
      assert found

  def test_sources(self):
    prompt = [1, 2, 3, 4]
    index = spec_drafts.GroupIndex(
      prompt, 2, _SETTINGS, history=[[9, 8, 7, 6, 5]]
    )
    # A row that restates the prompt drafts its continuation: self.
    index.sync(0, [1, 2])
    assert index.propose(0).tokens.tolist()[:2] == [3, 4]
    assert index.propose(0).source == "self"
    # A row that starts as the earlier response drafts the rest of it.
    index.sync(1, [9, 8])
    draft = index.propose(1)
    assert (draft.source, draft.tokens.tolist()) == ("history", [7, 6, 5])
    # Once its sibling wrote the same words on, the sibling's longer
    # match wins.
    index.sync(0, [1, 2, 7, 9, 8, 7, 6, 0, 0])
    index.sync(1, [9, 8, 7, 9, 8, 7, 6])
    draft = index.propose(1)
    assert draft.source == "sibling"
    assert draft.tokens.tolist() == [0, 0]

  def test_no_match_no_draft(self):
    index = spec_drafts.GroupIndex([1, 2, 3], 1, _SETTINGS)
    index.sync(0, [7, 8])
    assert index.propose(0) is None

  def test_bad_settings_are_named(self):
    with pytest.raises(ValueError, match="min_ngram=3, max_ngram=2"):
      spec_drafts.DraftSettings(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError, match="max_len=0"):
      spec_drafts.DraftSettings(max_len=0)

  def test_host_cost_per_row_and_step(self):
    """What a chunk pays on the host per row: one token appended and one
    draft proposed, on a group of 8 rows of 512 tokens of real-looking text
    (a 2,000-word vocabulary with repeats). Printed, not asserted (the
    machine is shared): tens of µs against a decode step's tens of ms."""
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2000, 400)
    prompt = rng.integers(0, 2000, 120).tolist()
    index = spec_drafts.GroupIndex(prompt, 8, spec_drafts.DraftSettings())
    texts = [
      [int(words[(i * 7 + j * 13 + (j // 50)) % 400]) for j in range(512)]
      for i in range(8)
    ]
    began = time.perf_counter()
    for t in range(512):
      for r in range(8):
        index.extend(r, texts[r][t : t + 1])
        index.propose(r)
    per_row = (time.perf_counter() - began) / (512 * 8)
    print(f"spec_drafts: {per_row * 1e6:.1f} µs per row per step")
    assert per_row > 0


class TestPromptStore:
  def test_bounds_keep_the_latest(self):
    store = spec_store.PromptStore(prompts=2, per_prompt=2)
    store.add([1], [[1, 1], [1, 2], [1, 3]])
    assert store.get([1]) == [[1, 2], [1, 3]]
    store.add([2], [[2]])
    store.get([1])  # a read does not refresh: the least recently added goes
    store.add([3], [[3]])
    assert len(store) == 2 and store.get([1]) == [] and store.get([3]) == [[3]]
    store.add([2], [[]])  # empty responses are not kept
    assert store.get([2]) == [[2]]

  def test_survives_a_restart_and_a_torn_line(self, tmp_path):
    path = str(tmp_path / "drafts.jsonl")
    store = spec_store.PromptStore(prompts=8, per_prompt=2, path=path)
    store.add([5, 6], [[1, 2], [3]])
    store.add([7], [[4]])
    with open(path, "a") as f:
      f.write('{"prompt": [9], "respo')  # killed mid-write
    again = spec_store.PromptStore(prompts=8, per_prompt=2, path=path)
    assert again.get([5, 6]) == [[1, 2], [3]]
    assert again.get([7]) == [[4]]
    assert again.get([9]) == []

  def test_log_is_compacted_to_what_is_kept(self, tmp_path):
    path = str(tmp_path / "drafts.jsonl")
    store = spec_store.PromptStore(prompts=2, per_prompt=1, path=path)
    for i in range(200):
      store.add([i % 3], [[i]])
    with open(path) as f:
      lines = [json.loads(x) for x in f]
    assert len(lines) < 100
    again = spec_store.PromptStore(prompts=2, per_prompt=1, path=path)
    assert again.get([199 % 3]) == [[199]]
    assert again.get([198 % 3]) == [[198]]

  def test_bad_bounds_are_named(self):
    with pytest.raises(ValueError, match="per_prompt=0"):
      spec_store.PromptStore(per_prompt=0)
