"""token_logprobs / logprobs_from_logits: values, temperature, chunking, grads."""

import functools
import math

import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models

CONFIG = models.tiny_config()


class LogprobsFromLogitsTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # probs [1/4, 3/4]: logp of token 1 = log 3/4, H = -(1/4 log 1/4 + ...).
    logits = jnp.array([[0.0, math.log(3.0)]])
    logp, ent = self.variant(models.logprobs_from_logits)(
      logits, jnp.array([1])
    )
    np.testing.assert_allclose(logp, [math.log(0.75)], rtol=1e-6)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    np.testing.assert_allclose(ent, [h], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_temperature(self):
    # τ = 2 halves the logits: [0, ln 9] -> [0, ln 3].
    logits = jnp.array([[0.0, math.log(9.0)]])
    logp, _ = self.variant(models.logprobs_from_logits)(
      logits, jnp.array([1]), 2.0
    )
    np.testing.assert_allclose(logp, [math.log(0.75)], rtol=1e-6)

  def test_bad_temperature(self):
    with pytest.raises(ValueError, match="temperature=0"):
      models.logprobs_from_logits(jnp.zeros((1, 2)), jnp.array([0]), 0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_gradient(self):
    # p = [1/4, 3/4], y = 1: ∂logp/∂z = 1[v=y] − p = [−1/4, 1/4];
    # ∂H/∂z_v = −p_v (z_v − E_p z) with E_p z = (3/4) ln 3.
    logits = jnp.array([[0.0, math.log(3.0)]])
    y = jnp.array([1])
    g_logp = self.variant(
      jax.grad(lambda z: models.logprobs_from_logits(z, y)[0].sum())
    )(logits)
    np.testing.assert_allclose(g_logp, [[-0.25, 0.25]], rtol=1e-6)
    g_ent = self.variant(
      jax.grad(lambda z: models.logprobs_from_logits(z, y)[1].sum())
    )(logits)
    mean = 0.75 * math.log(3.0)
    expected = [-0.25 * (0.0 - mean), -0.75 * (math.log(3.0) - mean)]
    np.testing.assert_allclose(g_ent, [expected], rtol=1e-5, atol=1e-7)

  @hypothesis.settings(max_examples=30, deadline=None)
  @hypothesis.given(
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([0.1, 1.0, 10.0, 60.0]),
    temperature=st.sampled_from([0.5, 1.0, 1.7]),
  )
  def test_matches_autodiff_of_the_textbook_formula(
    self, seed, scale, temperature
  ):
    # Values and vector-Jacobian products equal those of log_softmax +
    # take_along_axis + −Σ p log p differentiated by JAX, for any
    # cotangents, including near-one-hot rows (scale 60); H stays ≥ 0.
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    logits = jax.random.normal(k[0], (3, 4, 37)) * scale
    y = jax.random.randint(k[1], (3, 4), 0, 37)
    w_logp, w_ent = (
      jax.random.normal(k[2], (3, 4)),
      jax.random.normal(k[3], (3, 4)),
    )

    def textbook(z):
      lp = jax.nn.log_softmax(z / temperature, axis=-1)
      logp = jnp.take_along_axis(lp, y[..., None], axis=-1)[..., 0]
      return logp, -jnp.sum(jnp.exp(lp) * lp, axis=-1)

    def fused(z):
      return models.logprobs_from_logits(z, y, temperature)

    def objective(fn):
      return lambda z: jnp.sum(w_logp * fn(z)[0] + w_ent * fn(z)[1])

    (a_logp, a_ent), (b_logp, b_ent) = fused(logits), textbook(logits)
    np.testing.assert_allclose(a_logp, b_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a_ent, b_ent, rtol=1e-4, atol=1e-5)
    assert float(a_ent.min()) >= 0.0
    np.testing.assert_allclose(
      jax.grad(objective(fused))(logits),
      jax.grad(objective(textbook))(logits),
      rtol=1e-4,
      atol=1e-5,
    )

  def test_backward_has_no_scatter(self):
    # The point of the hand-written gradient: no [.., V] zero-fill + scatter
    # (take_along_axis's autodiff), one fused elementwise pass instead.
    y = jnp.array([[1, 2]])
    grad = jax.grad(lambda z: models.logprobs_from_logits(z, y)[0].sum())
    hlo = jax.jit(grad).lower(jnp.zeros((1, 2, 8))).as_text()
    assert "scatter" not in hlo


@pytest.fixture(scope="module")
def params(random_params):
  return random_params(CONFIG)


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, CONFIG.vocab_size, (2, 11)).astype(np.int32)
  mask = np.ones_like(tokens)
  tokens[1, :2], mask[1, :2] = 0, 0
  return jnp.asarray(tokens), jnp.asarray(mask)


logprobs = jax.jit(
  models.token_logprobs, static_argnums=(0, 5), static_argnames=("remat",)
)


def test_matches_direct_computation(params, batch):
  tokens, mask = batch
  logp, ent = logprobs(CONFIG, params, tokens, mask, 0.7, None)
  logits = models.forward(CONFIG, params, tokens, mask) / 0.7
  log_p = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  expected = np.take_along_axis(
    np.asarray(log_p), np.asarray(tokens)[:, 1:, None], -1
  )[..., 0]
  expected_ent = -np.sum(np.exp(log_p) * log_p, axis=-1)
  assert logp.shape == ent.shape == (2, 10)
  np.testing.assert_allclose(logp, expected, atol=1e-5)
  np.testing.assert_allclose(ent, expected_ent, atol=1e-5)
  assert np.all(np.asarray(ent) <= math.log(CONFIG.vocab_size) + 1e-5)


def test_temperature_changes_values(params, batch):
  tokens, mask = batch
  a, ea = logprobs(CONFIG, params, tokens, mask, 1.0, None)
  b, eb = logprobs(CONFIG, params, tokens, mask, 2.0, None)
  assert np.abs(a - b).max() > 1e-3
  assert np.all(np.asarray(eb) > np.asarray(ea))  # hotter = flatter


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 10, 64])
def test_chunked_equals_unchunked(params, batch, chunk_size):
  tokens, mask = batch
  ref = logprobs(CONFIG, params, tokens, mask, 0.9, None)
  out = logprobs(CONFIG, params, tokens, mask, 0.9, chunk_size)
  for r, o in zip(ref, out):
    np.testing.assert_allclose(o, r, atol=1e-6)


