"""A streamed slot run (`JaxSampler.generate_stream`, `prompt_feed`): the
prompts a feed admits while the run lasts share the slots, and each group
comes back as soon as its rows end, sampled as its own request would
sample it."""

from __future__ import annotations

import numpy as np
import pytest

from rljax.rollout import base, prompt_feed
from rljax.rollout.jax_sampler import JaxSampler
from tests.rollout.test_inflight_updates import (
  _CONFIG,
  MORE_PROMPTS,
  PROMPTS,
  _engine,
  _sharp,
)


class Feed:
  """Requests (prompts, seed) admitted in order; records starts and
  groups (the order groups end in, too)."""

  def __init__(self, requests, admit_after=None):
    self.queue = [
      prompt_feed.StreamPrompt(ids, i, seed, (r, i))
      for r, (prompts, seed) in enumerate(requests)
      for i, ids in enumerate(prompts)
    ]
    self.starts, self.groups, self.order = {}, {}, []
    # Hold request r back until `admit_after[r]` groups ended.
    self.admit_after = admit_after or {}

  def poll(self, prompt_len):
    out = []
    while self.queue and len(self.queue[0].ids) <= prompt_len:
      request = self.queue[0].tag[0]
      if len(self.order) < self.admit_after.get(request, 0):
        break
      out.append(self.queue.pop(0))
    return out

  def started(self, tag, version):
    self.starts.setdefault(tag, version)

  def done(self, group):
    self.groups[group.tag] = group
    self.order.append(group.tag)

  def stopped(self):
    return False


@pytest.fixture(scope="module")
def engine():
  return _engine(_sharp(0))


def _assert_group_is(group, rb, i, n, atol=0.0):
  assert group.tokens == rb.response_ids[i * n : (i + 1) * n]
  np.testing.assert_allclose(
    np.concatenate(group.logp),
    np.concatenate(rb.behav_logp[i * n : (i + 1) * n]),
    atol=atol,
  )


def test_one_request_streamed_is_generate(engine):
  sampling = base.SamplingConfig(
    n=2, temperature=1.0, max_new_tokens=24, seed=7
  )
  want = engine.generate(PROMPTS, sampling)
  feed = Feed([(PROMPTS, 7)])
  stats = engine.generate_stream(
    feed, PROMPTS, sampling, weight_updates=lambda: None, version=3
  )
  assert sorted(feed.groups) == [(0, i) for i in range(len(PROMPTS))]
  for i in range(len(PROMPTS)):
    _assert_group_is(feed.groups[(0, i)], want, i, 2)
    assert feed.starts[(0, i)] == 3
    assert all((v == 3).all() for v in feed.groups[(0, i)].versions)
  assert stats["final_version"] == 3


def test_requests_sharing_a_run_sample_as_their_own(engine):
  """Two requests (their own seeds) in one run, the second admitted while
  the first still decodes: every group is the one its own request gives
  (tokens equal, log-probs to float noise: other rows share the cache
  capacity)."""
  s1 = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=24, seed=7)
  s2 = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=24, seed=11)
  want1, want2 = engine.generate(PROMPTS, s1), engine.generate(MORE_PROMPTS, s2)
  feed = Feed([(PROMPTS, 7), (MORE_PROMPTS, 11)], admit_after={1: 1})
  engine.generate_stream(feed, PROMPTS, s1)
  for i in range(len(PROMPTS)):
    _assert_group_is(feed.groups[(0, i)], want1, i, 2, atol=1e-5)
  for i in range(len(MORE_PROMPTS)):
    _assert_group_is(feed.groups[(1, i)], want2, i, 2, atol=1e-5)
  assert feed.groups[(1, 0)].versions is None  # no hook: no versions
  # Held back until a group of the first had ended, then joined its run.
  assert feed.order.index((1, 0)) > 0


def test_a_stopped_feed_ends_the_run(engine):
  sampling = base.SamplingConfig(
    n=2, temperature=1.0, max_new_tokens=24, seed=7
  )
  feed = Feed([(PROMPTS, 7)])
  feed.stopped = lambda: bool(feed.starts)  # stop after the first prefill
  stats = engine.generate_stream(feed, PROMPTS, sampling)
  assert feed.starts and not feed.groups and stats.get("chunks", 0) == 0


def test_the_static_engine_refuses_a_stream():
  eng = JaxSampler(_CONFIG, _sharp(0), max_prompt_len=64)
  sampling = base.SamplingConfig(n=2, max_new_tokens=4, seed=1)
  with pytest.raises(ValueError, match="generate_stream: batching='static'"):
    eng.generate_stream(Feed([(PROMPTS, 1)]), PROMPTS, sampling)
