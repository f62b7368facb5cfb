"""QuRL Appendix A diagnostics (rljax.quant.diagnostics)."""

import math

from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import quant

import quant_testing


def _tree(q_kernel, o_kernel=None):
  layers = {"q_proj": {"kernel": jnp.asarray(q_kernel, jnp.float32)}}
  if o_kernel is not None:
    layers["o_proj"] = {"kernel": jnp.asarray(o_kernel, jnp.float32)}
  return {"layers": layers}


def _quantize_all(tree):
  return {
    "layers": {
      n: {"kernel": quant.quantize_int8(m["kernel"])}
      for n, m in tree["layers"].items()
    }
  }


class NormalizedWeightUpdateTest(parameterized.TestCase):
  def test_hand_computed(self):
    prev = {"a": jnp.array([3.0, 4.0]), "b": {"c": jnp.zeros((2,))}}
    new = {"a": jnp.array([3.0, 5.0]), "b": {"c": jnp.array([0.0, 2.0])}}
    # (1² + 2²) / (3² + 4²) = 5 / 25
    self.assertAlmostEqual(
      float(quant.normalized_weight_update(prev, new)), 0.2, places=6
    )

  def test_zero_for_equal_trees(self):
    prev = {"a": jnp.arange(4.0)}
    self.assertEqual(float(quant.normalized_weight_update(prev, prev)), 0.0)

  def test_bad_inputs(self):
    with self.assertRaisesRegex(ValueError, "tree structures"):
      quant.normalized_weight_update({"a": jnp.ones(2)}, {"b": jnp.ones(2)})
    with self.assertRaisesRegex(ValueError, "shapes differ"):
      quant.normalized_weight_update({"a": jnp.ones(2)}, {"a": jnp.ones(3)})
    q = quant.quantize_int8(jnp.ones((2, 2)))
    with self.assertRaisesRegex(TypeError, "QTensor"):
      quant.normalized_weight_update({"a": q}, {"a": q})


class NormalizedQuantErrorTest(parameterized.TestCase):
  def test_hand_computed(self):
    # One channel, s = 127 / 127 = 1: 0.4 rounds to 0, error 0.4.
    w = _tree([[[127.0], [0.4]]])
    err = quant.normalized_quant_error(w, _quantize_all(w))
    self.assertAlmostEqual(float(err), 0.16 / (127.0**2 + 0.16), delta=1e-12)

  def test_per_layer_breakdown(self):
    # Layer 0 is exact on the grid; layer 1 has error 0.4 on 127²+0.4².
    q_kernel = [[[127.0], [1.0]], [[127.0], [0.4]]]
    o_kernel = [[[2.0, 1.0]], [[2.0, 1.0]]]
    w = _tree(q_kernel, o_kernel)
    per = quant.normalized_quant_error_per_layer(w, _quantize_all(w))
    self.assertEqual(set(per), {"layers/q_proj/kernel", "layers/o_proj/kernel"})
    np.testing.assert_allclose(
      per["layers/q_proj/kernel"],
      [0.0, 0.16 / (127.0**2 + 0.16)],
      rtol=1e-5,
      atol=1e-12,
    )
    np.testing.assert_allclose(
      per["layers/o_proj/kernel"], [0.0, 0.0], atol=1e-12
    )
    total = quant.normalized_quant_error(w, _quantize_all(w))
    np.testing.assert_allclose(
      total, 0.16 / (2 * 127.0**2 + 1.0 + 0.16 + 2 * 5.0), rtol=1e-5
    )

  def test_only_quantized_kernels_count(self):
    w = _tree([[[127.0], [0.4]]], [[[1.0, 3.3]]])
    q = {
      "layers": {
        "q_proj": {
          "kernel": quant.quantize_int8(w["layers"]["q_proj"]["kernel"])
        },
        "o_proj": w["layers"]["o_proj"],
      }
    }
    self.assertAlmostEqual(
      float(quant.normalized_quant_error(w, q)),
      0.16 / (127.0**2 + 0.16),
      delta=1e-12,
    )

  def test_mismatched_trees(self):
    w = _tree([[[1.0], [2.0]]])
    with self.assertRaisesRegex(ValueError, "no QTensor"):
      quant.normalized_quant_error(w, w)
    other = _tree([[[1.0], [2.0], [3.0]]])
    with self.assertRaisesRegex(ValueError, "shape"):
      quant.normalized_quant_error(w, _quantize_all(other))


