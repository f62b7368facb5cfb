"""Weight/activation quantizers and `qdot` (rljax.quant.quantizers, qtensor)."""

from absl.testing import parameterized
import chex
import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_util
from rljax.quant import qtensor
from rljax.quant import quantizers
from rljax.quant.qtensor import QTensor

_SETTINGS = hypothesis.settings(
  max_examples=25,
  deadline=None,
  suppress_health_check=list(hypothesis.HealthCheck),
)


def _kernels(min_side=1, max_side=8):
  shapes = hnp.array_shapes(
    min_dims=2, max_dims=3, min_side=min_side, max_side=max_side
  )
  elements = st.floats(-1e3, 1e3, width=32, allow_subnormal=False)
  return shapes.flatmap(lambda s: hnp.arrays(np.float32, s, elements=elements))


class QuantizeInt8Test(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # in=3, out=2: channel 0 has max |w| = 2.54 -> s = 0.02; channel 1: 0.5/127.
    w = jnp.array([[1.0, -0.5], [-2.54, 0.2], [0.3, 0.1]], jnp.float32)
    q = self.variant(quantizers.quantize_int8)(w)
    chex.assert_shape(q.scale, (1, 2))
    np.testing.assert_allclose(q.scale, [[0.02, 0.5 / 127]], rtol=1e-6)
    self.assertEqual(q.value.dtype, jnp.int8)
    np.testing.assert_array_equal(q.value, [[50, -127], [-127, 51], [15, 25]])
    self.assertEqual(q.mode, "int8")

  def test_round_half_to_even(self):
    # s = 1: 0.5 -> 0, 1.5 -> 2, -2.5 -> -2 (torch.round / vLLM rule).
    w = jnp.array([[0.5], [1.5], [-2.5], [127.0]], jnp.float32)
    q = quantizers.quantize_int8(w)
    np.testing.assert_array_equal(q.value[:, 0], [0, 2, -2, 127])

  def test_zero_channel_is_finite(self):
    w = jnp.array([[0.0, 1.0], [0.0, -1.0]], jnp.float32)
    q = quantizers.quantize_int8(w)
    np.testing.assert_array_equal(q.value[:, 0], [0, 0])
    np.testing.assert_array_equal(quantizers.dequantize(q)[:, 0], [0.0, 0.0])

  def test_stacked_layers_have_own_scales(self):
    w = jnp.stack([jnp.full((4, 3), 1.0), jnp.full((4, 3), 10.0)])
    q = quantizers.quantize_int8(w)
    chex.assert_shape(q.scale, (2, 1, 3))
    np.testing.assert_allclose(q.scale[:, 0, 0], [1 / 127, 10 / 127], rtol=1e-6)

  @hypothesis.given(_kernels())
  @_SETTINGS
  def test_error_at_most_half_a_step(self, w):
    q = quantizers.quantize_int8(jnp.asarray(w))
    err = np.abs(np.asarray(quantizers.dequantize(q)) - w)
    bound = np.asarray(q.scale) / 2
    # float32 rounding of w / s and of q * s adds a few ulps of |w|.
    np.testing.assert_array_less(
      err, bound * (1 + 1e-6) + 4e-7 * np.abs(w) + 1e-30
    )
    self.assertLessEqual(
      int(np.max(np.abs(np.asarray(q.value, np.int32)))), 127
    )

  def test_rejects_bad_inputs(self):
    with self.assertRaisesRegex(TypeError, "float array"):
      quantizers.quantize_int8(jnp.ones((2, 2), jnp.int32))
    with self.assertRaisesRegex(ValueError, "rank >= 2"):
      quantizers.quantize_int8(jnp.ones((3,)))
    with self.assertRaisesRegex(ValueError, "mode='fp8'"):
      quantizers.quantize_int8(jnp.ones((2, 2)), mode="fp8")
    with self.assertRaisesRegex(ValueError, "axis=5"):
      quantizers.quantize_int8(jnp.ones((2, 2)), axis=5)


class QuantizeFp8Test(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # s = 448 / 448 = 1; 1.0625 is a tie between 1 and 1.125 -> 1 (even);
    # 0.3 lies on the grid of step 2^-5 in [0.25, 0.5) -> 0.3125.
    w = jnp.array([[448.0], [1.0625], [-2.0], [0.3]], jnp.float32)
    q = self.variant(quantizers.quantize_fp8)(w)
    self.assertEqual(q.value.dtype, jnp.float8_e4m3fn)
    np.testing.assert_allclose(q.scale, [[1.0]], rtol=1e-6)
    np.testing.assert_array_equal(
      q.value.astype(jnp.float32)[:, 0], [448.0, 1.0, -2.0, 0.3125]
    )

  def test_subnormals(self):
    # Below 2^-6 e4m3 is subnormal, a fixed grid k·2^-9: 0.005 -> 3·2^-9,
    # 0.001 -> 1·2^-9 (0.000953 away, closer than 0).
    w = jnp.array([[448.0], [0.005], [0.001]], jnp.float32)
    q = quantizers.quantize_fp8(w)
    np.testing.assert_array_equal(
      q.value.astype(jnp.float32)[1:, 0], [3 * 2.0**-9, 2.0**-9]
    )

  def test_per_tensor_scale_shape(self):
    w = jnp.stack([jnp.eye(3) * 2.0, jnp.eye(3) * 4.0])
    q = quantizers.quantize_fp8(w, per_tensor=True)
    chex.assert_shape(q.scale, (2, 1, 1))
    np.testing.assert_allclose(q.scale[:, 0, 0], [2 / 448, 4 / 448], rtol=1e-6)

  @hypothesis.given(_kernels(), st.booleans())
  @_SETTINGS
  def test_error_within_e4m3_step(self, w, per_tensor):
    q = quantizers.quantize_fp8(jnp.asarray(w), per_tensor=per_tensor)
    s = np.asarray(q.scale)
    x = w / np.where(s == 0, 1, s)  # the value e4m3 rounded
    err = np.abs(np.asarray(quantizers.dequantize(q)) - w)
    normal = np.abs(x) >= 2.0**-6
    # 3 mantissa bits: half a step is 2^-4 relative for normals; subnormals
    # have a fixed spacing 2^-9, so at most 2^-10 * s absolute.
    bound = np.where(normal, 2.0**-4 * np.abs(w), 2.0**-10 * s)
    np.testing.assert_array_less(
      err, bound * (1 + 1e-5) + 1e-6 * np.abs(w) + 1e-30
    )


class ActivationQuantTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_int8_per_token(self):
    x = jnp.array([[0.0, 1.27, -0.634], [10.0, 4.0, 0.0]], jnp.float32)
    q, s = self.variant(qtensor.quantize_activations_int8)(x)
    np.testing.assert_allclose(s[:, 0], [0.01, 10 / 127], rtol=1e-6)
    np.testing.assert_array_equal(q, [[0, 127, -63], [127, 51, 0]])

  def test_fp8_per_token_max_is_448(self):
    x = jnp.array([[1.0, -2.0], [3.0, 0.5]], jnp.float32)
    q, s = qtensor.quantize_activations_fp8(x)
    np.testing.assert_array_equal(
      jnp.max(jnp.abs(q.astype(jnp.float32)), -1), [448.0, 448.0]
    )


def _dot_operand_ranks(jaxpr) -> list[tuple[int, ...]]:
  """Operand ranks of every dot_general in `jaxpr`, nested ones included."""
  return [tuple(a.ndim for a in ops) for ops in jaxpr_util.dot_operands(jaxpr)]


class ContractLastTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # x [2, 1, 2] rows (1, 2) and (3, 4); w = [[1, 0, 2], [0, 1, 1]]:
    # (1, 2) -> (1, 2, 4), (3, 4) -> (3, 4, 10).
    x = jnp.array([[[1.0, 2.0]], [[3.0, 4.0]]])
    w = jnp.array([[1.0, 0.0, 2.0], [0.0, 1.0, 1.0]])
    y = self.variant(qtensor.contract_last)(x, w)
    np.testing.assert_array_equal(y, [[[1.0, 2.0, 4.0]], [[3.0, 4.0, 10.0]]])

  def test_out_dtype_and_2d_input(self):
    x = jnp.ones((3, 4), jnp.bfloat16)
    w = jnp.ones((4, 5), jnp.bfloat16)
    y = qtensor.contract_last(x, w, jnp.float32)
    self.assertEqual((y.shape, y.dtype), ((3, 5), jnp.float32))
    np.testing.assert_array_equal(y, np.full((3, 5), 4.0))

  def test_weight_gradient_is_a_2d_dot(self):
    # The reason for the function: with [b, t, in] activations the weight
    # gradient must contract one flattened rows axis (a 2-D dot), not
    # (b, t) together, which XLA:CPU fed with a slow strided 3-D transpose.
    x = jnp.ones((4, 6, 8))
    w = jnp.ones((8, 5))
    grad = jax.grad(lambda w: jnp.sum(qtensor.qdot(x, w) ** 2))
    ranks = _dot_operand_ranks(jax.make_jaxpr(grad)(w).jaxpr)
    self.assertNotEmpty(ranks)
    self.assertTrue(all(r == (2, 2) for r in ranks), ranks)


def _dot_operand_dtypes(jaxpr) -> list[tuple[str, ...]]:
  """Operand dtypes of every dot_general in `jaxpr`, nested ones included."""
  return [
    tuple(str(a.dtype) for a in ops) for ops in jaxpr_util.dot_operands(jaxpr)
  ]


_EPS10 = 2.0**-10  # 1 + 2^-10 rounds to 1 in bf16 (7 mantissa bits)


class Bf16DotTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_forward(self):
    # x = (1 + 2^-10, 2) rounds to (1, 2); w = (2, 3)ᵀ: y = 1·2 + 2·3 = 8,
    # where the float32 dot would give 8.00195.
    x = jnp.array([[[1.0 + _EPS10, 2.0]]], jnp.float32)
    w = jnp.array([[2.0], [3.0]], jnp.bfloat16)
    y = self.variant(qtensor.bf16_dot)(x, w)
    self.assertEqual((y.shape, y.dtype), ((1, 1, 1), jnp.float32))
    np.testing.assert_array_equal(y, [[[8.0]]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_gradients(self):
    # L = c·y with c = 1 + 2^-10, which rounds to 1 in bf16:
    #   dx = bf16(c)·wᵀ = (2, 3)      (float32 autodiff: 2.002, 3.003)
    #   dw = bf16(x)ᵀ·bf16(c) = (1, 2)ᵀ, in w's dtype bf16.
    x = jnp.array([[1.0 + _EPS10, 2.0]], jnp.float32)
    w = jnp.array([[2.0], [3.0]], jnp.bfloat16)
    c = 1.0 + _EPS10
    loss = lambda x, w: c * jnp.sum(qtensor.bf16_dot(x, w))
    dx, dw = self.variant(jax.grad(loss, argnums=(0, 1)))(x, w)
    self.assertEqual((dx.dtype, dw.dtype), (jnp.float32, jnp.bfloat16))
    np.testing.assert_array_equal(dx, [[2.0, 3.0]])
    np.testing.assert_array_equal(dw.astype(jnp.float32), [[1.0], [2.0]])

  def test_bf16_inputs_give_bf16_input_gradient(self):
    x = jnp.ones((2, 4), jnp.bfloat16)
    w = jnp.ones((4, 3), jnp.bfloat16)
    dx = jax.grad(lambda x: jnp.sum(qtensor.bf16_dot(x, w)))(x)
    self.assertEqual(dx.dtype, jnp.bfloat16)
    np.testing.assert_array_equal(dx.astype(jnp.float32), np.full((2, 4), 3.0))

  def test_every_dot_of_the_gradient_is_bf16_and_2d(self):
    # The reason for the custom gradient: autodiff of the mixed dot turned
    # both backward dots into float32 dots, off the bf16 dot units. Through
    # qdot, as the decoder calls it (bf16 kernel, float32 activations).
    x = jnp.ones((4, 6, 8), jnp.float32)
    w = jnp.ones((8, 5), jnp.bfloat16)
    grad = jax.grad(
      lambda x, w: jnp.sum(qtensor.qdot(x, w) ** 2), argnums=(0, 1)
    )
    jaxpr = jax.make_jaxpr(grad)(x, w).jaxpr
    dtypes = _dot_operand_dtypes(jaxpr)
    self.assertLen(dtypes, 3)  # forward, dx, dw
    self.assertTrue(all(d == ("bfloat16",) * 2 for d in dtypes), dtypes)
    ranks = _dot_operand_ranks(jaxpr)
    self.assertTrue(all(r == (2, 2) for r in ranks), ranks)

  @hypothesis.settings(max_examples=10, deadline=None)
  @hypothesis.given(
    rows=st.integers(1, 5),
    d_in=st.integers(1, 9),
    d_out=st.integers(1, 7),
    seed=st.integers(0, 2**16),
  )
  def test_equals_float32_math_on_rounded_operands(
    self, rows, d_in, d_out, seed
  ):
    # Products of bf16 values are exact in float32, so the forward and both
    # gradients equal float32 dots of the bf16-rounded x, w and g up to
    # accumulation order.
    kx, kw, kg = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (rows, d_in)) * 3.0
    w = jax.random.normal(kw, (d_in, d_out)).astype(jnp.bfloat16)
    g = jax.random.normal(kg, (rows, d_out))
    y, vjp = jax.vjp(qtensor.bf16_dot, x, w)
    dx, dw = vjp(g)
    r = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
    hi = jax.lax.Precision.HIGHEST
    np.testing.assert_allclose(
      y, jnp.dot(r(x), r(w), precision=hi), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
      dx, jnp.dot(r(g), r(w).T, precision=hi), rtol=1e-5, atol=1e-5
    )
    # dw is rounded to w's bf16 at the end: 2^-8 relative.
    np.testing.assert_allclose(
      dw.astype(jnp.float32),
      jnp.dot(r(x).T, r(g), precision=hi),
      rtol=2.0**-8,
      atol=1e-5,
    )


class QdotTest(parameterized.TestCase):
  def setUp(self):
    super().setUp()
    k1, k2 = jax.random.split(jax.random.key(0))
    self.x = jax.random.normal(k1, (3, 5, 64), jnp.float32)
    self.w = jax.random.normal(k2, (64, 48), jnp.float32) * 0.05
    self.ref = self.x @ self.w

  def _rel_err(self, y):
    return float(jnp.linalg.norm(y - self.ref) / jnp.linalg.norm(self.ref))

  @chex.variants(with_jit=True, without_jit=True)
  def test_int8_real_equals_fake(self):
    real = self.variant(qtensor.qdot)(self.x, quantizers.quantize_int8(self.w))
    fake = self.variant(qtensor.qdot)(
      self.x, quantizers.quantize_int8(self.w, fake=True)
    )
    # Integer partial sums stay below 2^24, so float32 accumulation is exact.
    np.testing.assert_allclose(real, fake, rtol=1e-6, atol=1e-7)

  @parameterized.parameters(("int8", 0.02), ("int8_wo", 0.01), ("fp8", 0.06))
  def test_approximates_float_matmul(self, mode, tol):
    y = qtensor.qdot(self.x, quantizers.quantize(self.w, mode))
    self.assertEqual(y.shape, self.ref.shape)
    err = self._rel_err(y)
    self.assertLess(err, tol)
    self.assertGreater(err, 0.0)  # it really went through the quantizer

  def test_float_kernel_is_plain_matmul(self):
    np.testing.assert_allclose(
      qtensor.qdot(self.x, self.w), self.ref, rtol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_bf16_kernel_under_f32_activations_is_a_bf16_dot(self):
    # Hand-computed: 1 + 2^-10 rounds to bf16 1.0 (8 significant bits), so
    # the mixed dot gives 1·1 + 1·1 = 2 exactly, accumulated in float32.
    x = jnp.array([[1.0 + 2.0**-10, 1.0]], jnp.float32)
    w = jnp.ones((2, 3), jnp.bfloat16)
    y = self.variant(qtensor.qdot)(x, w)
    self.assertEqual(y.dtype, jnp.float32)
    np.testing.assert_array_equal(y, np.full((1, 3), 2.0, np.float32))
    hlo = jax.jit(qtensor.qdot).lower(x, w).as_text()
    self.assertRegex(hlo, r"dot_general.*xbf16>.*xbf16>.*->.*xf32>")

  def test_keeps_activation_dtype(self):
    y = qtensor.qdot(
      self.x.astype(jnp.bfloat16), quantizers.quantize_int8(self.w)
    )
    self.assertEqual(y.dtype, jnp.bfloat16)

  def test_int8_uses_integer_dot(self):
    q = quantizers.quantize_int8(self.w)
    hlo = jax.jit(qtensor.qdot).lower(self.x, q).as_text()
    self.assertRegex(hlo, r"dot_general.*tensor<[0-9x]+xi8>.*->.*xi32>")

  def test_rejects_mismatched_shapes(self):
    with self.assertRaisesRegex(ValueError, "expected x"):
      qtensor.qdot(self.x[..., :10], quantizers.quantize_int8(self.w))

  def test_rejects_unknown_mode(self):
    q = QTensor(jnp.zeros((64, 48), jnp.int8), jnp.ones((1, 48)), mode="int4")
    with self.assertRaisesRegex(ValueError, "int4"):
      qtensor.qdot(self.x, q)


if __name__ == "__main__":
  pytest.main([__file__])
