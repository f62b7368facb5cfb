"""In-flight weight updates of the continuous JAX engine (`inflight`,
`slot_scheduler.run`'s swap point, `slot_recompute.recompute_kv`): new
weights between decode chunks, keep or recompute the in-flight KV, per-token
policy versions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import toy
from rljax import quant as quant_lib
from rljax.rollout import base
from rljax.rollout.jax_sampler import JaxSampler

_CONFIG = models.tiny_config(vocab_size=128)
PROMPTS = [[5, 17, 3], [9], [4, 8, 15, 16, 23, 42, 7], [11, 12]]
# Six prompts through two slot groups of two: refills after the swap.
MORE_PROMPTS = PROMPTS + [[1, 2, 3], [6]]
CHUNK = 8
# Tokens a row has when the first chunk ends: its prefill's, then CHUNK.
BEFORE = 1 + CHUNK
GREEDY = base.SamplingConfig(n=1, greedy=True, max_new_tokens=24)


def _sharp(seed):
  """Sharp next-token distributions (no near-ties for float noise to flip),
  as the other rollout tests' tiny model."""
  return toy.sharp_params(_CONFIG, jax.random.key(seed))


@pytest.fixture(scope="module")
def w0():
  return _sharp(0)


@pytest.fixture(scope="module")
def w1():
  return _sharp(1)


def _engine(params, **kw):
  return JaxSampler(
    _CONFIG,
    params,
    max_prompt_len=64,
    batching="continuous",
    decode_slots=4,
    chunk_steps=CHUNK,
    **kw,
  )


class Pushes:
  """A `weight_updates` hook: update `at[i]` on its i-th poll (from 0), None
  otherwise; counts its polls."""

  def __init__(self, at=None):
    self.at = at or {}
    self.polls = 0

  def __call__(self):
    self.polls += 1
    return self.at.get(self.polls - 1)


def _assert_identical(a, b):
  assert a.response_ids == b.response_ids
  for x, y in zip(a.behav_logp, b.behav_logp):
    np.testing.assert_array_equal(x, y)


class TestNoUpdate:
  def test_hook_returning_none_changes_nothing(self, w0):
    engine = _engine(w0)
    cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=20, seed=4)
    plain = engine.generate(MORE_PROMPTS, cfg)
    hook = Pushes()
    hooked = engine.generate(MORE_PROMPTS, cfg, weight_updates=hook, version=3)
    _assert_identical(plain, hooked)
    assert hook.polls >= 2  # it was polled between chunks
    assert plain.policy_version is None
    for v, r in zip(hooked.policy_version, hooked.response_ids):
      np.testing.assert_array_equal(v, np.full(len(r), 3))
    assert engine.last_stats["weight_swaps"] == 0

  def test_without_hook_no_swap_figures(self, w0):
    batch = _engine(w0).generate(PROMPTS, GREEDY)
    assert batch.policy_version is None
    assert "weight_swaps" not in batch.timing


class TestKeep:
  def test_same_weights_as_new_version_same_samples(self, w0):
    """PipelineRL with unchanged weights: only the versions move, exactly at
    the first chunk's end (a swap that was ignored keeps them at 0)."""
    engine = _engine(w0)
    cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=20, seed=4)
    plain = engine.generate(MORE_PROMPTS, cfg)
    batch = engine.generate(
      MORE_PROMPTS, cfg, weight_updates=Pushes({0: (w0, 7)}), version=2
    )
    _assert_identical(plain, batch)
    # Prompts 0 and 1 filled the two groups; the swap came after their
    # first chunk; prompts 2.. were admitted after it.
    for row, (v, r) in enumerate(zip(batch.policy_version, batch.response_ids)):
      want = np.full(len(r), 7)
      if row < 4:
        want[:BEFORE] = 2
      np.testing.assert_array_equal(v, want)
    stats = engine.last_stats
    assert stats["weight_swaps"] == 1
    assert stats["swap_rows_in_flight"] == [4]
    assert stats["recompute_seconds"] == 0.0

  def test_new_weights_take_over_after_the_swap(self, w0, w1):
    plain = _engine(w0).generate(PROMPTS, GREEDY)
    engine = _engine(w0)
    batch = engine.generate(
      PROMPTS, GREEDY, weight_updates=Pushes({0: (w1, 1)})
    )
    changed = 0
    for a, b, v in zip(
      plain.response_ids, batch.response_ids, batch.policy_version
    ):
      assert b[:BEFORE] == a[:BEFORE]
      np.testing.assert_array_equal(v, [0] * BEFORE + [1] * (len(b) - BEFORE))
      changed += b[BEFORE:] != a[BEFORE:]
    # The swap took effect (ignored, every row would equal W0's).
    assert changed == len(PROMPTS)
    # The engine keeps W1.
    for x, y in zip(jax.tree.leaves(engine.params), jax.tree.leaves(w1)):
      np.testing.assert_array_equal(x, y)
    # Keep is not recompute: the stale KV changed some continuation.
    fresh = _engine(w0, inflight_kv="recompute").generate(
      PROMPTS, GREEDY, weight_updates=Pushes({0: (w1, 1)})
    )
    assert fresh.response_ids != batch.response_ids
    # The behaviour log-probs after the swap are W1's over the KV that W0
    # wrote (what sampled those tokens): not W0's, not a fresh W1's.
    for row, prompt in enumerate(PROMPTS):
      ids, logp = batch.response_ids[row], batch.behav_logp[row]
      keep = _keep_logp(w0, w1, prompt, ids, BEFORE)
      np.testing.assert_allclose(logp[BEFORE:], keep, atol=2e-4)
      for weights in (w0, w1):  # one set of weights for the whole sequence
        alone = _keep_logp(weights, weights, prompt, ids, BEFORE)
        assert np.abs(logp[BEFORE:] - alone).max() > 1e-2


