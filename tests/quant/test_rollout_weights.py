"""quant.prepare_rollout_weights: the one place rollout weights are made."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax import quant
from rljax.quant import cpu as cpu_lib

import quant_testing


@pytest.fixture(scope="module")
def tiny():
  return quant_testing.tiny_model()


class TestPrepareRolloutWeights:
  @pytest.mark.parametrize("mode", ["int8", "int8_wo", "fp8"])
  def test_quantized_modes_are_quantize_params(self, tiny, mode):
    config, params = tiny
    got = quant.prepare_rollout_weights(config, params, mode, float_dtype=None)
    want = quant.quantize_params(config, params, mode=mode)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  def test_bf16_casts_every_leaf(self, tiny):
    config, params = tiny
    got = quant.prepare_rollout_weights(config, params, "bf16")
    assert {x.dtype for x in jax.tree.leaves(got)} == {jnp.dtype(jnp.bfloat16)}

  @pytest.mark.parametrize("mode", ["none", "f32"])
  def test_float_modes_copy(self, tiny, mode):
    config, params = tiny
    got = quant.prepare_rollout_weights(config, params, mode)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
      assert a is not b  # fresh buffers: the update step donates θ's

  @pytest.mark.parametrize("mode", ["int8", "int8_wo", "fp8"])
  def test_float_leaves_in_bf16_keep_the_codes(self, tiny, mode):
    config, params = tiny
    got = quant.prepare_rollout_weights(
      config, params, mode, float_dtype=jnp.bfloat16
    )
    want = quant.quantize_params(config, params, mode=mode)
    is_q = lambda x: isinstance(x, quant.QTensor)  # noqa: E731
    got_l = jax.tree.leaves(got, is_leaf=is_q)
    want_l = jax.tree.leaves(want, is_leaf=is_q)
    assert len(got_l) == len(want_l)
    n_float = 0
    for a, b in zip(got_l, want_l):
      if is_q(b):
        np.testing.assert_array_equal(np.asarray(a.value), np.asarray(b.value))
        np.testing.assert_array_equal(np.asarray(a.scale), np.asarray(b.scale))
        assert a.scale.dtype == jnp.float32
      else:
        n_float += 1
        assert a.dtype == jnp.bfloat16
        np.testing.assert_array_equal(
          np.asarray(a), np.asarray(b.astype(jnp.bfloat16))
        )
    assert n_float >= 3  # the embedding and the norms at least

  def test_bf16_float_leaves_run_bf16_activations_close_to_f32(self, tiny):
    # The accelerator's layout (bf16 activations around the int8 dots), run
    # here through the same forward: the logits move by bf16 rounding only.
    config, params = tiny
    tokens = jnp.asarray(
      np.random.RandomState(0).randint(1, config.vocab_size, (2, 9))
    )
    q32 = quant.prepare_rollout_weights(
      config, params, "int8", float_dtype=None
    )
    q16 = quant.prepare_rollout_weights(
      config, params, "int8", float_dtype="bfloat16"
    )
    assert models.compute_dtype(q16) == jnp.bfloat16
    l32 = np.asarray(models.forward(config, q32, tokens))
    l16 = np.asarray(models.forward(config, q16, tokens))
    assert l16.dtype == np.float32  # the head's logits stay float32
    scale = np.max(np.abs(l32))
    assert np.max(np.abs(l16 - l32)) < 0.05 * scale
    assert np.max(np.abs(l16 - l32)) > 0  # bf16 really ran

  def test_default_float_leaves_follow_the_backend(self, tiny, monkeypatch):
    config, params = tiny
    cpu = quant.prepare_rollout_weights(config, params, "int8")
    want = quant.quantized_float_dtype("int8", "cpu") or jnp.float32
    assert cpu["embed"]["embedding"].dtype == want
    # A faked GPU backend (only jax.default_backend; the conversion itself
    # runs on this CPU): the default becomes bf16 float leaves.
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    gpu = quant.prepare_rollout_weights(config, params, "int8")
    assert gpu["embed"]["embedding"].dtype == jnp.bfloat16
    none = quant.prepare_rollout_weights(config, params, "none")
    assert none["embed"]["embedding"].dtype == jnp.float32

  def test_bad_float_dtype_is_named(self, tiny):
    config, params = tiny
    with pytest.raises(ValueError, match=r"float_dtype=.*mode='bf16'"):
      quant.prepare_rollout_weights(
        config, params, "bf16", float_dtype="float16"
      )
    with pytest.raises(ValueError, match=r"float_dtype=int8.*floating"):
      quant.prepare_rollout_weights(config, params, "int8", float_dtype="int8")

  def test_unknown_mode_names_the_vocabulary(self, tiny):
    config, params = tiny
    with pytest.raises(ValueError, match=r"mode='int4'.*'int8_wo'"):
      quant.prepare_rollout_weights(config, params, "int4")

  def test_one_vocabulary(self):
    assert quant.ROLLOUT_MODES == (
      "none",
      "f32",
      "bf16",
      "int8",
      "int8_wo",
      "fp8",
    )
    assert [m for m in quant.ROLLOUT_MODES if quant.is_quantized(m)] == list(
      quant.MODES
    )


_AMX = cpu_lib.CpuInfo("Xeon", ("amx_bf16", "amx_int8", "avx512_bf16"))
_EPYC_BF16 = cpu_lib.CpuInfo("EPYC", ("avx512_bf16", "avx512_vnni"))
_AVX2 = cpu_lib.CpuInfo("EPYC", ("avx2",))


class TestQuantizedFloatDtype:
  @pytest.mark.parametrize("mode", ["int8", "int8_wo", "fp8"])
  def test_bf16_on_an_accelerator_and_on_bf16_dot_cpus(self, mode):
    assert quant.quantized_float_dtype(mode, "gpu") == jnp.bfloat16
    assert quant.quantized_float_dtype(mode, "tpu") == jnp.bfloat16
    for cpu in (_AMX, _EPYC_BF16):
      assert quant.quantized_float_dtype(mode, "cpu", cpu) == jnp.bfloat16
    # No bf16 dot units: XLA's bf16 dot is slower than f32 there.
    assert quant.quantized_float_dtype(mode, "cpu", _AVX2) is None
    # The host CPU decides by default.
    host = quant.quantized_float_dtype(mode, "cpu")
    assert host == quant.quantized_float_dtype(mode, "cpu", cpu_lib.host_cpu())

  @pytest.mark.parametrize("mode", ["none", "f32", "bf16"])
  def test_float_modes_have_no_float_leaf_rule(self, mode):
    assert quant.quantized_float_dtype(mode, "gpu") is None
