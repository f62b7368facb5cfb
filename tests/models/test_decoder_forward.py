"""forward: causality, padding, remat, dtypes, QTensor kernels, Flax wrapper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.quant.qtensor import QTensor

CONFIG = models.tiny_config()
forward = jax.jit(
  models.forward,
  static_argnums=0,
  static_argnames=("remat", "return_hidden", "activation_dtype"),
)


def _tokens(b=2, t=7, seed=0, config=CONFIG):
  return jax.random.randint(
    jax.random.PRNGKey(seed), (b, t), 3, config.vocab_size, dtype=jnp.int32
  )


@pytest.fixture(scope="module")
def params(random_params):
  return random_params(CONFIG)


def test_shapes_and_dtype(params):
  logits, hidden = forward(CONFIG, params, _tokens(), return_hidden=True)
  assert logits.shape == (2, 7, CONFIG.vocab_size)
  assert logits.dtype == jnp.float32
  assert hidden.shape == (2, 7, CONFIG.hidden_size)


def test_causal(params):
  tokens = _tokens()
  changed = tokens.at[:, 4:].set(5)
  a, b = forward(CONFIG, params, tokens), forward(CONFIG, params, changed)
  np.testing.assert_allclose(a[:, :4], b[:, :4], atol=1e-6)
  assert np.abs(a[:, 4:] - b[:, 4:]).max() > 1e-3


def test_left_padding_matches_unpadded(params):
  tokens = _tokens(b=1, t=5)
  ref = forward(CONFIG, params, tokens)
  padded = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), tokens], axis=1)
  mask = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1]])
  out = forward(CONFIG, params, padded, mask)
  np.testing.assert_allclose(out[:, 3:], ref, atol=1e-5)
  # Without the mask the pads are attended to and positions shift.
  assert np.abs(forward(CONFIG, params, padded)[:, 3:] - ref).max() > 1e-3


def test_positions_from_mask():
  mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(
    models.positions_from_mask(mask), [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
  )


def test_positions_are_relative(params):
  tokens = _tokens(b=1, t=4)
  a = forward(CONFIG, params, tokens)
  # RoPE scores depend on position differences only: a uniform shift is a
  # no-op, a gap between tokens is not.
  shifted = forward(CONFIG, params, tokens, positions=jnp.arange(4)[None] + 10)
  np.testing.assert_allclose(a, shifted, atol=1e-4)
  gapped = forward(CONFIG, params, tokens, positions=jnp.array([[0, 1, 5, 6]]))
  np.testing.assert_allclose(a[:, :2], gapped[:, :2], atol=1e-4)
  assert np.abs(a[:, 2:] - gapped[:, 2:]).max() > 1e-3


def test_remat_same_values_and_grads(params):
  tokens = _tokens()

  def loss(p, remat):
    return jnp.mean(models.forward(CONFIG, p, tokens, remat=remat) ** 2)

  g0 = jax.jit(jax.grad(loss), static_argnums=1)(params, False)
  g1 = jax.jit(jax.grad(loss), static_argnums=1)(params, True)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g0, g1)


@pytest.mark.parametrize("num_layers, loops", [(4, False), (5, True)])
def test_small_decoders_unroll_the_layer_loop(num_layers, loops):
  # Up to 4 layers the layer scan is unrolled (no stacked residual buffers
  # in the update step); deeper models keep the loop (compile time).
  config = models.tiny_config(num_layers=num_layers)
  params = models.init_params(config, jax.random.PRNGKey(0))
  hlo = (
    jax.jit(models.forward, static_argnums=0)
    .lower(config, params, _tokens())
    .as_text()
  )
  assert ("stablehlo.while" in hlo) == loops


class TestScanSaves:
  """A scanned decoder (more than 4 layers) saves what `decoder.SCAN_SAVES`
  names for its backward pass and recomputes the rest."""

  config = models.tiny_config(num_layers=5)

  def _vjp(self, tokens):
    params = models.init_params(self.config, jax.random.PRNGKey(0))
    loss = lambda p: jnp.sum(models.forward(self.config, p, tokens) ** 2)
    return params, loss, jax.vjp(loss, params)[1]

  def test_attention_probabilities_are_not_saved(self):
    t = 7
    _, _, vjp = self._vjp(_tokens(t=t, config=self.config))
    # Residuals are the leaves of the VJP closure; the scan stacks each over
    # the layer axis. The [L, B, Hkv, G, T, T] probabilities are recomputed.
    square = [
      x.shape
      for x in jax.tree.leaves(vjp)
      if x.ndim >= 3
      and x.shape[0] == self.config.num_layers
      and x.shape[-2:] == (t, t)
    ]
    assert not square

  def test_saves_less_than_saving_everything(self, monkeypatch):
    tokens = _tokens(t=7, config=self.config)
    size = lambda vjp: sum(x.nbytes for x in jax.tree.leaves(vjp))
    kept = size(self._vjp(tokens)[2])
    monkeypatch.setattr(models.decoder, "SCAN_SAVES", None)
    assert kept < 0.8 * size(self._vjp(tokens)[2])

  def test_gradient_equals_saving_everything(self, monkeypatch):
    params, loss, _ = self._vjp(_tokens(t=9, config=self.config))
    # Fresh jit per policy: SCAN_SAVES is read when the function is traced.
    g = jax.jit(jax.grad(loss))(params)
    monkeypatch.setattr(models.decoder, "SCAN_SAVES", None)
    g_all = jax.jit(jax.grad(loss))(params)
    # The same math in another order of float32 operations: equal to a few
    # ulps of each leaf's largest entry.
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_all)):
      scale = float(np.abs(b).max())
      assert scale > 0
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale)


def test_bf16_params_run_in_bf16_and_return_f32(params):
  p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  logits, hidden = forward(CONFIG, p16, _tokens(), return_hidden=True)
  assert hidden.dtype == jnp.bfloat16 and logits.dtype == jnp.float32
  ref = forward(CONFIG, params, _tokens())
  assert np.abs(logits - ref).max() < 0.2  # bf16 rounding, not garbage


def test_bf16_params_with_f32_activations(params):
  # bf16 weights under float32 activations (the CPU "bf16" rollout): the
  # residual stream stays float32 (another function than the all-bf16
  # forward of the same weights), near the float32 model.
  p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  logits, hidden = forward(
    CONFIG, p16, _tokens(), return_hidden=True, activation_dtype=jnp.float32
  )
  assert hidden.dtype == jnp.float32 and logits.dtype == jnp.float32
  ref = forward(CONFIG, params, _tokens())
  all_bf16 = forward(CONFIG, p16, _tokens())
  assert 0 < float(np.abs(logits - ref).max()) < 0.2
  assert float(np.abs(logits - all_bf16).max()) > 1e-3


def test_bf16_head_rounds_f32_hidden_states():
  # Hand-computed: hidden 1 + 2^-10 is not a bf16 value (8 significant
  # bits); the bf16 kernel's dot takes bf16(hidden) = 1, accumulating in f32.
  config = models.tiny_config(hidden_size=2, tie_word_embeddings=False)
  hidden = jnp.array([[1.0 + 2.0**-10, 1.0]], jnp.float32)
  kernel = jnp.ones((2, config.vocab_size), jnp.bfloat16)
  logits = models.logits_from_hidden(
    config, {"lm_head": {"kernel": kernel}}, hidden
  )
  assert logits.dtype == jnp.float32
  np.testing.assert_array_equal(logits, np.full((1, config.vocab_size), 2.0))


def test_tied_embeddings(random_params):
  config = models.tiny_config(tie_word_embeddings=True)
  p = random_params(config)
  assert "lm_head" not in p
  logits, hidden = forward(config, p, _tokens(), return_hidden=True)
  np.testing.assert_allclose(
    logits, hidden @ p["embed"]["embedding"].T, atol=1e-5
  )


def test_qtensor_kernels_plug_in(params):
  # int8 weight-only kernels through qdot == the dequantized float kernels.
  def quantize(kernel):
    scale = jnp.max(jnp.abs(kernel), axis=-2, keepdims=True) / 127.0
    value = jnp.round(kernel / scale).astype(jnp.int8)
    return QTensor(value=value, scale=scale, mode="int8_wo")

  qlayers = dict(params["layers"])
  for name in (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
  ):
    qlayers[name] = dict(
      qlayers[name], kernel=quantize(qlayers[name]["kernel"])
    )
  qparams = dict(
    params,
    layers=qlayers,
    lm_head={"kernel": quantize(params["lm_head"]["kernel"])},
  )
  deq = jax.tree.map(
    lambda x: x.dequantize() if isinstance(x, QTensor) else x,
    qparams,
    is_leaf=lambda x: isinstance(x, QTensor),
  )
  tokens = _tokens()
  np.testing.assert_allclose(
    forward(CONFIG, qparams, tokens), forward(CONFIG, deq, tokens), atol=1e-4
  )
  assert (
    np.abs(
      forward(CONFIG, qparams, tokens) - forward(CONFIG, params, tokens)
    ).max()
    > 1e-5
  )


def test_flax_wrapper_matches_pure_function():
  module = models.Decoder(CONFIG)
  tokens = _tokens()
  variables = jax.jit(module.init)(jax.random.PRNGKey(0), tokens)
  p = variables["params"]
  assert jax.tree.structure(p) == jax.tree.structure(
    jax.eval_shape(lambda: models.init_params(CONFIG, jax.random.PRNGKey(0)))
  )
  np.testing.assert_allclose(
    jax.jit(module.apply)(variables, tokens),
    forward(CONFIG, p, tokens),
    atol=1e-6,
  )


@pytest.mark.parametrize(
  "kwargs, error, message",
  [
    ({"tokens": jnp.ones((2, 3))}, TypeError, "integer"),
    ({"tokens": jnp.ones((3,), jnp.int32)}, ValueError, r"\[B, T\]"),
    ({"attention_mask": jnp.ones((2, 4))}, ValueError, "attention_mask"),
    ({"positions": jnp.ones((1, 3), jnp.int32)}, ValueError, "positions"),
  ],
)
def test_bad_inputs(params, kwargs, error, message):
  args = {"tokens": jnp.ones((2, 3), jnp.int32)}
  args.update(kwargs)
  with pytest.raises(error, match=message):
    models.forward(CONFIG, params, **args)


def test_params_that_do_not_fit_the_config_are_named(params):
  wrong = models.tiny_config(num_layers=3)
  with pytest.raises(
    ValueError,
    match=r"\['attn_norm'\]\['scale'\] has shape "
    r"\(2, 32\); expected \(3, 32\)",
  ):
    models.forward(wrong, params, jnp.ones((1, 2), jnp.int32))
  with pytest.raises(KeyError, match="lm_head"):
    models.forward(
      CONFIG,
      {k: v for k, v in params.items() if k != "lm_head"},
      jnp.ones((1, 2), jnp.int32),
    )