def _keep_logp(w_old, w_new, prompt, ids, before):
  """Log-probs of ids[before:] where the KV of the prompt and of the tokens
  fed before the swap (ids[: before - 1]) is `w_old`'s and the rest is
  computed by `w_new` (PipelineRL's keep), by teacher forcing."""
  seq = list(prompt) + list(ids)
  cut = len(prompt) + before - 1  # tokens whose KV the old weights wrote
  cache = models.init_cache(_CONFIG, 1, len(seq), jnp.float32)
  mask = jnp.ones((1, len(seq)), bool)
  _, cache = models.forward_with_cache(
    _CONFIG, w_old, jnp.asarray([seq[:cut]]), jnp.arange(cut)[None], cache,
    0, mask,
  )  # fmt: skip
  logits, _ = models.forward_with_cache(
    _CONFIG, w_new, jnp.asarray([seq[cut:-1]]),
    jnp.arange(cut, len(seq) - 1)[None], cache, cut, mask,
  )  # fmt: skip
  logp = jax.nn.log_softmax(logits[0].astype(jnp.float32))
  return np.asarray(logp)[np.arange(len(seq) - 1 - cut), seq[cut + 1 :]]


def _w1_continuation(w1, prompt, prefix, steps):
  """W1's greedy continuation of prompt + prefix, by a fresh static engine
  given the whole sequence as its prompt."""
  engine = JaxSampler(_CONFIG, w1, max_prompt_len=64)
  batch = engine.generate(
    [prompt + prefix], base.SamplingConfig(greedy=True, max_new_tokens=steps)
  )
  return batch.response_ids[0], batch.behav_logp[0]


