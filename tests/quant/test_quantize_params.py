"""quantize_params on decoder trees, and the decoder running the result."""

from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax import quant
from rljax.quant.qtensor import QTensor

import quant_testing


class QuantizeParamsTest(parameterized.TestCase):
  def setUp(self):
    super().setUp()
    self.config, self.params = quant_testing.tiny_model("qwen2")

  @parameterized.parameters("int8", "int8_wo", "fp8")
  def test_replaces_exactly_the_seven_kernels(self, mode):
    q = quant.quantize_params(self.config, self.params, mode=mode)
    paths = [p for p, _ in quant.iter_qtensors(q)]
    self.assertCountEqual(
      paths, [("layers", n, "kernel") for n in quant.LAYER_KERNELS]
    )
    for name in quant.LAYER_KERNELS:
      qt = q["layers"][name]["kernel"]
      w = self.params["layers"][name]["kernel"]
      self.assertEqual(qt.mode, mode)
      self.assertEqual(qt.value.shape, w.shape)
      self.assertEqual(qt.scale.shape, (w.shape[0], 1, w.shape[2]))
      np.testing.assert_array_equal(
        qt.value, quant.quantize(w, mode).value
      )  # leaf-wise quantizer
    # Everything else is the same values in fresh buffers (the trainer may
    # donate params while the rollout engine still holds this tree).
    for path in (
      ("embed", "embedding"),
      ("final_norm", "scale"),
      ("lm_head", "kernel"),
      ("layers", "attn_norm", "scale"),
      ("layers", "q_proj", "bias"),
    ):
      a, b = self.params, q
      for k in path:
        a, b = a[k], b[k]
      np.testing.assert_array_equal(a, b)
      self.assertNotEqual(a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer())
    # The input tree is untouched.
    self.assertNotIsInstance(self.params["layers"]["q_proj"]["kernel"], QTensor)

  def test_include_lm_head(self):
    q = quant.quantize_params(
      self.config, self.params, "int8", include_lm_head=True
    )
    self.assertIsInstance(q["lm_head"]["kernel"], QTensor)

  def test_include_lm_head_with_tied_embeddings_is_an_error(self):
    config, params = quant_testing.tiny_model(tie_word_embeddings=True)
    with self.assertRaisesRegex(ValueError, "tied"):
      quant.quantize_params(config, params, "int8", include_lm_head=True)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "mode='int4'"):
      quant.quantize_params(self.config, self.params, mode="int4")
    q = quant.quantize_params(self.config, self.params)
    with self.assertRaisesRegex(TypeError, "already a QTensor"):
      quant.quantize_params(self.config, q)
    with self.assertRaisesRegex(TypeError, "'layers'"):
      quant.quantize_params(self.config, {"embed": {}})
    with self.assertRaisesRegex(ValueError, "per_tensor"):
      quant.quantize_params(self.config, self.params, "int8", per_tensor=True)

  @parameterized.parameters(
    ("int8", False, 0.05),
    ("int8", True, 0.05),
    ("int8_wo", False, 0.02),
    ("fp8", False, 0.1),
  )
  def test_decoder_runs_quantized_tree(self, mode, fake, tol):
    tokens = quant_testing.random_tokens(self.config)
    ref = models.forward(self.config, self.params, tokens)
    q = quant.quantize_params(self.config, self.params, mode, fake=fake)
    out = jax.jit(models.forward, static_argnums=0)(self.config, q, tokens)
    self.assertEqual(out.shape, ref.shape)
    p_ref, p_out = jax.nn.softmax(ref), jax.nn.softmax(out)
    # Close to full precision, but not identical: it was quantized.
    tv = 0.5 * float(jnp.max(jnp.sum(jnp.abs(p_ref - p_out), -1)))
    self.assertLess(tv, tol)
    self.assertGreater(float(jnp.max(jnp.abs(out - ref))), 0.0)

  def test_int8_real_and_fake_decoders_agree(self):
    tokens = quant_testing.random_tokens(self.config)
    real = models.forward(
      self.config,
      quant.quantize_params(self.config, self.params, "int8"),
      tokens,
    )
    fake = models.forward(
      self.config,
      quant.quantize_params(self.config, self.params, "int8", fake=True),
      tokens,
    )
    np.testing.assert_allclose(real, fake, atol=1e-4)


if __name__ == "__main__":
  pytest.main([__file__])
