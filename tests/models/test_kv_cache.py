"""forward_with_cache: prefill + decode == one full forward (left padding)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import layers

CONFIG = models.tiny_config(arch="qwen2")  # biases exercise the cache path too
step = jax.jit(models.forward_with_cache, static_argnums=0)
forward = jax.jit(models.forward, static_argnums=0)


@pytest.fixture(scope="module")
def params(random_params):
  return random_params(CONFIG)


def _left_padded_batch():
  rng = np.random.default_rng(0)
  # Row 0: 3 pads + 9 tokens; row 1: no pads. 12 columns in all.
  tokens = rng.integers(3, CONFIG.vocab_size, (2, 12)).astype(np.int32)
  mask = np.ones((2, 12), np.int32)
  tokens[0, :3], mask[0, :3] = 0, 0
  return jnp.asarray(tokens), jnp.asarray(mask)


def test_init_cache_shape_and_dtype():
  cache = models.init_cache(CONFIG, batch=3, max_len=10, dtype=jnp.bfloat16)
  assert cache["k"].shape == (
    CONFIG.num_layers,
    3,
    10,
    CONFIG.num_kv_heads,
    CONFIG.head_dim,
  )
  assert cache["v"].dtype == jnp.bfloat16


@pytest.mark.parametrize("prefill_len", [5, 1])
def test_prefill_then_decode_equals_full_forward(params, prefill_len):
  tokens, mask = _left_padded_batch()
  b, t = tokens.shape
  positions = models.positions_from_mask(mask)
  full = forward(CONFIG, params, tokens, mask)

  max_len = t + 4  # spare slots stay invalid in kv_mask
  cache = models.init_cache(CONFIG, b, max_len)
  kv_mask = (
    jnp.zeros((b, max_len), bool)
    .at[:, :prefill_len]
    .set(mask[:, :prefill_len].astype(bool))
  )
  logits, cache = step(
    CONFIG,
    params,
    tokens[:, :prefill_len],
    positions[:, :prefill_len],
    cache,
    0,
    kv_mask,
  )
  outs = [logits]
  for i in range(prefill_len, t):  # one token at a time, traced write_index
    kv_mask = kv_mask.at[:, i].set(mask[:, i].astype(bool))
    logits, cache = step(
      CONFIG,
      params,
      tokens[:, i : i + 1],
      positions[:, i : i + 1],
      cache,
      jnp.int32(i),
      kv_mask,
    )
    outs.append(logits)
  incremental = jnp.concatenate(outs, axis=1)
  valid = np.asarray(mask, bool)
  np.testing.assert_allclose(
    np.asarray(incremental)[valid], np.asarray(full)[valid], atol=2e-5
  )


def test_chunked_prefill(params):
  tokens, mask = _left_padded_batch()
  b, t = tokens.shape
  positions = models.positions_from_mask(mask)
  full = forward(CONFIG, params, tokens, mask)
  cache = models.init_cache(CONFIG, b, t)
  kv_mask = mask.astype(bool)  # all slots known up front; causality by slot
  first, cache = step(
    CONFIG, params, tokens[:, :6], positions[:, :6], cache, 0, kv_mask
  )
  second, cache = step(
    CONFIG, params, tokens[:, 6:], positions[:, 6:], cache, 6, kv_mask
  )
  np.testing.assert_allclose(second[:, :], full[:, 6:], atol=2e-5)
  np.testing.assert_allclose(first[1], full[1, :6], atol=2e-5)


def test_last_only_prefill(params):
  # The last column's logits and the same cache as the full prefill.
  tokens, mask = _left_padded_batch()
  b, t = tokens.shape
  positions = models.positions_from_mask(mask)
  cache = models.init_cache(CONFIG, b, t)
  kv_mask = mask.astype(bool)
  full, full_cache = step(CONFIG, params, tokens, positions, cache, 0, kv_mask)
  last, last_cache = jax.jit(
    functools.partial(models.forward_with_cache, last_only=True),
    static_argnums=0,
  )(CONFIG, params, tokens, positions, cache, 0, kv_mask)
  assert last.shape == (b, 1, CONFIG.vocab_size)
  np.testing.assert_allclose(last[:, 0], full[:, -1], atol=1e-6)
  for key in ("k", "v"):
    np.testing.assert_array_equal(last_cache[key], full_cache[key])


def test_last_only_prefill_skips_the_head_on_other_columns():
  # The saving is real: XLA does not sink the slice of the logits into the
  # head's matmul by itself, the flag does (an 8192-word head, 1 layer).
  config = models.tiny_config(vocab_size=8192, num_layers=1)
  params = jax.eval_shape(
    lambda: models.init_params(config, jax.random.PRNGKey(0))
  )
  b, t = 4, 64
  head = 2 * b * t * config.hidden_size * config.vocab_size

  def flops(last_only):
    def prefill(p, tokens):
      cache = models.init_cache(config, b, t)
      positions = jnp.broadcast_to(jnp.arange(t), (b, t))
      logits, _ = models.forward_with_cache(
        config, p, tokens, positions, cache, 0, jnp.ones((b, t), bool),
        last_only=last_only,
      )  # fmt: skip
      return logits[:, -1]

    tokens = jax.ShapeDtypeStruct((b, t), jnp.int32)
    cost = jax.jit(prefill).lower(params, tokens).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    if not cost or "flops" not in cost:
      pytest.skip("backend has no cost analysis")
    return cost["flops"]

  saved = flops(False) - flops(True)
  assert saved > 0.9 * head * (t - 1) / t


def test_cache_is_written_at_write_index(params):
  cache = models.init_cache(CONFIG, 1, 8)
  tokens = jnp.array([[5, 6]], jnp.int32)
  _, new = step(
    CONFIG,
    params,
    tokens,
    jnp.array([[0, 1]]),
    cache,
    3,
    jnp.ones((1, 8), bool),
  )
  written = np.abs(np.asarray(new["k"])).sum(axis=(0, 1, 3, 4)) > 0
  np.testing.assert_array_equal(written, [0, 0, 0, 1, 1, 0, 0, 0])


def test_bf16_cache(params):
  tokens, mask = _left_padded_batch()
  cache = models.init_cache(CONFIG, 2, 12, jnp.bfloat16)
  logits, cache = step(
    CONFIG,
    params,
    tokens,
    models.positions_from_mask(mask),
    cache,
    0,
    mask.astype(bool),
  )
  assert cache["k"].dtype == jnp.bfloat16 and logits.dtype == jnp.float32
  full = forward(CONFIG, params, tokens, mask)
  valid = np.asarray(mask, bool)
  assert np.abs(np.asarray(logits)[valid] - np.asarray(full)[valid]).max() < 0.1


def test_bad_kv_mask_shape(params):
  cache = models.init_cache(CONFIG, 1, 8)
  with pytest.raises(ValueError, match="kv_mask"):
    models.forward_with_cache(
      CONFIG,
      params,
      jnp.ones((1, 1), jnp.int32),
      jnp.zeros((1, 1), jnp.int32),
      cache,
      0,
      jnp.ones((1, 7), bool),
    )


def test_write_past_the_end_is_rejected(params):
  cache = models.init_cache(CONFIG, 1, 4)
  with pytest.raises(ValueError, match="write_index=3 with 2 new tokens"):
    models.forward_with_cache(
      CONFIG,
      params,
      jnp.ones((1, 2), jnp.int32),
      jnp.zeros((1, 2), jnp.int32),
      cache,
      3,
      jnp.ones((1, 4), bool),
    )


def test_shared_prefix_decode_equals_repeated_cache(params):
  """P prompts x n rows: prefix cache + own slots == the concatenated cache."""
  from rljax.models import decoder  # pylint: disable=g-import-not-at-top

  tokens, mask = _left_padded_batch()  # P = 2 prompts of 12 columns
  p, lp = tokens.shape
  n, own = 3, 4
  positions = models.positions_from_mask(mask)
  prefix = models.init_cache(CONFIG, p, lp)
  _, prefix = step(CONFIG, params, tokens, positions, prefix, 0, mask)
  # Reference: each row's cache = its prompt's slots, then `own` new slots.
  ref = jax.tree_util.tree_map(
    lambda c: jnp.pad(
      jnp.repeat(c, n, axis=1), [(0, 0), (0, 0), (0, own), (0, 0), (0, 0)]
    ),
    prefix,
  )
  ref_mask = jnp.pad(jnp.repeat(mask, n, axis=0), ((0, 0), (0, own)))
  cache = models.init_decode_cache(CONFIG, p * n, own)
  kv_mask = jnp.zeros((p * n, own), jnp.int32)
  pos = jnp.repeat(positions[:, -1:] + 1, n, axis=0)
  rng = np.random.default_rng(1)
  shared = jax.jit(decoder.decode_with_prefix_cache, static_argnums=0)
  for i in range(own):
    new = jnp.asarray(rng.integers(3, CONFIG.vocab_size, (p * n, 1)), jnp.int32)
    ref_mask = ref_mask.at[:, lp + i].set(1)
    kv_mask = kv_mask.at[:, i].set(1)
    want, ref = step(CONFIG, params, new, pos, ref, jnp.int32(lp + i), ref_mask)
    got, cache = shared(
      CONFIG, params, new, pos, prefix, mask, cache, jnp.int32(i), kv_mask
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)
    pos = pos + 1
  want = decoder.to_decode_cache(jax.tree.map(lambda c: c[:, :, lp:], ref))
  for name in ("k", "v"):
    np.testing.assert_allclose(
      np.asarray(cache[name]), np.asarray(want[name]), atol=2e-5
    )


def test_unstack_layers_slices_every_leaf():
  from rljax.models import decoder  # pylint: disable=g-import-not-at-top

  tree = {"a": jnp.arange(6.0).reshape(3, 2), "b": {"c": jnp.arange(3)}}
  out = decoder.unstack_layers(tree)
  assert isinstance(out, tuple) and len(out) == 3
  np.testing.assert_array_equal(out[1]["a"], [2.0, 3.0])
  assert int(out[2]["b"]["c"]) == 2
  with pytest.raises(ValueError, match="no leaves"):
    decoder.unstack_layers({})


def test_shared_prefix_decode_takes_what_the_loop_makes_outside_it(params):
  """What the sampler makes outside its decode loop (`unstack_layers`
  weights, `to_prefix_cache`, `layers.rope_table`) gives the same step as
  the stacked trees and positions."""
  from rljax.models import decoder  # pylint: disable=g-import-not-at-top

  tokens, mask = _left_padded_batch()
  p, lp = tokens.shape
  n, own = 2, 3
  positions = models.positions_from_mask(mask)
  _, prefix = step(
    CONFIG,
    params,
    tokens,
    positions,
    models.init_cache(CONFIG, p, lp),
    0,
    mask,
  )
  cache = jax.tree.map(
    lambda c: jax.random.normal(jax.random.key(3), c.shape),
    models.init_decode_cache(CONFIG, p * n, own),
  )
  args = (
    jnp.full((p * n, 1), 5, jnp.int32),
    jnp.repeat(positions[:, -1:] + 1, n, axis=0),
  )
  tail = (mask, cache, jnp.int32(1), jnp.ones((p * n, own), jnp.int32))
  shared = jax.jit(decoder.decode_with_prefix_cache, static_argnums=0)
  want, want_cache = shared(CONFIG, params, *args, prefix, *tail)
  split_params = {**params, "layers": decoder.unstack_layers(params["layers"])}
  split_prefix = decoder.to_prefix_cache(prefix)
  got, got_cache = shared(CONFIG, split_params, *args, split_prefix, *tail)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  for name in ("k", "v"):
    for g, w in zip(got_cache[name], want_cache[name]):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  # cos/sin looked up in a table (a separate evaluation: equal to rounding).
  table = layers.rope_table(CONFIG, lp + own)
  tabled = functools.partial(shared, rope_table=table)
  got, got_cache = tabled(CONFIG, split_params, *args, split_prefix, *tail)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
  for name in ("k", "v"):
    for g, w in zip(got_cache[name], want_cache[name]):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5)
  # A table that ends before the rows' positions is read as NaN, not wrapped.
  short = layers.rope_table(CONFIG, int(args[1].min()))
  got, _ = shared(
    CONFIG, split_params, *args, split_prefix, *tail, rope_table=short
  )
  assert np.isnan(np.asarray(got)).all()
  # The step wrote slot 1 of every layer and left the others alone.
  k0 = np.asarray(got_cache["k"][0])
  np.testing.assert_array_equal(k0[..., 0], np.asarray(cache["k"][0])[..., 0])
  assert not np.array_equal(k0[..., 1], np.asarray(cache["k"][0])[..., 1])


def test_prefix_cache_layout():
  from rljax.models import decoder  # pylint: disable=g-import-not-at-top

  full = jax.tree.map(
    lambda c: jax.random.normal(jax.random.key(0), c.shape),
    models.init_cache(CONFIG, 3, 5),
  )
  moved = decoder.to_prefix_cache(full)
  hkv, hd = CONFIG.num_kv_heads, CONFIG.head_dim
  assert len(moved["k"]) == len(moved["v"]) == CONFIG.num_layers
  assert all(c.shape == (3, hkv, 5, hd) for c in moved["k"])
  assert all(c.shape == (3, hkv, hd, 5) for c in moved["v"])
  # Slot s of prompt p, head h: the same vector in both layouts.
  np.testing.assert_array_equal(
    moved["k"][1][2, 0, 4, :], full["k"][1, 2, 4, 0]
  )
  np.testing.assert_array_equal(
    moved["v"][1][2, 0, :, 4], full["v"][1, 2, 4, 0]
  )


def test_rope_table_rows_are_rope_cos_sin_of_their_position():
  cos, sin = layers.rope_table(CONFIG, 9)
  assert cos.shape == sin.shape == (9, CONFIG.head_dim)
  want_cos, want_sin = layers.rope_cos_sin(CONFIG, jnp.array([[0, 4, 8]]))
  np.testing.assert_allclose(cos[jnp.array([0, 4, 8])], want_cos[0], atol=1e-6)
  np.testing.assert_allclose(sin[jnp.array([0, 4, 8])], want_sin[0], atol=1e-6)
  with pytest.raises(ValueError, match="length=0"):
    layers.rope_table(CONFIG, 0)


def test_shared_prefix_decode_rejects_bad_prefix_and_rope_table(params):
  from rljax.models import decoder  # pylint: disable=g-import-not-at-top

  prefix = models.init_cache(CONFIG, 2, 5)
  call = functools.partial(
    decoder.decode_with_prefix_cache,
    CONFIG,
    params,
    jnp.zeros((4, 1), jnp.int32),
    jnp.zeros((4, 1), jnp.int32),
  )
  tail = (
    jnp.ones((2, 5)),
    models.init_decode_cache(CONFIG, 4, 3),
    0,
    jnp.ones((4, 3)),
  )
  # Per-layer slices still in the prefill layout [P, Sp, Hkv, hd].
  sliced = {k: decoder.unstack_layers(v) for k, v in prefix.items()}
  with pytest.raises(ValueError, match="to_prefix_cache"):
    call(sliced, *tail)
  with pytest.raises(ValueError, match="prefill cache"):
    call({k: v[0] for k, v in prefix.items()}, *tail)
  bad_table = layers.rope_table(CONFIG, 8)[0][:, :3]
  with pytest.raises(ValueError, match="rope_table"):
    call(prefix, *tail, rope_table=(bad_table, bad_table))


def test_decode_cache_layout():
  from rljax.models import decoder  # pylint: disable=g-import-not-at-top

  cache = models.init_decode_cache(CONFIG, batch=3, slots=5)
  l, hkv, hd = CONFIG.num_layers, CONFIG.num_kv_heads, CONFIG.head_dim
  # One buffer per layer (read in place by a decode step).
  assert isinstance(cache["k"], tuple) and len(cache["k"]) == l
  assert isinstance(cache["v"], tuple) and len(cache["v"]) == l
  assert all(c.shape == (3, hkv, hd, 5) for c in cache["k"])
  assert all(c.shape == (3, hkv, 5, hd) for c in cache["v"])
  full = jax.tree.map(
    lambda c: jax.random.normal(jax.random.key(0), c.shape),
    models.init_cache(CONFIG, 3, 5),
  )
  moved = decoder.to_decode_cache(full)
  # Slot s of row b, head h: the same vector in both layouts.
  np.testing.assert_array_equal(
    moved["k"][1][2, 0, :, 4], full["k"][1, 2, 4, 0]
  )
  np.testing.assert_array_equal(
    moved["v"][1][2, 0, 4, :], full["v"][1, 2, 4, 0]
  )


def test_shared_prefix_decode_rejects_a_cache_in_the_prefill_layout(params):
  from rljax.models import decoder  # pylint: disable=g-import-not-at-top

  prefix = models.init_cache(CONFIG, 2, 5)
  with pytest.raises(ValueError, match="init_decode_cache"):
    decoder.decode_with_prefix_cache(
      CONFIG,
      params,
      jnp.zeros((4, 1), jnp.int32),
      jnp.zeros((4, 1), jnp.int32),
      prefix,
      jnp.ones((2, 5)),
      models.init_cache(CONFIG, 4, 3),
      0,
      jnp.ones((4, 3)),
    )


def test_shared_prefix_decode_rejects_bad_shapes(params):
  from rljax.models import decoder  # pylint: disable=g-import-not-at-top

  prefix = models.init_cache(CONFIG, 2, 5)
  cache = models.init_decode_cache(CONFIG, 3, 4)  # 3 rows over 2 prompts
  with pytest.raises(ValueError, match="P dividing B=3"):
    decoder.decode_with_prefix_cache(
      CONFIG,
      params,
      jnp.zeros((3, 1), jnp.int32),
      jnp.zeros((3, 1), jnp.int32),
      prefix,
      jnp.ones((2, 5)),
      cache,
      0,
      jnp.ones((3, 4)),
    )
