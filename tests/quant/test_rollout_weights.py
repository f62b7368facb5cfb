"""quant.prepare_rollout_weights: the one place rollout weights are made."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import quant

import quant_testing


@pytest.fixture(scope="module")
def tiny():
  return quant_testing.tiny_model()


class TestPrepareRolloutWeights:
  @pytest.mark.parametrize("mode", ["int8", "int8_wo", "fp8"])
  def test_quantized_modes_are_quantize_params(self, tiny, mode):
    config, params = tiny
    got = quant.prepare_rollout_weights(config, params, mode)
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
