"""The coupled acceptance rule (`spec_accept`) on its own: the vectorised
rule against a loop, and the claim itself on a toy policy: speculative
decoding with any drafts emits plain decoding's tokens, for every key."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.rollout import spec_accept
from rljax.rollout.token_sampling import sample_keys
from rljax.rollout.token_sampling import sample_next_token

_V = 6  # a small vocabulary: drafts are often right, stops often hit


class TestRule:
  @settings(max_examples=150, deadline=None)
  @given(t=st.sampled_from([2, 5]), data=st.data())
  def test_emitted_count_is_the_loop(self, t, data):
    """Three rows (few shapes: each compiles once), drafts broken at
    random places, random draft counts, rooms and stop sets."""
    b = 3
    samples = np.asarray(
      data.draw(st.lists(st.integers(0, 3), min_size=b * t, max_size=b * t)),
      np.int32,
    ).reshape(b, t)
    drafts = samples[:, :-1].copy()
    for i in range(b):
      for j in range(t - 1):
        if data.draw(st.booleans()):
          drafts[i, j] = data.draw(st.integers(0, 3))
    k = np.asarray(
      [data.draw(st.integers(0, t - 1)) for _ in range(b)], np.int32
    )
    room = np.asarray(
      [data.draw(st.integers(1, t + 1)) for _ in range(b)], np.int32
    )
    stop_set = data.draw(st.sets(st.integers(0, 3), max_size=3))
    stops = np.full((3,), -1, np.int32)
    stops[: len(stop_set)] = sorted(stop_set)
    m = spec_accept.accepted_drafts(samples, drafts, k)
    e = spec_accept.emitted_count(samples, m, stops, room)
    for i in range(b):
      want = spec_accept.emitted_reference(
        samples[i], drafts[i], int(k[i]), stop_set, int(room[i])
      )
      assert samples[i, : int(e[i])].tolist() == want
      assert 0 <= int(m[i]) <= int(k[i])


def _toy_logits(prefix_hash):
  """A policy whose next-token logits are a fixed pseudo-random function
  of the whole prefix (its hash): a wrong draft changes every later
  position's distribution, as a language model's."""
  key = jax.random.fold_in(jax.random.key(123), prefix_hash)
  return 2.0 * jax.random.normal(key, (_V,))


def _hash(tokens):
  h = 17
  for t in tokens:
    h = (h * 31 + int(t) + 1) % (2**31 - 1)
  return h


@functools.lru_cache(maxsize=None)
def _sampler(greedy: bool):
  return jax.jit(
    functools.partial(
      sample_next_token, temperature=1.0, top_p=0.9, greedy=greedy
    )
  )


def _plain(key_data, steps, greedy):
  """Plain decoding: token t from fold_in(key, t) on the prefix's logits."""
  out, logps = [], []
  for t in range(steps):
    logits = _toy_logits(_hash(out))[None]
    key = jax.random.fold_in(jax.random.wrap_key_data(key_data), t)
    tok, logp = _sampler(greedy)(logits, key[None])
    out.append(int(tok[0]))
    logps.append(float(logp[0]))
  return out, logps


def _speculative(key_data, steps, greedy, draft_fn, width):
  """Verify steps of `width` positions: the drafts from `draft_fn`, the
  logits of each position on the prefix it was fed, the coupled rule."""
  out, logps = [], []
  sample = _sampler(greedy)
  while len(out) < steps:
    k = width - 1
    drafts = [int(d) for d in draft_fn(out, k)]
    fed = out + drafts
    logits = jnp.stack(
      [_toy_logits(_hash(fed[: len(out) + j])) for j in range(width)]
    )[None]
    tok, logp = spec_accept.sample_positions(
      sample, logits, key_data[None], jnp.asarray([len(out)], jnp.int32)
    )
    m = spec_accept.accepted_drafts(
      tok, jnp.asarray([drafts], jnp.int32), jnp.asarray([k], jnp.int32)
    )
    e = spec_accept.emitted_count(
      tok,
      m,
      jnp.asarray([-1], jnp.int32),
      jnp.asarray([steps - len(out)], jnp.int32),
    )
    out.extend(int(x) for x in tok[0, : int(e[0])])
    logps.extend(float(x) for x in logp[0, : int(e[0])])
  return out, logps


class TestCoupling:
  @settings(max_examples=12, deadline=None)
  @given(
    seed=st.integers(0, 2**20),
    width=st.sampled_from([2, 4]),
    right=st.floats(0.0, 1.0),
    greedy=st.booleans(),
  )
  def test_any_drafts_emit_plain_decodings_tokens(
    self, seed, width, right, greedy
  ):
    """Drafts that are right with probability `right` per token (right
    ones from plain decoding's own future, which the rule must not let
    leak into the path either way): the tokens and log-probs are plain
    decoding's."""
    steps = 12
    key_data = jax.random.key_data(
      sample_keys(seed, jnp.asarray([3]), jnp.asarray([1]))
    )[0]
    want, want_logp = _plain(key_data, steps, greedy)
    rng = np.random.default_rng(seed)

    def draft_fn(out, k):
      future = want[len(out) : len(out) + k] + [0] * k
      return [
        f if rng.random() < right else int(rng.integers(0, _V))
        for f in future[:k]
      ]

    got, got_logp = _speculative(key_data, steps, greedy, draft_fn, width)
    assert got == want
    np.testing.assert_allclose(got_logp, want_logp, rtol=1e-6, atol=1e-6)

  def test_right_drafts_emit_width_tokens_a_step(self):
    """With the right drafts every step emits `width` tokens: the
    speed-up the rule allows is all there."""
    key_data = jax.random.key_data(jax.random.key(5))
    want, _ = _plain(key_data, 8, False)
    steps = []

    def draft_fn(out, k):
      steps.append(len(out))
      return (want[len(out) : len(out) + k] + [0] * k)[:k]

    got, _ = _speculative(key_data, 8, False, draft_fn, 4)
    assert got == want and steps == [0, 4]
