"""Building blocks: RMSNorm, RoPE (plain, linear, llama3), GQA attention."""

import math
import os
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import layers


class RmsNormTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    x = jnp.array([[3.0, 4.0]])  # mean(x²) = 12.5
    scale = jnp.array([1.0, 2.0])
    y = self.variant(lambda x, s: layers.rms_norm(x, s, 0.0))(x, scale)
    r = math.sqrt(12.5)
    np.testing.assert_allclose(y, [[3 / r, 8 / r]], rtol=1e-6)

  def test_eps_and_no_unit_offset(self):
    y = layers.rms_norm(jnp.zeros((1, 4)) + 1e-3, jnp.full((4,), 2.0), 1.0)
    # x / sqrt(1e-6 + 1) * 2, not * (1 + 2).
    np.testing.assert_allclose(y, 2e-3 / math.sqrt(1 + 1e-6), rtol=1e-5)

  def test_bf16_input_keeps_dtype(self):
    y = layers.rms_norm(jnp.ones((2, 4), jnp.bfloat16), jnp.ones(4), 1e-5)
    assert y.dtype == jnp.bfloat16


class RopeTest(chex.TestCase):
  def test_plain_frequencies(self):
    config = models.tiny_config(head_dim=4, rope_theta=100.0)
    np.testing.assert_allclose(
      layers.rope_inverse_frequencies(config), [1.0, 0.1], rtol=1e-6
    )

  def test_linear_scaling_divides_by_factor(self):
    config = models.tiny_config(
      head_dim=4,
      rope_theta=100.0,
      rope_scaling={"rope_type": "linear", "factor": 4.0},
    )
    np.testing.assert_allclose(
      layers.rope_inverse_frequencies(config), [0.25, 0.025], rtol=1e-6
    )

  def test_llama3_scaling_bands(self):
    scaling = {
      "rope_type": "llama3",
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64,
    }
    config = models.tiny_config(
      head_dim=16, rope_theta=10000.0, rope_scaling=scaling
    )
    plain = np.asarray(
      layers.rope_inverse_frequencies(config.replace(rope_scaling=None))
    )
    scaled = np.asarray(layers.rope_inverse_frequencies(config))
    wavelen = 2 * np.pi / plain
    high = wavelen < 64 / 4  # short wavelengths: kept
    low = wavelen > 64 / 1  # long wavelengths: divided by factor
    medium = ~high & ~low
    assert high.any() and low.any() and medium.any()
    np.testing.assert_allclose(scaled[high], plain[high], rtol=1e-6)
    np.testing.assert_allclose(scaled[low], plain[low] / 8, rtol=1e-6)
    s = (64 / wavelen[medium] - 1) / (4 - 1)
    np.testing.assert_allclose(
      scaled[medium], (1 - s) * plain[medium] / 8 + s * plain[medium], rtol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_rotation_hand_computed(self):
    # head_dim 2: one pair (x0, x1) rotated by angle p·1.
    config = models.tiny_config(head_dim=2, num_heads=2, num_kv_heads=1)
    positions = jnp.array([[0, 1]])
    x = jnp.tile(jnp.array([1.0, 2.0]), (1, 2, 1, 1))  # [1, 2, 1, 2]

    def rotate(x, p):
      cos, sin = layers.rope_cos_sin(config, p)
      return layers.apply_rope(x, cos, sin)

    y = self.variant(rotate)(x, positions)
    c, s = math.cos(1.0), math.sin(1.0)
    np.testing.assert_allclose(y[0, 0, 0], [1.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(y[0, 1, 0], [c - 2 * s, 2 * c + s], rtol=1e-6)

  def test_relative_positions(self):
    # q·k after RoPE depends only on the position difference.
    config = models.tiny_config(head_dim=8)
    q, k = jax.random.normal(jax.random.PRNGKey(0), (2, 1, 1, 1, 8))

    def score(pq, pk):
      cq, sq = layers.rope_cos_sin(config, jnp.array([[pq]]))
      ck, sk = layers.rope_cos_sin(config, jnp.array([[pk]]))
      return jnp.sum(
        layers.apply_rope(q, cq, sq) * layers.apply_rope(k, ck, sk)
      )

    np.testing.assert_allclose(score(7, 3), score(14, 10), rtol=1e-5)
    assert abs(score(7, 3) - score(7, 5)) > 1e-4


class AttentionTest(chex.TestCase):
  def _naive(self, q, k, v, mask):
    # Repeat kv heads, plain per-head softmax attention.
    groups = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, groups, axis=2)
    v = jnp.repeat(v, groups, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
    s = jnp.where(mask[:, None], s, -jnp.inf)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, -1), v)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gqa_matches_repeated_heads(self):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(kq, (2, 5, 6, 4))
    k = jax.random.normal(kk, (2, 5, 2, 4))
    v = jax.random.normal(kv, (2, 5, 2, 4))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((5, 5), bool)), (2, 5, 5))
    out = self.variant(layers.attention)(q, k, v, mask)
    np.testing.assert_allclose(out, self._naive(q, k, v, mask), atol=1e-5)

  def test_masked_keys_are_ignored(self):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(kq, (1, 1, 2, 4))
    k = jax.random.normal(kk, (1, 3, 1, 4))
    v = jax.random.normal(kv, (1, 3, 1, 4))
    mask = jnp.array([[[True, False, True]]])
    out = layers.attention(q, k, v, mask)
    out2 = layers.attention(
      q, k.at[:, 1].set(100.0), v.at[:, 1].set(-50.0), mask
    )
    np.testing.assert_allclose(out, out2, atol=1e-6)

  def test_fully_masked_query_is_finite(self):
    q = jnp.ones((1, 1, 2, 4))
    k = v = jnp.ones((1, 2, 1, 4))
    out = layers.attention(q, k, v, jnp.zeros((1, 1, 2), bool))
    assert jnp.all(jnp.isfinite(out))

  def test_bad_heads(self):
    with pytest.raises(ValueError, match="not a multiple"):
      layers.attention(
        jnp.ones((1, 1, 3, 4)),
        jnp.ones((1, 1, 2, 4)),
        jnp.ones((1, 1, 2, 4)),
        jnp.ones((1, 1, 1), bool),
      )

  def test_causal_hint_does_not_change_the_result(self):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(2), 3)
    q = jax.random.normal(kq, (2, 5, 4, 8))
    k = jax.random.normal(kk, (2, 5, 2, 8))
    v = jax.random.normal(kv, (2, 5, 2, 8))
    mask = (
      jnp.tril(jnp.ones((5, 5), bool))[None]
      & jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], bool)[:, None, :]
    )
    np.testing.assert_array_equal(
      layers.attention(q, k, v, mask, causal=True),
      layers.attention(q, k, v, mask),
    )


