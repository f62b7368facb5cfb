"""The tiny model shared by the JAX sampler's engine tests
(test_jax_sampler.py, test_jax_sampler_weights.py): its config and prompts,
the module fixtures (`tiny`, `sampler`, `int8_flip_tolerance`), and the
plain-decoder references the engine is compared with (greedy tokens by
stepwise argmax of `models.forward`, log-probs by `models.token_logprobs`).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import toy
from rljax.rollout import base
from rljax.rollout.jax_sampler import JaxSampler


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
  return config, toy.sharp_params(config, jax.random.key(0))


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
