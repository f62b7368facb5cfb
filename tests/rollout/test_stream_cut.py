"""A cut of a streamed slot run (`prompt_feed`, `slot_resume`): at a swap
point the run hands every unfinished prompt back with its rows so far, and
a later run continues them where they stopped, with their KV recomputed by
its weights. That is what the swap itself does under
inflight_kv="recompute", so a cut followed by a run on the new weights
samples what the run that took them at that point samples."""

from __future__ import annotations

import numpy as np
import pytest

from rljax.rollout import base, prompt_feed
from tests.rollout.test_inflight_updates import MORE_PROMPTS, _engine, _sharp

SAMPLING = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=24, seed=7)


class Feed:
  """Every prompt at the first poll (then those a test adds); a cut at
  the `cut_at`-th swap point (from 0), the hand-back kept."""

  def __init__(self, prompts, cut_at=None):
    self.queue = list(prompts)
    self.groups, self.starts = {}, {}
    self.cut_at, self.swap_points, self.back = cut_at, 0, None

  def poll(self, prompt_len):
    out = [p for p in self.queue if len(p.ids) <= prompt_len]
    self.queue = [p for p in self.queue if len(p.ids) > prompt_len]
    return out

  def started(self, tag, version):
    self.starts.setdefault(tag, version)

  def done(self, group):
    self.groups[group.tag] = group

  def stopped(self):
    return False

  def cut(self):
    self.swap_points += 1
    return self.cut_at is not None and self.swap_points - 1 == self.cut_at

  def handback(self, prompts):
    self.back = prompts


class Pushes:
  """The weight hook: `update` at its `at`-th poll (from 0)."""

  def __init__(self, at, update):
    self.at, self.update, self.polls = at, update, 0

  def __call__(self):
    self.polls += 1
    return self.update if self.polls - 1 == self.at else None


def _prompts():
  return [
    prompt_feed.StreamPrompt(p, i, 7, i) for i, p in enumerate(MORE_PROMPTS)
  ]


@pytest.fixture(scope="module")
def weights():
  return _sharp(0), _sharp(1)


@pytest.mark.parametrize("at, pages", [(1, 0), (2, 0), (1, 4)])
def test_a_cut_then_a_run_on_new_weights_is_the_recompute_swap(
  weights, at, pages
):
  """`pages`: the rows' own KV in 4-slot pages (`kv_pages`)."""
  w0, w1 = weights
  # Reference: the run takes w1 at its `at`-th swap point and recomputes
  # the KV of the rows in flight.
  ref_engine = _engine(w0, inflight_kv="recompute", kv_page_size=pages)
  ref = Feed(_prompts())
  ref_engine.generate_stream(
    ref, MORE_PROMPTS[:2], SAMPLING,
    weight_updates=Pushes(at, (w1, 1)), version=0,
  )  # fmt: skip
  assert sorted(ref.groups) == list(range(len(MORE_PROMPTS)))

  # The same run cut at that point (no newer weights taken), then a run
  # of w1 on what it handed back.
  engine = _engine(w0, inflight_kv="keep", kv_page_size=pages)
  first = Feed(_prompts(), cut_at=at)
  stats = engine.generate_stream(
    first, MORE_PROMPTS[:2], SAMPLING, weight_updates=lambda: None, version=0
  )
  assert stats["cuts"] == 1 and first.back
  partial = [p for p in first.back if p.partial is not None]
  assert partial, "nothing was in flight at the cut"
  for p in partial:  # the rows so far are the reference's first tokens
    for j, ids in enumerate(p.partial.tokens):
      want = ref.groups[p.tag].tokens[j]
      assert ids.tolist() == want[: ids.size]
      if p.partial.ended[j]:
        assert ids.tolist() == want
  engine.update_weights(w1)
  second = Feed(first.back)
  stats = engine.generate_stream(
    second, MORE_PROMPTS[:2], SAMPLING, weight_updates=lambda: None, version=1
  )
  assert stats["continued_rows"] >= 1
  got = {**first.groups, **second.groups}
  assert sorted(got) == sorted(ref.groups)
  for tag, want in ref.groups.items():
    assert got[tag].tokens == want.tokens, tag
    for a, b, va, vb in zip(
      got[tag].logp, want.logp, got[tag].versions, want.versions
    ):
      np.testing.assert_allclose(a, b, atol=1e-4)
      np.testing.assert_array_equal(va, vb)


def test_a_prompt_handed_back_twice_keeps_every_row(weights):
  """Cut, continue, cut again, continue: the groups of a run with no cut
  on one set of weights (the continuations recompute the same KV)."""
  w0, _ = weights
  engine = _engine(w0, inflight_kv="keep")
  ref = Feed(_prompts())
  engine.generate_stream(
    ref, MORE_PROMPTS[:2], SAMPLING, weight_updates=lambda: None, version=0
  )
  feeds, prompts = [], _prompts()
  for cut_at in (2, 1, None):
    feed = Feed(prompts, cut_at=cut_at)
    engine.generate_stream(
      feed, MORE_PROMPTS[:2], SAMPLING, weight_updates=lambda: None, version=0
    )
    feeds.append(feed)
    prompts = feed.back or []
  got = {tag: g for f in feeds for tag, g in f.groups.items()}
  assert sorted(got) == sorted(ref.groups)
  for tag, want in ref.groups.items():
    assert got[tag].tokens == want.tokens, tag
    for a, b in zip(got[tag].logp, want.logp):
      np.testing.assert_allclose(a, b, atol=1e-4)