class QuantizedChangeFractionTest(parameterized.TestCase):
  def test_hand_computed(self):
    before = _tree([[[127.0, 127.0], [10.0, 20.0]]])
    after = _tree([[[127.0, 127.0], [10.0, 21.0]]])  # one code of four moves
    frac = quant.quantized_change_fraction(
      _quantize_all(before), _quantize_all(after)
    )
    self.assertAlmostEqual(float(frac), 0.25)

  def test_rounded_away_change_is_invisible(self):
    before = _tree([[[127.0], [10.0]]])
    after = _tree([[[127.0], [10.3]]])  # still rounds to 10
    self.assertEqual(
      float(
        quant.quantized_change_fraction(
          _quantize_all(before), _quantize_all(after)
        )
      ),
      0.0,
    )

  def test_scale_change_alone_is_not_counted(self):
    before = _tree([[[127.0], [0.0]]])
    after = _tree([[[127.2], [0.0]]])  # new scale, same codes (127, 0)
    self.assertEqual(
      float(
        quant.quantized_change_fraction(
          _quantize_all(before), _quantize_all(after)
        )
      ),
      0.0,
    )

  def test_fp8_codes_compare_by_their_bits(self):
    # 0.5 and 0.5625 are neighbouring e4m3 codes, less than 1 apart as
    # values: a count of value differences rounded to 0 or 1 would miss it.
    def fp8(values):
      v = jnp.asarray([values], jnp.float8_e4m3fn)
      return {"k": quant.QTensor(v, jnp.ones((1, 1, 2)), mode="fp8")}

    frac = quant.quantized_change_fraction(
      fp8([[0.5, 2.0]]), fp8([[0.5625, 2.0]])
    )
    self.assertEqual(float(frac), 0.5)

  @hypothesis.settings(max_examples=25, deadline=None)
  @hypothesis.given(
    codes=hnp.arrays(
      np.int8,
      hnp.array_shapes(min_dims=2, max_dims=3, max_side=9),
      elements=st.integers(-128, 127),
    ),
    seed=st.integers(0, 2**31 - 1),
  )
  def test_equals_the_share_of_unequal_codes(self, codes, seed):
    # Any pair of codes, the extremes included (|-128 - 127| = 255).
    rng = np.random.default_rng(seed)
    other = np.where(
      rng.random(codes.shape) < 0.3,
      rng.integers(-128, 128, codes.shape),
      codes,
    ).astype(np.int8)

    def tree(c):
      scale = jnp.ones((*c.shape[:-2], 1, c.shape[-1]))
      return {"k": quant.QTensor(jnp.asarray(c), scale)}

    frac = quant.quantized_change_fraction(tree(codes), tree(other))
    self.assertAlmostEqual(
      float(frac), float(np.mean(codes != other)), places=6
    )

  def test_different_kernels_is_an_error(self):
    a = _quantize_all(_tree([[[1.0]]]))
    b = _quantize_all(_tree([[[1.0]]], [[[1.0]]]))
    with self.assertRaisesRegex(ValueError, "different kernels"):
      quant.quantized_change_fraction(a, b)


