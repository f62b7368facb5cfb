"""One sampling step of the JAX sampler (`sample_next_token`: greedy,
temperature, top-k, top-p), its per-sample PRNG keys, and the static
engine's capacity and prompt buckets."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.rollout import jax_sampler
from rljax.rollout.jax_sampler import sample_next_token


def _rows(logits, num_rows):
  return jnp.tile(jnp.asarray(logits, jnp.float32)[None], (num_rows, 1))


def _keys(num_rows, seed=0):
  return jax.random.split(jax.random.key(seed), num_rows)


class TestSampleNextToken(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_greedy_is_argmax_with_temperature_one_logp(self):
    logits = jnp.array([[0.1, 2.0, -1.0], [3.0, 0.0, 2.5]])
    fn = self.variant(lambda z, k: sample_next_token(z, k, greedy=True))
    tokens, logp = fn(logits, _keys(2))
    np.testing.assert_array_equal(tokens, [1, 0])
    # log_softmax by hand: z_i - log(sum exp z).
    want = [
      2.0 - np.log(np.exp(0.1) + np.exp(2.0) + np.exp(-1.0)),
      3.0 - np.log(np.exp(3.0) + 1.0 + np.exp(2.5)),
    ]
    np.testing.assert_allclose(logp, want, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_temperature_zero_means_greedy(self):
    logits = jnp.array([[0.1, 2.0, -1.0]])
    fn = self.variant(lambda z, k: sample_next_token(z, k, temperature=0.0))
    tokens, _ = fn(logits, _keys(1))
    np.testing.assert_array_equal(tokens, [1])

  @chex.variants(with_jit=True, without_jit=True)
  def test_top_k_one_is_argmax_with_logp_zero(self):
    logits = _rows([0.3, -0.2, 0.9, 0.8], 64)
    fn = self.variant(
      lambda z, k: sample_next_token(z, k, temperature=5.0, top_k=1)
    )
    tokens, logp = fn(logits, _keys(64))
    np.testing.assert_array_equal(tokens, np.full(64, 2))
    # The renormalized one-token distribution puts mass 1 on it.
    np.testing.assert_allclose(logp, np.zeros(64), atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_top_k_renormalizes_over_the_kept_tokens(self):
    z = np.array([1.0, 3.0, 2.0, -1.0])
    temperature = 2.0
    fn = self.variant(
      lambda z, k: sample_next_token(z, k, temperature=temperature, top_k=2)
    )
    tokens, logp = fn(_rows(z, 512), _keys(512))
    assert set(np.asarray(tokens).tolist()) == {1, 2}
    kept = np.exp(z[[1, 2]] / temperature)
    want = {1: np.log(kept[0] / kept.sum()), 2: np.log(kept[1] / kept.sum())}
    np.testing.assert_allclose(
      logp, [want[t] for t in np.asarray(tokens)], rtol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_top_p_keeps_smallest_set_reaching_the_mass(self):
    probs = np.array([0.05, 0.5, 0.15, 0.3])
    # Mass before each token in sorted order: 0, 0.5, 0.8, 0.95; top_p=0.7
    # keeps tokens 1 and 3 (0.8 of the mass).
    fn = self.variant(lambda z, k: sample_next_token(z, k, top_p=0.7))
    tokens, logp = fn(_rows(np.log(probs), 512), _keys(512))
    assert set(np.asarray(tokens).tolist()) == {1, 3}
    want = {1: np.log(0.5 / 0.8), 3: np.log(0.3 / 0.8)}
    np.testing.assert_allclose(
      logp, [want[t] for t in np.asarray(tokens)], rtol=1e-5
    )

  def test_tiny_top_p_is_argmax(self):
    logits = _rows([0.3, -0.2, 0.9, 0.8], 32)
    tokens, _ = sample_next_token(logits, _keys(32), top_p=1e-6)
    np.testing.assert_array_equal(tokens, np.full(32, 2))

  def test_frequencies_match_softmax_of_scaled_logits(self):
    z = np.array([1.0, 0.0, -1.0, 0.5])
    temperature = 0.8
    num_rows = 20000
    tokens, logp = jax.jit(
      lambda z, k: sample_next_token(z, k, temperature=temperature)
    )(_rows(z, num_rows), _keys(num_rows, 3))
    p = np.exp(z / temperature) / np.exp(z / temperature).sum()
    freq = np.bincount(np.asarray(tokens), minlength=4) / num_rows
    # 4 standard errors of a proportion near 0.5 at n=20000 is 0.014.
    np.testing.assert_allclose(freq, p, atol=0.015)
    np.testing.assert_allclose(logp, np.log(p)[np.asarray(tokens)], rtol=1e-5)

  def test_nan_logits_give_valid_ids_and_nan_logp(self):
    logits = jnp.array([[jnp.nan] * 5, [0.0, 1.0, 2.0, 3.0, 4.0]])
    for kwargs in ({"greedy": True}, {"temperature": 1.0}):
      tokens, logp = sample_next_token(logits, _keys(2), **kwargs)
      assert 0 <= int(tokens[0]) < 5
      assert np.isnan(logp[0]) and np.isfinite(logp[1])

  def test_rejects_non_matrix_logits(self):
    with pytest.raises(ValueError, match=r"expected \[B, V\]"):
      sample_next_token(jnp.zeros((2, 3, 4)), _keys(2))


class TestTopP:
  @pytest.mark.parametrize("scale", [8.0, 0.5])  # fast path; bisection
  def test_top_p_matches_sorted_reference(self, scale):
    vocab, top_p, num_rows = 1024, 0.9, 256
    z = np.random.default_rng(0).normal(size=vocab) * scale
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    order = np.argsort(-p)
    mass_before = np.cumsum(p[order]) - p[order]
    nucleus = set(order[mass_before < top_p].tolist())
    # The flat case has a nucleus beyond the exact top-256 search.
    assert (len(nucleus) > jax_sampler._TOP_P_FAST_K) == (scale < 1)
    tokens, logp = jax.jit(lambda z, k: sample_next_token(z, k, top_p=top_p))(
      _rows(z, num_rows), _keys(num_rows, 5)
    )
    tokens = np.asarray(tokens)
    assert set(tokens.tolist()) <= nucleus
    kept_mass = p[sorted(nucleus)].sum()
    np.testing.assert_allclose(logp, np.log(p[tokens] / kept_mass), atol=1e-4)


class TestSampleKeys:
  def test_keys_depend_only_on_seed_prompt_and_sample(self):
    a = jax_sampler.sample_keys(7, jnp.array([0, 0, 1]), jnp.array([0, 1, 0]))
    b = jax_sampler.sample_keys(7, jnp.array([1, 0]), jnp.array([0, 1]))
    data = lambda k: np.asarray(jax.random.key_data(k))
    np.testing.assert_array_equal(data(a)[2], data(b)[0])
    np.testing.assert_array_equal(data(a)[1], data(b)[1])
    assert not np.array_equal(data(a)[0], data(a)[1])
    c = jax_sampler.sample_keys(8, jnp.array([0]), jnp.array([0]))
    assert not np.array_equal(data(a)[0], data(c)[0])


class TestBuckets:
  def test_capacity_and_segments(self):
    capacities = [
      jax_sampler.new_token_capacity(t) for t in (1, 16, 17, 64, 65, 256, 300)
    ]
    assert capacities == [16, 16, 32, 64, 128, 256, 320]
    assert jax_sampler.decode_segments(16) == (16,)
    assert jax_sampler.decode_segments(64) == (64,)
    assert jax_sampler.decode_segments(256) == (64, 128, 256)
    assert jax_sampler.decode_segments(320) == (64, 128, 256, 320)

  def test_default_prompt_buckets(self):
    assert jax_sampler.default_prompt_buckets(200) == (
      16,
      32,
      64,
      128,
      192,
      200,
    )
    assert jax_sampler.default_prompt_buckets(64) == (16, 32, 64)
    assert jax_sampler.default_prompt_buckets(10) == (10,)
