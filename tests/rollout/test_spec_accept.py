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


@jax.jit
def _rule(samples, drafts, k, stops, room):
  m = spec_accept.accepted_drafts(samples, drafts, k)
  return m, spec_accept.emitted_count(samples, m, stops, room)


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
    m, e = _rule(samples, drafts, k, stops, room)
    for i in range(b):
      want = spec_accept.emitted_reference(
        samples[i], drafts[i], int(k[i]), stop_set, int(room[i])
      )
      assert samples[i, : int(e[i])].tolist() == want
      assert 0 <= int(m[i]) <= int(k[i])


def _toy_logits(prefix) -> np.ndarray:
  """A policy whose next-token logits are a fixed pseudo-random function
  of the whole prefix: a wrong draft changes every later position's
  distribution, as a language model's."""
  h = 17
  for t in prefix:
    h = (h * 31 + int(t) + 1) % (2**31 - 1)
  return 2.0 * np.random.default_rng(h).standard_normal(_V).astype(np.float32)


def _sample(greedy: bool):
  return functools.partial(
    sample_next_token, temperature=1.0, top_p=0.9, greedy=greedy
  )


@functools.partial(jax.jit, static_argnums=(0,))
def _plain_step(greedy, logits, key_data, t):
  key = jax.random.fold_in(jax.random.wrap_key_data(key_data), t)
  return _sample(greedy)(logits[None], key[None])


@functools.partial(jax.jit, static_argnums=(0,))
def _verify(greedy, logits, key_data, first, drafts, k, room):
  tok, logp = spec_accept.sample_positions(
    _sample(greedy), logits[None], key_data[None], first[None]
  )
  m = spec_accept.accepted_drafts(tok, drafts[None], k[None])
  e = spec_accept.emitted_count(tok, m, jnp.asarray([-1]), room[None])
  return tok[0], logp[0], e[0]


def _plain(key_data, steps, greedy):
  """Plain decoding: token t from fold_in(key, t) on the prefix's logits."""
  out, logps = [], []
  for t in range(steps):
    tok, logp = _plain_step(greedy, _toy_logits(out), key_data, t)
    out.append(int(tok[0]))
    logps.append(float(logp[0]))
  return out, logps


def _speculative(key_data, steps, greedy, draft_fn, width):
  """Verify steps of `width` positions: the drafts from `draft_fn`, the
  logits of each position on the prefix it was fed, the coupled rule."""
  out, logps = [], []
  while len(out) < steps:
    drafts = [int(d) for d in draft_fn(out, width - 1)]
    fed = out + drafts
    logits = np.stack([_toy_logits(fed[: len(out) + j]) for j in range(width)])
    tok, logp, e = _verify(
      greedy, logits, key_data, np.int32(len(out)),
      np.asarray(drafts, np.int32), np.int32(width - 1),
      np.int32(steps - len(out)),
    )  # fmt: skip
    out.extend(int(x) for x in tok[: int(e)])
    logps.extend(float(x) for x in logp[: int(e)])
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


class TestSamplePositions:
  def test_each_position_is_plain_decodings_call_bit_for_bit(self):
    """Position j of a verify step is sampled by the call plain decoding
    makes for that token: `sample` on the B rows' logits at j, with key
    fold_in(key_b, L_b + j). One call over all B·T rows reduces the
    softmax at another row count, which XLA:CPU may sum in another order
    (at a 512-token vocabulary the log-probs moved by ~5e-7)."""
    b, t, v = 4, 4, 512
    logits = 4.0 * jax.random.normal(jax.random.key(0), (b, t, v))
    key_data = jax.random.key_data(
      sample_keys(7, jnp.arange(b), jnp.ones((b,), jnp.int32))
    )
    first = jnp.asarray([0, 3, 5, 9], jnp.int32)
    sample = functools.partial(sample_next_token, temperature=1.0, top_p=1.0)
    tok, logp = jax.jit(
      lambda z, k, f: spec_accept.sample_positions(sample, z, k, f)
    )(logits, key_data, first)
    keys = jax.random.wrap_key_data(key_data)
    plain = jax.jit(
      lambda z, k, i: sample(z, jax.vmap(jax.random.fold_in)(k, i))
    )
    for j in range(t):
      want_tok, want_logp = plain(logits[:, j], keys, first + j)
      np.testing.assert_array_equal(tok[:, j], want_tok)
      np.testing.assert_array_equal(logp[:, j], want_logp)
