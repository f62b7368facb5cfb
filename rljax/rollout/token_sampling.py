"""One sampling step of a rollout: logits and a PRNG key per row -> a token
and its behaviour log-prob.

`sample_next_token` is a pure function of the logits and the keys, so its
math is tested on its own (tests/rollout/test_jax_sampler.py); every decode
program (`static_program`, `slot_program`) calls it. `sample_keys` derives a
row's key from (seed, prompt index, sample index) only, so the batch a row
runs in (a chunk, a decode slot) never changes its samples; token t of a row
draws from `fold_in(key, t)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

# Vocabulary block of the two-level inverse-CDF draw (see `_inverse_cdf`).
_CDF_BLOCK = 256
# Nucleus search: exact among this many top logits, else bisection with this
# many steps (2^-32 of the logit range, below float32 resolution).
_TOP_P_FAST_K = 256
_TOP_P_BISECTION_STEPS = 32


def _first_argmax(x: jax.Array) -> jax.Array:
  """Index of the first maximum of each row.

  Two plain reductions (max, then min over a float iota), which XLA:CPU
  vectorizes; `jnp.argmax` lowers to a variadic reduce that is several times
  slower at [128, 49152].
  """
  vocab = x.shape[-1]
  is_max = x == jnp.max(x, axis=-1, keepdims=True)
  iota = jnp.arange(vocab, dtype=jnp.float32)  # exact: vocab < 2^24.
  first = jnp.min(jnp.where(is_max, iota, float(vocab)), axis=-1)
  # All-NaN rows match nothing: stay a valid id (their log-prob is NaN).
  return jnp.minimum(first, vocab - 1).astype(jnp.int32)


def _top_p_threshold(z: jax.Array, weights: jax.Array, top_p) -> jax.Array:
  """Largest t with Σ_{z_v ≥ t} w_v ≥ top_p · Σ_v w_v.

  {v : z_v ≥ t} is then the smallest set of most likely tokens whose mass
  reaches top_p (ties at the cut kept). Exact from the sorted `_TOP_P_FAST_K`
  largest logits when the nucleus lies among them (the usual case); otherwise
  by bisection over the logit range, a fixed number of masked sums rather
  than a [B, V] sort (slow on XLA:CPU).
  """
  total = jnp.sum(weights, axis=-1, keepdims=True)
  target = top_p * total
  live = weights > 0
  peak = jnp.max(jnp.where(live, z, -jnp.inf), axis=-1, keepdims=True)

  k = min(_TOP_P_FAST_K, z.shape[-1])
  top = jax.lax.top_k(jnp.where(live, z, -jnp.inf), k)[0]  # descending
  top_w = jnp.where(jnp.isfinite(top), jnp.exp(top - peak), 0.0)
  # Rescale: `weights` were exponentiated against the unmasked peak.
  top_w = top_w * jnp.max(weights, axis=-1, keepdims=True)
  cum = jnp.cumsum(top_w, axis=-1)
  kept = cum - top_w < target
  fast = jnp.min(jnp.where(kept, top, jnp.inf), axis=-1, keepdims=True)
  covered = cum[:, -1:] >= target

  def bisection():
    hi = peak
    lo = jnp.min(jnp.where(live, z, hi), axis=-1, keepdims=True)

    def body(_, bounds):
      lo, hi = bounds
      mid = 0.5 * (lo + hi)
      mass = jnp.sum(jnp.where(z >= mid, weights, 0.0), axis=-1, keepdims=True)
      enough = mass >= target
      return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo, _ = jax.lax.fori_loop(0, _TOP_P_BISECTION_STEPS, body, (lo, hi))
    return jnp.where(covered, fast, lo)

  return jax.lax.cond(jnp.all(covered), lambda: fast, bisection)


def _inverse_cdf(weights: jax.Array, uniforms: jax.Array) -> jax.Array:
  """Index v with P(v) = w_v / Σ w for each row, from one uniform per row.

  Two levels so that no [B, V] cumulative sum is needed: pick the block of
  `_CDF_BLOCK` tokens by the cumulative block masses, then the token inside
  it. A Gumbel-max draw would need B·V random numbers and two logarithms per
  entry, the dominant cost of a decode step at batch 128 on CPU.
  """
  rows, vocab = weights.shape
  num_blocks = -(-vocab // _CDF_BLOCK)
  padded = jnp.pad(weights, ((0, 0), (0, num_blocks * _CDF_BLOCK - vocab)))
  blocks = padded.reshape(rows, num_blocks, _CDF_BLOCK)
  block_cdf = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # [B, nb]
  target = uniforms * block_cdf[:, -1]
  block = jnp.sum(block_cdf <= target[:, None], axis=-1)
  # Float rounding can push the target onto the total: stay on a block that
  # has mass (the last one with positive cumulative increase).
  block_iota = jnp.arange(num_blocks)
  nonempty = jnp.diff(block_cdf, axis=-1, prepend=0.0) > 0
  last_block = jnp.max(jnp.where(nonempty, block_iota, 0), axis=-1)
  block = jnp.minimum(block, last_block)
  before = jnp.where(
    block > 0,
    jnp.take_along_axis(block_cdf, jnp.maximum(block - 1, 0)[:, None], axis=-1)[
      :, 0
    ],
    0.0,
  )
  inner = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]
  inner_cdf = jnp.cumsum(inner, axis=-1)
  offset = jnp.sum(inner_cdf <= (target - before)[:, None], axis=-1)
  inner_iota = jnp.arange(_CDF_BLOCK)
  last_inner = jnp.max(jnp.where(inner > 0, inner_iota, 0), axis=-1)
  offset = jnp.minimum(offset, last_inner)
  return (block * _CDF_BLOCK + offset).astype(jnp.int32)


def sample_next_token(
  logits: Float[Array, "B V"],
  keys: jax.Array,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  greedy: bool = False,
) -> tuple[Int[Array, "B"], Float[Array, "B"]]:
  """Samples one token per row and returns its behavior log-prob.

  π(v) ∝ exp(z_v / T) on the support S = top-k(z) ∩ top-p(z / T) (top-k is
  applied first, top-p on the renormalized top-k distribution, as in vLLM and
  HF), 0 elsewhere; o ~ π and the returned log-prob is log π(o), i.e. the
  log-prob under the distribution actually sampled from. With top_k=0 and
  top_p=1 this is log_softmax(z / T)[o], what `models.token_logprobs`
  computes at temperature T. Greedy (or T == 0): o = argmax z (first on
  ties) and the log-prob is log_softmax(z)[o].

  The draw is an inverse-CDF draw from one uniform per row (`_inverse_cdf`).

  Args:
    logits: float [B, V] next-token logits z.
    keys: [B] PRNG keys, one per row (ignored when greedy).
    temperature: T > 0 unless greedy; a float or a traced scalar.
    top_k: keep the k largest logits; 0 means off; static.
    top_p: nucleus mass in (0, 1]; the Python float 1.0 turns it off; a
      traced scalar always applies the (then possibly no-op) nucleus mask.
    greedy: argmax decoding; static.

  Returns:
    (tokens int32 [B], logp float32 [B]).
  """
  if logits.ndim != 2:
    raise ValueError(
      f"sample_next_token: logits shape {logits.shape}; expected [B, V]"
    )
  logits = logits.astype(jnp.float32)
  take = lambda x, idx: jnp.take_along_axis(x, idx[:, None], axis=-1)[:, 0]
  if greedy or (isinstance(temperature, (int, float)) and temperature == 0.0):
    tokens = _first_argmax(logits)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    # The argmax logit is the peak: log_softmax(z)[o] = −log Σ exp(z − peak).
    log_total = jnp.log(jnp.sum(jnp.exp(logits - peak), axis=-1))
    return tokens, -log_total
  vocab = logits.shape[-1]
  z = logits / temperature
  peak = jnp.max(z, axis=-1, keepdims=True)
  # Unnormalized probabilities; truncation zeroes them (no -inf arithmetic).
  weights = jnp.exp(z - peak)
  if 0 < top_k < vocab:
    # min over the k values, not [:, -1:]: XLA:CPU rewrites top_k followed
    # by that slice into a full sort (~100x slower at [128, 49152]).
    kth = jnp.min(jax.lax.top_k(z, top_k)[0], axis=-1, keepdims=True)
    weights = jnp.where(z >= kth, weights, 0.0)
  if not isinstance(top_p, (int, float)) or top_p < 1.0:
    threshold = _top_p_threshold(z, weights, top_p)
    weights = jnp.where(z >= threshold, weights, 0.0)
  uniforms = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
  tokens = _inverse_cdf(weights, uniforms)
  log_total = jnp.log(jnp.sum(weights, axis=-1))
  logp = take(z, tokens) - peak[:, 0] - log_total
  return tokens, logp


def sample_keys(
  seed: int | jax.Array,
  prompt_index: Int[Array, "B"],
  sample_index: Int[Array, "B"],
) -> jax.Array:
  """Per-row PRNG keys from (seed, prompt index, sample index).

  A row's key depends only on these three numbers, not on the batch it runs
  in, so chunking or reordering a rollout does not change its samples.
  `seed` may be one per row ([B], 31-bit): a streamed slot run mixes the
  prompts of several requests, each with its own seed, and a row's key is
  still the one its own request would give it.
  """
  if jnp.ndim(seed) == 0:
    base = jax.random.key(seed)

    def one(p, s):
      return jax.random.fold_in(jax.random.fold_in(base, p), s)

    return jax.vmap(one)(prompt_index, sample_index)

  def own(sd, p, s):
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(sd), p), s)

  return jax.vmap(own)(jnp.asarray(seed, jnp.int32), prompt_index, sample_index)