class SyncDiagnosticsTest(parameterized.TestCase):
  @parameterized.parameters("int8", "fp8")
  def test_two_syncs(self, mode):
    config, params = quant_testing.tiny_model()
    diag = quant.SyncDiagnostics()
    q0 = quant.quantize_params(config, params, mode)
    first = diag(params, q0)
    self.assertTrue(all(isinstance(v, float) for v in first.values()))
    self.assertTrue(math.isnan(first["quant/normalized_weight_update"]))
    self.assertAlmostEqual(
      first["quant/normalized_quant_error"],
      float(quant.normalized_quant_error(params, q0)),
      places=9,
    )
    self.assertIn("quant/normalized_quant_error/down_proj", first)

    layers = dict(params["layers"])
    up = layers["up_proj"]["kernel"]
    # A uniform rescaling would move no code (the scales follow); add noise.
    layers["up_proj"] = {
      "kernel": up + 1e-3 * jax.random.normal(jax.random.key(7), up.shape)
    }
    new = dict(params, layers=layers)
    q1 = quant.quantize_params(config, new, mode)
    second = diag(new, q1)
    kernels = [("layers", n, "kernel") for n in quant.LAYER_KERNELS]

    def select(tree):
      return {"/".join(p): tree[p[0]][p[1]][p[2]] for p in kernels}

    kernel_update = float(
      quant.normalized_weight_update(select(params), select(new))
    )
    self.assertAlmostEqual(
      second["quant/normalized_kernel_update"], kernel_update, places=7
    )
    self.assertAlmostEqual(
      second["quant/normalized_weight_update"],
      float(quant.normalized_weight_update(params, new)),
      places=7,
    )
    self.assertAlmostEqual(
      second["quant/update_to_quant_error"],
      kernel_update / second["quant/normalized_quant_error"],
      places=5,
    )
    self.assertAlmostEqual(
      second["quant/quantized_change_fraction"],
      float(quant.quantized_change_fraction(q0, q1)),
      places=7,
    )
    # Noise of 1/20 of the weights' std moves some of up_proj's codes; up_proj
    # holds a quarter of the quantized weights of this config.
    self.assertBetween(second["quant/quantized_change_fraction"], 1e-3, 0.25)
    self.assertGreater(kernel_update, 0.0)

  def test_update_of_leaves_that_are_not_quantized(self):
    # Eq. 13 over all params counts the leaves that are not quantized too:
    # moving only the embedding moves the whole-tree update, not the kernel
    # update, and no code.
    config, params = quant_testing.tiny_model()
    diag = quant.SyncDiagnostics()
    diag(params, quant.quantize_params(config, params, "int8"))
    embed = params["embed"]["embedding"]
    new = dict(params, embed={"embedding": 1.1 * embed})
    second = diag(new, quant.quantize_params(config, new, "int8"))
    whole = float(quant.normalized_weight_update(params, new))
    self.assertGreater(whole, 0.0)
    self.assertAlmostEqual(
      second["quant/normalized_weight_update"], whole, delta=1e-6 * whole
    )
    self.assertEqual(second["quant/normalized_kernel_update"], 0.0)
    self.assertEqual(second["quant/update_to_quant_error"], 0.0)
    self.assertEqual(second["quant/quantized_change_fraction"], 0.0)

  def _moved(self, params, seed):
    def move(w):
      noise = jax.random.normal(jax.random.key(seed), w.shape, w.dtype)
      return w + 1e-2 * jnp.std(w) * noise

    return jax.tree.map(move, params)

  @parameterized.parameters("int8", "fp8")
  def test_later_syncs_compare_with_the_sync_before(self, mode):
    # From the second sync on, the kept θ and codes are written into the
    # buffers of the last copy: each sync must still see the one before it,
    # and the caller's own buffers may be donated (deleted) after each call.
    config, params = quant_testing.tiny_model()
    diag = quant.SyncDiagnostics()
    trees = [params] + [self._moved(params, s) for s in (1, 2, 3)]
    qtrees = [quant.quantize_params(config, t, mode) for t in trees]
    expected = [
      (
        float(quant.normalized_weight_update(a, b)),
        float(quant.quantized_change_fraction(qa, qb)),
      )
      for a, b, qa, qb in zip(trees, trees[1:], qtrees, qtrees[1:])
    ]
    got = []
    for t, q in zip(trees, qtrees):
      # What the update step's donation does to θ: the caller's copy is
      # gone once the sync has returned.
      mine = jax.tree.map(jnp.copy, t)
      out = diag(mine, q)
      jax.tree.map(lambda x: x.delete(), mine)
      got.append(
        (
          out["quant/normalized_weight_update"],
          out["quant/quantized_change_fraction"],
        )
      )
    for (update, changed), (want_update, want_changed) in zip(
      got[1:], expected
    ):
      self.assertAlmostEqual(update, want_update, delta=1e-6 * want_update)
      self.assertAlmostEqual(changed, want_changed, places=7)
    self.assertGreater(min(c for _, c in expected), 0.0)

  def test_the_kept_copy_reuses_its_buffers(self):
    # The copy kept for the next sync is written in place from the second
    # sync on (fresh pages made it 3-4x slower on a CPU).
    config, params = quant_testing.tiny_model()
    diag = quant.SyncDiagnostics()

    def pointers():
      leaves = jax.tree.leaves((diag._prev_params, diag._prev_codes))  # pylint: disable=protected-access
      return [x.unsafe_buffer_pointer() for x in leaves]

    seen = []
    for s in range(3):
      t = self._moved(params, s)
      diag(t, quant.quantize_params(config, t, "int8"))
      seen.append(pointers())
    self.assertEqual(seen[1], seen[2])
    self.assertEqual(seen[0], seen[1])

  def test_a_leaf_of_another_shape_is_named(self):
    config, params = quant_testing.tiny_model()
    diag = quant.SyncDiagnostics()
    diag(params, quant.quantize_params(config, params, "int8"))
    embed = params["embed"]["embedding"]
    other = dict(params, embed={"embedding": jnp.concatenate([embed, embed])})
    with self.assertRaisesRegex(ValueError, r"embed/embedding has shape"):
      diag(other, quant.quantize_params(config, other, "int8"))


if __name__ == "__main__":
  pytest.main([__file__])