def _padded_causal_operands(dtype, b=2, t=128, hq=14, hkv=2, hd=64):
  """Random GQA operands at Qwen2.5-0.5B's head layout, the first row left-
  padded by 37 tokens, and the causal & padding mask the decoder builds."""
  kq, kk, kv, kg = jax.random.split(jax.random.PRNGKey(3), 4)
  q = jax.random.normal(kq, (b, t, hq, hd)).astype(dtype)
  k = jax.random.normal(kk, (b, t, hkv, hd)).astype(dtype)
  v = jax.random.normal(kv, (b, t, hkv, hd)).astype(dtype)
  valid = jnp.arange(t)[None, :] >= jnp.array([37] + [0] * (b - 1))[:, None]
  mask = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]
  cotangent = jax.random.normal(kg, (b, t, hq, hd), jnp.float32)
  return q, k, v, mask, cotangent, valid


class AttentionImplTest(chex.TestCase):
  def test_bad_setting_names_the_variable(self):
    with mock.patch.dict(os.environ, {layers.ATTENTION_IMPL_ENV: "flash"}):
      with pytest.raises(ValueError, match="RLJAX_ATTENTION='flash'"):
        layers.attention_impl()

  def test_auto_is_the_einsum_path_off_gpu(self):
    if jax.default_backend() == "gpu":
      pytest.skip("on a GPU auto picks cuDNN (FusedAttentionTest)")
    q, k, v, mask, _, _ = _padded_causal_operands(jnp.bfloat16, t=16)
    outs = {}
    for impl in ("auto", "xla"):
      with mock.patch.dict(os.environ, {layers.ATTENTION_IMPL_ENV: impl}):
        outs[impl] = layers.attention(q, k, v, mask, causal=True)
    np.testing.assert_array_equal(outs["auto"], outs["xla"])


@pytest.mark.skipif(
  jax.default_backend() != "gpu", reason="cuDNN fused attention needs a GPU"
)
class FusedAttentionTest(chex.TestCase):
  """cuDNN's fused attention against the einsum path (run on the device
  machine: `pytest tests/models/test_decoder_layers.py -k Fused`)."""

  def _run(self, impl, causal):
    q, k, v, mask, cot, valid = _padded_causal_operands(jnp.bfloat16)

    def loss(q, k, v):
      out = layers.attention(q, k, v, mask, causal=causal)
      # Padded query rows are never read: leave them out of the loss.
      return jnp.sum(out.astype(jnp.float32) * cot * valid[:, :, None, None])

    with mock.patch.dict(os.environ, {layers.ATTENTION_IMPL_ENV: impl}):
      out = jax.jit(
        lambda q, k, v: layers.attention(q, k, v, mask, causal=causal)
      )(q, k, v)
      grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    return out, grads, valid

  def test_matches_einsum_path(self):
    ref_out, ref_grads, valid = self._run("xla", causal=False)
    for causal in (False, True):
      out, grads, _ = self._run("cudnn", causal)
      assert jnp.all(jnp.isfinite(out.astype(jnp.float32)))
      rows = valid[:, :, None, None]
      np.testing.assert_allclose(
        np.where(rows, out.astype(np.float32), 0),
        np.where(rows, ref_out.astype(np.float32), 0),
        atol=2e-2,
      )
      for g, ref in zip(grads, ref_grads):
        scale = float(jnp.max(jnp.abs(ref.astype(jnp.float32))))
        np.testing.assert_allclose(
          g.astype(np.float32), ref.astype(np.float32), atol=2e-2 * scale
        )