def test_chunked_gradients_equal_unchunked(params, batch):
  tokens, mask = batch
  weights = jnp.asarray(
    np.random.default_rng(1).standard_normal((2, 10)), jnp.float32
  )

  def loss(p, chunk_size):
    logp, ent = models.token_logprobs(CONFIG, p, tokens, mask, 1.0, chunk_size)
    return jnp.sum(weights * logp) + 0.1 * jnp.sum(ent)

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  g_ref, g_chunk = grad(params, None), grad(params, 4)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g_ref, g_chunk
  )
  assert float(jnp.abs(g_ref["lm_head"]["kernel"]).max()) > 0


def test_traced_temperature(params, batch):
  tokens, mask = batch
  f = jax.jit(
    lambda t: models.token_logprobs(CONFIG, params, tokens, mask, t)[0]
  )
  np.testing.assert_allclose(
    f(jnp.float32(0.5)),
    logprobs(CONFIG, params, tokens, mask, 0.5, None)[0],
    rtol=1e-5,  # jitted vs eager: float32 summation order only
    atol=1e-6,
  )


@pytest.mark.parametrize("start, chunk_size", [(1, None), (4, None), (9, 3)])
def test_start_computes_the_later_columns_only(
  params, batch, start, chunk_size
):
  # Columns >= start equal the full computation's; earlier ones are 0.
  tokens, mask = batch
  full = logprobs(CONFIG, params, tokens, mask, 0.8, None)
  f = jax.jit(
    functools.partial(models.token_logprobs, CONFIG, start=start),
    static_argnums=(4,),
  )
  part = f(params, tokens, mask, 0.8, chunk_size)
  for a, b in zip(full, part):
    assert b.shape == a.shape == (2, 10)
    np.testing.assert_allclose(b[:, start:], a[:, start:], atol=1e-6)
    np.testing.assert_array_equal(b[:, :start], 0.0)


def test_start_gives_the_gradients_of_a_loss_masked_before_it(params, batch):
  # A loss that reads only columns >= start (an RL loss masks the prompt)
  # has the same gradient with the head skipping the columns before.
  tokens, mask = batch
  start = 5
  weights = np.random.default_rng(2).standard_normal((2, 10))
  weights[:, :start] = 0.0
  weights = jnp.asarray(weights, jnp.float32)

  def loss(p, s):
    logp, ent = models.token_logprobs(CONFIG, p, tokens, mask, 1.0, start=s)
    return jnp.sum(weights * logp) + 0.1 * jnp.sum((weights != 0) * ent)

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  g_full, g_part = grad(params, 0), grad(params, start)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g_full, g_part
  )
  assert float(jnp.abs(g_full["lm_head"]["kernel"]).max()) > 0


def _wide_head_model():
  """A 1-layer model whose 8192-word head dominates it, as abstract params
  (compiled-program tests: nothing runs)."""
  config = models.tiny_config(vocab_size=8192, num_layers=1)
  params = jax.eval_shape(
    lambda: models.init_params(config, jax.random.PRNGKey(0))
  )
  return config, params


def test_start_skips_the_head_on_earlier_columns():
  # The saving is real: the compiled program's FLOPs drop by about the head's
  # share of the skipped columns (an 8192-word head on 1 small layer).
  config, params = _wide_head_model()
  tokens = jax.ShapeDtypeStruct((2, 128), jnp.int32)

  def flops(start):
    fn = lambda p, t: models.token_logprobs(config, p, t, start=start)[0]
    cost = jax.jit(fn).lower(params, tokens).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    if not cost or "flops" not in cost:
      pytest.skip("backend has no cost analysis")
    return cost["flops"]

  assert flops(95) < 0.5 * flops(0)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"tokens": jnp.ones((2, 1), jnp.int32)}, "T >= 2"),
    ({"chunk_size": 0}, "chunk_size=0"),
    ({"temperature": -1.0}, "temperature=-1.0"),
    ({"start": 3}, r"start=3; expected an int in \[0, 3\)"),
    ({"start": -1}, "start=-1"),
  ],
)
def test_bad_inputs(params, kwargs, message):
  args = {"tokens": jnp.ones((2, 4), jnp.int32)}
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    models.token_logprobs(CONFIG, params, **args)


def test_chunking_shrinks_compiled_memory():
  # [B, T, V] float32 logits (and their gradient) dominate the unchunked
  # program's temporaries; chunks of 64 positions should cut them well down.
  config, params = _wide_head_model()
  tokens = jax.ShapeDtypeStruct((2, 256), jnp.int32)

  def temp_bytes(chunk_size):
    grad = jax.grad(
      lambda p, t: models.token_logprobs(config, p, t, chunk_size=chunk_size)[
        0
      ].sum()
    )
    analysis = jax.jit(grad).lower(params, tokens).compile().memory_analysis()
    if analysis is None:
      pytest.skip("backend has no memory analysis")
    return analysis.temp_size_in_bytes

  logits_bytes = 2 * 255 * 8192 * 4
  assert temp_bytes(None) - temp_bytes(64) > 2 * logits_bytes
