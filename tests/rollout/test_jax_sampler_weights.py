"""The JAX sampler's weights on a tiny model: fused projections, INT8
and its head, bf16, dtypes of cache and activations, and weight updates
(the model and references are `jax_sampler_fixtures`')."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# The shared fixtures are imported by name (pytest finds them in the module)
# and then requested as parameters, which flake8 reads as redefinitions.
# ruff: noqa: F811
from jax_sampler_fixtures import (  # noqa: F401  (fixtures)
  PROMPTS,
  VOCAB,
  _reference_logp,
  sampler,
  tiny,
)

from rljax import models
from rljax import quant as quant_lib
from rljax.rollout import base, jax_sampler
from rljax.rollout.jax_sampler import JaxSampler


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