class TestRecompute:
  def test_continues_as_the_new_weights_would(self, w0, w1):
    """AReaL: after the swap each row decodes exactly what W1 decodes from
    the whole sequence so far; the tokens before it are W0's."""
    plain = _engine(w0).generate(PROMPTS, GREEDY)
    engine = _engine(w0, inflight_kv="recompute")
    batch = engine.generate(
      PROMPTS, GREEDY, weight_updates=Pushes({0: (w1, 1)})
    )
    for i, prompt in enumerate(PROMPTS):
      got = batch.response_ids[i]
      assert got[:BEFORE] == plain.response_ids[i][:BEFORE]
      np.testing.assert_array_equal(
        batch.behav_logp[i][:BEFORE], plain.behav_logp[i][:BEFORE]
      )
      want, want_logp = _w1_continuation(
        w1, prompt, got[:BEFORE], GREEDY.max_new_tokens - BEFORE
      )
      assert got[BEFORE:] == want
      # Ignored, the row would go on as W0 does, which differs here.
      assert plain.response_ids[i][BEFORE:] != want
      # The same log-probs up to float32 summation order (a teacher-forced
      # prefill of the sequence vs. one-token decode steps over it): they
      # differ by ~2e-6 here (log-probs of O(1)); 1e-4 leaves room for
      # another CPU's kernels, while the stale KV of "keep" moves them by
      # far more.
      np.testing.assert_allclose(
        batch.behav_logp[i][BEFORE:], want_logp, atol=1e-4
      )
    stats = engine.last_stats
    assert stats["weight_swaps"] == 1
    assert stats["swap_rows_in_flight"] == [len(PROMPTS)]
    assert stats["recompute_seconds"] > 0

  @pytest.mark.parametrize("width", [None, 1])
  def test_same_weights_recomputed_same_samples(self, w0, width):
    """Recomputing with unchanged weights rewrites the KV it had: a wrong
    prefix or own-cache write would change the greedy tokens (groups of a
    prompt's n rows, or one row each: a prefix entry per row)."""
    cfg = base.SamplingConfig(n=2, greedy=True, max_new_tokens=30)
    plain = _engine(w0, group_width=width).generate(MORE_PROMPTS, cfg)
    hook = Pushes({0: (w0, 1), 1: (w0, 2), 2: (w0, 3)})
    engine = _engine(w0, inflight_kv="recompute", group_width=width)
    batch = engine.generate(MORE_PROMPTS, cfg, weight_updates=hook)
    assert batch.response_ids == plain.response_ids
    for x, y in zip(batch.behav_logp, plain.behav_logp):
      np.testing.assert_allclose(x, y, atol=1e-4)
    assert engine.last_stats["weight_swaps"] == 3
    assert max(max(v) for v in batch.policy_version) == 3

  def test_compiles_stay_bounded(self, w0, w1):
    engine = _engine(w0, inflight_kv="recompute")
    cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=80, seed=1)
    engine.warmup(MORE_PROMPTS, cfg)
    # A plain run adds the shrinking resizes `warm` leaves out (as before
    # this option); the swaps then add nothing: warm-up compiled the
    # recompute program at every capacity.
    engine.generate(MORE_PROMPTS, cfg)
    warm = engine.num_compiles
    at = {i: ((w1, w0)[i % 2], i + 1) for i in range(40)}
    engine.generate(MORE_PROMPTS, cfg, weight_updates=Pushes(at))
    assert engine.last_stats["weight_swaps"] >= 3
    # A swap at every chunk boundary, rows past 64 tokens: recomputes of
    # up to 64 fed tokens and of more (two compiled widths).
    assert engine.last_stats["capacity_peak"] == 80
    assert engine.num_compiles == warm


class TestQuantized:
  def test_int8_swap_runs_the_quantized_new_weights(self, w0, w1):
    engine = _engine(w0, quant="int8")
    before = engine.params
    engine.generate(PROMPTS, GREEDY, weight_updates=Pushes({0: (w1, 1)}))
    want = quant_lib.prepare_rollout_weights(_CONFIG, w1, "int8")
    got = engine.params
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      assert x.dtype == y.dtype
      np.testing.assert_array_equal(x, y)
    assert any(x.dtype == jnp.int8 for x in jax.tree.leaves(got))
    assert not all(
      np.array_equal(x, y)
      for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(before))
    )


class TestErrors:
  def test_bad_inflight_kv(self, w0):
    with pytest.raises(ValueError, match="inflight_kv='stale'"):
      JaxSampler(_CONFIG, w0, inflight_kv="stale")

  def test_hook_on_static_engine(self, w0):
    static = JaxSampler(_CONFIG, w0, max_prompt_len=64)
    with pytest.raises(ValueError, match="batching='continuous'"):
      static.generate(PROMPTS, GREEDY, weight_updates=Pushes())

  @pytest.mark.parametrize(
    "hook, version, error, match",
    [
      (42, 0, TypeError, "weight_updates=42"),
      (Pushes(), -1, ValueError, "version=-1"),
      (Pushes(), 1.5, TypeError, "version=1.5"),
      (lambda: "w", 0, TypeError, "returned 'w'"),
    ],
  )
  def test_bad_hook_or_version(self, w0, hook, version, error, match):
    with pytest.raises(error, match=match):
      _engine(w0).generate(
        PROMPTS, GREEDY, weight_updates=hook, version=version
      )

  def test_version_going_back_or_layout_changing(self, w0):
    engine = _engine(w0)
    with pytest.raises(ValueError, match="new_version=1"):
      engine.generate(
        PROMPTS, GREEDY, weight_updates=Pushes({0: (w0, 1)}), version=5
      )
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), w0)
    with pytest.raises(ValueError, match="other shapes or dtypes"):
      engine.generate(PROMPTS, GREEDY, weight_updates=Pushes({0: (bf16, 1)}))
