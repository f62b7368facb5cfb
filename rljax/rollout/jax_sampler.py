"""The JAX rollout engine: batched prefill + decode over a KV cache, in jit.

One `generate` call runs, per chunk of prompts, a single jitted program:
  1. prefill: the chunk's prompts, LEFT-padded to a bucketed length Lp so that
     every row's last prompt token sits in column Lp - 1, go through
     `models.forward_with_cache` once per prompt (not once per sample);
  2. the last logits are repeated n times (one row per sample); the prompt's
     KV cache is not: its n samples attend to one shared prefix cache
     (`decoder.decode_with_prefix_cache`) plus their own generated slots;
  3. decode: a `jax.lax.while_loop` samples one token per row and step and
     feeds it back, until every row has hit a stop token or max_new_tokens.
Compiles are keyed by shapes and switches only (prompt bucket, prompt count,
n, bucket of max_new_tokens, greedy/top-k/top-p on, number of stop ids, weight
layout); temperature, top-p mass, stop ids and max_new_tokens are traced, so
an RL loop compiles once per prompt bucket.

Sampling of one step (`sample_next_token`) is a pure function of the logits
and a PRNG key, so its math is tested on its own.

On a mesh (`mesh=`, a ("data", "fsdp", "tensor") Mesh): the weights, INT8 /
FP8 codes and their scales included, are laid out by the logical-axis rules
(`rljax.models.sharding.param_shardings`: heads, kv_heads, mlp and vocab over
"tensor", embed over "fsdp", which XLA all-gathers for each matmul); prompts,
samples and both KV caches (prefix and generated) are split over
("data", "fsdp") by rows and over "tensor" by KV heads. Greedy decoding gives
the single-device tokens and log-probs (tests/rollout/test_jax_sampler.py).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from rljax import models
from rljax.models import decoder as decoder_lib
from rljax.models import fusion as fusion_lib
from rljax.models import layers as layers_lib
from rljax.models import sharding as sharding_lib
from rljax import quant as quant_lib
from rljax.rollout.base import RolloutBatch, SamplingConfig, SyncStats
from rljax.rollout.base import check_prompts

# Accepted values of `quant`; "none" and "f32" both mean "params as given".
QUANT_MODES = quant_lib.ROLLOUT_MODES
_LOW_BIT_MODES = quant_lib.MODES


# ----------------------------------------------------------------------------
# One sampling step.
# ----------------------------------------------------------------------------


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
  """
  base = jax.random.key(seed)

  def one(p, s):
    return jax.random.fold_in(jax.random.fold_in(base, p), s)

  return jax.vmap(one)(prompt_index, sample_index)


# ----------------------------------------------------------------------------
# The jitted rollout program.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Static shapes and switches of one compiled rollout program.

  Temperature, top-p mass, stop ids and max_new_tokens are traced arguments,
  so changing them does not recompile; `new_token_capacity` (a bucket
  >= max_new_tokens) sizes the cache and the output buffers.
  """

  num_prompts: int
  prompt_len: int
  n: int
  new_token_capacity: int
  greedy: bool
  top_k: int
  use_top_p: bool
  num_stop_ids: int
  pad_id: int
  cache_dtype: Any
  activation_dtype: Any = None  # None: the embedding's dtype
  mesh: Any = None  # a Mesh: the KV caches are constrained to its layout
  fuse_projections: bool = False  # run `fusion.fuse_projections(params)`


@functools.partial(jax.jit, static_argnums=(0, 1))
def _generate_chunk(
  config,
  plan: _Plan,
  params,
  prompt_tokens,
  prompt_mask,
  keys,
  temperature,
  top_p,
  stop_ids,
  max_new_tokens,
):
  """Prefill + decode for one chunk of prompts.

  Args:
    config: decoder config (static).
    plan: `_Plan` (static).
    params: the rollout weights.
    prompt_tokens, prompt_mask: int32 [P, Lp], left-padded.
    keys: [P * n] per-row PRNG keys.
    temperature, top_p: f32 scalars.
    stop_ids: int32 [num_stop_ids] (a -1 placeholder when there are none).
    max_new_tokens: int32 scalar <= plan.new_token_capacity.

  Returns:
    tokens int32 [P*n, capacity] (pad after the end), logp f32 [P*n, capacity]
    (0 after the end), lengths int32 [P*n], and the number of decode steps.
  """
  num_prompts, prompt_len, n = plan.num_prompts, plan.prompt_len, plan.n
  capacity = plan.new_token_capacity
  if plan.fuse_projections:
    # Once per chunk, outside the decode loop: a copy of the projection
    # kernels (~0.3 ms of an H100's bandwidth for Qwen2.5-0.5B in bf16;
    # those kernels, about half its weights, are held twice while the chunk
    # runs) buys two matmuls per layer and step instead of five.
    params = fusion_lib.fuse_projections(params)
  rows = num_prompts * n
  sample = functools.partial(
    sample_next_token,
    temperature=temperature,
    top_k=plan.top_k,
    top_p=top_p if plan.use_top_p else 1.0,
    greedy=plan.greedy,
  )

  segments = decode_segments(capacity)

  # The prompt's keys/values stay in one [P, Lp] prefix cache shared by its n
  # samples (`decoder.decode_with_prefix_cache`); only the generated tokens
  # get per-row slots, so decode attention never reads n copies of a prompt.
  def laid_out(cache, shardings=sharding_lib.cache_shardings):
    if plan.mesh is None:
      return cache
    return jax.lax.with_sharding_constraint(cache, shardings(plan.mesh, cache))

  own_laid_out = functools.partial(
    laid_out, shardings=sharding_lib.decode_cache_shardings
  )
  prefix = laid_out(
    models.init_cache(config, num_prompts, prompt_len, plan.cache_dtype)
  )
  # Position 0 at each row's first real token, as `models.forward` numbers it.
  positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
  logits, prefix = models.forward_with_cache(
    config,
    params,
    prompt_tokens,
    positions,
    prefix,
    0,
    prompt_mask,
    activation_dtype=plan.activation_dtype,
    # Left padding puts every prompt's last token in the last column, the
    # only one sampled from: the LM head runs on it alone.
    last_only=True,
  )
  last_logits = logits[:, -1]
  # What the decode loop reads but never changes is made once here, in the
  # form it reads: per-layer weights and prompt keys (a slice of a stacked
  # [L, ...] array inside the loop is copied at every step), the prompt keys
  # in their matmuls' layouts, and the RoPE table (`decode_with_prefix_cache`).
  prefix = decoder_lib.to_prefix_cache(prefix)
  rope_table = layers_lib.rope_table(config, prompt_len + capacity)
  decode_params = {
    **params,
    "layers": decoder_lib.unstack_layers(params["layers"]),
  }

  # Sample j of prompt i is row i*n + j.
  cache = own_laid_out(
    models.init_decode_cache(config, rows, segments[0], plan.cache_dtype)
  )
  kv_mask = jnp.zeros((rows, segments[0]), prompt_mask.dtype)
  last_logits = jnp.repeat(last_logits, n, axis=0)
  next_pos = jnp.repeat(positions[:, -1] + 1, n, axis=0)
  live_prompt = jnp.repeat(prompt_mask[:, -1] > 0, n, axis=0)

  def step_keys(step):
    return jax.vmap(lambda k: jax.random.fold_in(k, step))(keys)

  tok, logp = sample(last_logits, step_keys(0))
  out_tokens = jnp.full((rows, capacity), plan.pad_id, jnp.int32)
  out_logp = jnp.zeros((rows, capacity), jnp.float32)
  out_tokens = out_tokens.at[:, 0].set(tok)
  out_logp = out_logp.at[:, 0].set(logp)
  lengths = jnp.ones((rows,), jnp.int32)
  # Padding rows of a partial chunk (no real prompt) start finished.
  done = jnp.isin(tok, stop_ids) | ~live_prompt

  def body(state):
    step, cache, prev_tok, pos, done, kv_mask, out_tokens, out_logp, lengths = (
      state
    )
    write_index = step - 1  # the slot of prev_tok, sampled at step - 1
    kv_mask = jax.lax.dynamic_update_slice(
      kv_mask, jnp.ones((rows, 1), kv_mask.dtype), (0, write_index)
    )
    logits, cache = decoder_lib.decode_with_prefix_cache(
      config,
      decode_params,
      prev_tok[:, None],
      pos[:, None],
      prefix,
      prompt_mask,
      cache,
      write_index,
      kv_mask,
      activation_dtype=plan.activation_dtype,
      rope_table=rope_table,
    )
    tok, logp = sample(logits[:, 0], step_keys(step))
    tok = jnp.where(done, plan.pad_id, tok)
    logp = jnp.where(done, 0.0, logp)
    out_tokens = jax.lax.dynamic_update_slice(
      out_tokens, tok[:, None], (0, step)
    )
    out_logp = jax.lax.dynamic_update_slice(out_logp, logp[:, None], (0, step))
    lengths = lengths + (~done).astype(jnp.int32)
    done = done | jnp.isin(tok, stop_ids)
    return (
      step + 1,
      cache,
      tok,
      pos + 1,
      done,
      kv_mask,
      out_tokens,
      out_logp,
      lengths,
    )

  state = (
    jnp.int32(1),
    cache,
    tok,
    next_pos,
    done,
    kv_mask,
    out_tokens,
    out_logp,
    lengths,
  )
  # Decode in segments over a growing cache: attention reads every cache slot
  # at every step, so early steps run on a short cache (see decode_segments).
  for i, segment_end in enumerate(segments):
    if i > 0:
      grow = segment_end - segments[i - 1]
      step, cache, prev_tok, pos, done, kv_mask, *outputs = state
      # The slot axis: last of K [B, Hkv, hd, S], 2 of V [B, Hkv, S, hd].
      pad = [(0, 0)] * 4
      cache = own_laid_out(
        {
          "k": tuple(jnp.pad(c, pad[:3] + [(0, grow)]) for c in cache["k"]),
          "v": tuple(
            jnp.pad(c, pad[:2] + [(0, grow), (0, 0)]) for c in cache["v"]
          ),
        }
      )
      kv_mask = jnp.pad(kv_mask, ((0, 0), (0, grow)))
      state = (step, cache, prev_tok, pos, done, kv_mask, *outputs)
    limit = jnp.minimum(max_new_tokens, segment_end)

    def cond(state, limit=limit):
      step, _, _, _, done, *_ = state
      return (step < limit) & ~jnp.all(done)

    state = jax.lax.while_loop(cond, body, state)
  steps, out_tokens, out_logp, lengths = state[0], state[6], state[7], state[8]
  return out_tokens, out_logp, lengths, steps


def decode_segments(capacity: int) -> tuple[int, ...]:
  """New-token counts at which the decode cache grows: 64, 128, 256, ...

  A decode step's attention reads all S cache slots, which on CPU costs about
  as much as the matmuls at batch 128 and S ~ 200. Growing the cache in
  doubling segments makes the average S over a 256-token rollout ~176 + Lp
  instead of 256 + Lp, for one extra while-loop compile per segment.
  """
  ends = []
  end = 64
  while end < capacity:
    ends.append(end)
    end *= 2
  ends.append(capacity)
  return tuple(ends)


# ----------------------------------------------------------------------------
# The engine.
# ----------------------------------------------------------------------------


def default_prompt_buckets(max_prompt_len: int) -> tuple[int, ...]:
  """16, 32, 64, then multiples of 64, up to (and covering) max_prompt_len."""
  buckets = [b for b in (16, 32, 64) if b < max_prompt_len]
  size = 64
  while size < max_prompt_len:
    size += 64
    buckets.append(size)
  buckets.append(max_prompt_len)
  return tuple(sorted(set(b for b in buckets if b <= max_prompt_len)))


def new_token_capacity(max_new_tokens: int) -> int:
  """Decode buffer size for max_new_tokens: 16, 32, 64, then multiples of 64.

  max_new_tokens itself is a traced loop bound; only this bucket is static.
  """
  for size in (16, 32, 64):
    if max_new_tokens <= size:
      return size
  return -(-max_new_tokens // 64) * 64


def _next_power_of_two(x: int) -> int:
  return 1 << max(0, (x - 1).bit_length())


def tree_nbytes(tree: Any) -> int:
  """Total bytes of the array leaves of a pytree (QTensor value + scale)."""
  return int(
    sum(
      np.dtype(x.dtype).itemsize * int(np.prod(x.shape))
      for x in jax.tree_util.tree_leaves(tree)
      if hasattr(x, "dtype") and hasattr(x, "shape")
    )
  )


def _weight_layout(tree: Any) -> Any:
  """What a jit trace of the params depends on: structure, shapes, dtypes."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


_HEAD_QUANT_MODES = ("none", "int8")


def rollout_config(config: Any, head_quant: str) -> Any:
  """The decoder config the sampler runs: untied when the head is separate.

  A quantized head is its own `lm_head` leaf, so the embedding lookup keeps
  the full-precision table while the logits go through the head copy.
  """
  if head_quant == "none" or not getattr(config, "tie_word_embeddings", False):
    return config
  return dataclasses.replace(config, tie_word_embeddings=False)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _with_head(config, head_quant: str, fake: bool, params):
  """Adds (or replaces) `lm_head` with an int8 W8A8 copy of the head.

  int8: s_v = max_d |W[d, v]| / 127 per vocabulary column, the same
  per-output-channel rule as the projections (`quant.quantize`).
  """
  kernel = decoder_lib.lm_head_kernel(config, params)
  if isinstance(kernel, quant_lib.QTensor):
    return params  # already quantized by quantize_params(include_lm_head)
  del head_quant  # "int8", the one mode besides "none".
  head = quant_lib.quantize(kernel, "int8", fake=fake)
  return {**params, "lm_head": {"kernel": head}}


def _check_quant(quant: Any, where: str) -> str:
  if quant not in QUANT_MODES:
    raise ValueError(f"{where}: quant={quant!r}; expected one of {QUANT_MODES}")
  return "none" if quant == "f32" else quant


class JaxSampler:
  """Rollout engine running the rljax decoder in jit, on any JAX backend.

  Implements `rljax.rollout.base.RolloutEngine`.

  Example:
    sampler = JaxSampler(model.config, model.params, quant="int8")
    batch = sampler.generate(prompt_ids, SamplingConfig(n=8, temperature=1.0,
        max_new_tokens=256, stop_token_ids=(eos,)))
    stats = sampler.update_weights(new_params)   # re-quantizes to int8
  """

  def __init__(
    self,
    config: Any,
    params: Any = None,
    quant: str = "none",
    fake_quant: bool = False,
    max_prompt_len: int = 1024,
    prompt_buckets: Sequence[int] | None = None,
    max_batch: int = 256,
    pad_id: int = 0,
    cache_dtype: Any = None,
    show_progress: bool = False,
    head_quant: str = "none",
    mesh: Any = None,
    fuse_projections: bool | None = None,
  ):
    """Builds the sampler.

    Args:
      config: the decoder config (`rljax.models`), hashable.
      params: full-precision params; may be given later by `update_weights`.
      quant: weights the rollout runs on: "none"/"f32" (params as given),
        "bf16" (every leaf cast to bfloat16, as
        `quant.prepare_rollout_weights`; see `activation_dtype`),
        "int8" (W8A8), "int8_wo"
        (weight-only INT8) or "fp8" (e4m3 W8A8), the last three through
        `rljax.quant.quantize_params`.
      fake_quant: quantize-dequantize emulation of int8/fp8 matmuls in float.
      max_prompt_len: longest accepted prompt (tokens).
      prompt_buckets: prompt lengths to pad to (ascending); the default is
        `default_prompt_buckets(max_prompt_len)`.
      max_batch: most sequences (prompts x samples) decoded in one program;
        larger rollouts run in chunks of whole prompt groups.
      pad_id: token id used for padding (never attended to).
      cache_dtype: KV cache dtype; default the activations' (bfloat16 where
        they are bf16: "bf16", or a quantized mode, off the CPU; see
        `activation_dtype`), else float32.
      show_progress: tqdm bar over chunks.
      head_quant: "none" keeps the LM head as given (the tied embedding in
        f32 for SmolLM2); "int8" samples through a W8A8 copy of it
        (per-vocab-column scales). The head is ~21% of SmolLM2-135M's decode FLOPs
        (576 x 49152 of ~135M weights); the sampled tokens' log-probs then
        come from the quantized head, so `behav_logp` matches
        `models.token_logprobs(sampler.rollout_config, sampler.params)`.
      mesh: a ("data", "fsdp", "tensor") `jax.sharding.Mesh` to run on (see
        the module doc), or None for the default device.
      fuse_projections: run q/k/v and gate/up as one matmul each
        (`models.fusion`; outputs unchanged, bit for bit under INT8 W8A8).
        Default (None): on an accelerator, where it is 4-11 % faster (H200,
        docs/performance.md), not on a CPU, where it measured no gain. Off
        on a mesh with a "tensor" axis > 1, where the kernels are split by
        heads and a fused output would not split at the shard boundaries.
    """
    self._quant = _check_quant(quant, "JaxSampler")
    if not isinstance(max_prompt_len, int) or max_prompt_len < 1:
      raise ValueError(
        f"JaxSampler: max_prompt_len={max_prompt_len!r}; expected an int >= 1"
      )
    if prompt_buckets is None:
      prompt_buckets = default_prompt_buckets(max_prompt_len)
    prompt_buckets = tuple(int(b) for b in prompt_buckets)
    if (
      not prompt_buckets
      or any(b < 1 for b in prompt_buckets)
      or list(prompt_buckets) != sorted(set(prompt_buckets))
    ):
      raise ValueError(
        f"JaxSampler: prompt_buckets={prompt_buckets}; expected strictly "
        "increasing positive ints"
      )
    if prompt_buckets[-1] < max_prompt_len:
      raise ValueError(
        f"JaxSampler: largest prompt bucket {prompt_buckets[-1]} < "
        f"max_prompt_len={max_prompt_len}; expected a bucket covering it"
      )
    if not isinstance(max_batch, int) or max_batch < 1:
      raise ValueError(
        f"JaxSampler: max_batch={max_batch!r}; expected an int >= 1"
      )
    if head_quant not in _HEAD_QUANT_MODES:
      raise ValueError(
        f"JaxSampler: head_quant={head_quant!r}; expected one "
        f"of {_HEAD_QUANT_MODES}"
      )
    self.config = config
    self.head_quant = head_quant
    self.rollout_config = rollout_config(config, head_quant)
    self.fake_quant = bool(fake_quant)
    self.max_prompt_len = max_prompt_len
    self.prompt_buckets = prompt_buckets
    self.max_batch = max_batch
    self.pad_id = int(pad_id)
    self._cache_dtype = cache_dtype
    self.show_progress = show_progress
    self.mesh = mesh
    tensor_parallel = mesh is not None and mesh.shape.get("tensor", 1) > 1
    if fuse_projections is None:
      fuse_projections = jax.default_backend() != "cpu"
    self.fuse_projections = bool(fuse_projections) and not tensor_parallel
    self._params = None
    self._signatures: set[Any] = set()
    self._closed = False
    if params is not None:
      self.update_weights(params)

  # -- RolloutEngine ----------------------------------------------------------

  @property
  def quant(self) -> str:
    return self._quant

  @property
  def num_compiles(self) -> int:
    """Distinct rollout programs traced so far (plan x weight layout)."""
    return len(self._signatures)

  @property
  def params(self) -> Any:
    """The params the rollout runs on (quantized / cast)."""
    return self._params

  def update_weights(self, params: Any) -> SyncStats:
    """Loads params; a sampler made with quant="none" runs them as given.

    The trainer makes its sampler with quant="none" and passes prepared
    rollout weights (`quant.prepare_rollout_weights`). A sampler made with
    another mode converts full-precision params to that mode here
    (standalone use: benchmarks, examples). Like every engine's, this takes
    no mode argument: the format is fixed when the engine is made.

    Args:
      params: params tree of the decoder (docs/CONTRACTS.md).

    Returns:
      SyncStats: wall seconds of the cast/quantization (until the new weights
      are materialized) and bytes of the weights the sampler now holds.
    """
    mode = self._quant
    start = time.perf_counter()
    if mode == "none":
      new_params = params
    else:
      new_params = quant_lib.prepare_rollout_weights(
        self.config, params, mode, fake=self.fake_quant
      )
    if self.head_quant != "none":
      new_params = _with_head(
        self.config, self.head_quant, self.fake_quant, new_params
      )
    if self.mesh is not None:
      new_params = jax.device_put(
        new_params,
        sharding_lib.param_shardings(self.config, new_params, self.mesh),
      )
    new_params = jax.block_until_ready(new_params)
    seconds = time.perf_counter() - start
    self._params = new_params
    return SyncStats(seconds=seconds, bytes=tree_nbytes(new_params))

  def close(self) -> None:
    self._params = None
    self._closed = True

  def _check_generate_args(
    self, prompt_ids, sampling, where
  ) -> tuple[list[list[int]], list[list[int]]]:
    """Validated prompts and their chunks (lists of prompt indices)."""
    if self._closed:
      raise RuntimeError(f"JaxSampler.{where}: the sampler was closed")
    if self._params is None:
      raise RuntimeError(
        f"JaxSampler.{where}: no params; pass params to the constructor or "
        "call update_weights(params) first"
      )
    if not isinstance(sampling, SamplingConfig):
      raise TypeError(
        f"JaxSampler.{where}: sampling={sampling!r:.80}; expected a "
        "rljax.rollout.SamplingConfig"
      )
    prompts = check_prompts(
      prompt_ids, getattr(self.config, "vocab_size", None)
    )
    too_long = [
      i for i, p in enumerate(prompts) if len(p) > self.max_prompt_len
    ]
    if too_long:
      i = too_long[0]
      raise ValueError(
        f"JaxSampler.{where}: prompt_ids[{i}] has {len(prompts[i])} tokens;"
        f" expected <= max_prompt_len={self.max_prompt_len}"
      )
    prompts_per_chunk = max(1, self.max_batch // sampling.n)
    chunks = [
      list(range(s, min(s + prompts_per_chunk, len(prompts))))
      for s in range(0, len(prompts), prompts_per_chunk)
    ]
    return prompts, chunks

  def warmup(
    self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
  ) -> float:
    """Compiles what `generate(prompt_ids, sampling)` runs; returns seconds.

    Runs each distinct chunk program once with a one-token decode (the loop
    bound is traced), so benchmarks and the first RL step do not pay for
    compilation inside their timings.
    """
    prompts, chunks = self._check_generate_args(prompt_ids, sampling, "warmup")
    start = time.perf_counter()
    seen = set()
    for chunk in chunks:
      chunk_prompts = [prompts[i] for i in chunk]
      shape = (len(chunk), self._bucket(max(len(p) for p in chunk_prompts)))
      if shape not in seen:
        seen.add(shape)
        self._run_chunk(chunk_prompts, chunk, sampling, max_steps=1)
    return time.perf_counter() - start

  def generate(
    self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
  ) -> RolloutBatch:
    """Samples `sampling.n` responses per prompt (see `RolloutBatch`)."""
    prompts, chunks = self._check_generate_args(
      prompt_ids, sampling, "generate"
    )
    n = sampling.n
    start = time.perf_counter()
    responses: list[list[int]] = []
    behav: list[np.ndarray] = []
    reasons: list[str] = []
    decode_steps = 0
    iterator = chunks
    if self.show_progress and len(chunks) > 1:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top

      iterator = tqdm(chunks, desc="rollout", unit="chunk")
    stop_set = set(sampling.stop_token_ids)
    for chunk in iterator:
      tokens, logp, lengths, steps = self._run_chunk(
        [prompts[i] for i in chunk], chunk, sampling
      )
      decode_steps += steps
      for row in range(len(chunk) * n):
        length = int(lengths[row])
        ids = tokens[row, :length].tolist()
        responses.append(ids)
        behav.append(np.asarray(logp[row, :length], np.float32))
        reasons.append("stop" if ids and ids[-1] in stop_set else "length")
    seconds = time.perf_counter() - start
    num_tokens = int(sum(len(r) for r in responses))
    timing = {
      "seconds": seconds,
      "tokens": num_tokens,
      "tokens_per_s": num_tokens / seconds if seconds > 0 else float("inf"),
      "decode_steps": decode_steps,
      "chunks": len(chunks),
    }
    return RolloutBatch(
      prompt_ids=prompts,
      response_ids=responses,
      behav_logp=behav,
      finish_reason=reasons,
      n=n,
      timing=timing,
    )

  # -- internals --------------------------------------------------------------

  def _bucket(self, length: int) -> int:
    for b in self.prompt_buckets:
      if b >= length:
        return b
    raise ValueError(
      f"prompt of {length} tokens exceeds the largest bucket "
      f"{self.prompt_buckets[-1]}"
    )

  @property
  def activation_dtype(self) -> jnp.dtype | None:
    """The rollout's activation dtype; None: the embedding's (the weights').

    bf16 weights on the CPU backend ("bf16", bf16 params given to a "none"
    sampler, as the trainer's prepared weights, or a quantized tree whose
    float leaves are bf16 on a CPU with bf16 dot units,
    `quant.quantized_float_dtype`) run with float32
    activations: each matmul is then a bf16 x bf16 -> f32 dot (`qdot`), ~2x
    the f32 dot with AVX512-BF16 or AMX, while bf16 elementwise work and
    attention are slower than f32 there (no bf16 arithmetic outside the dot
    units; docs/performance.md). On an accelerator they run in the
    embedding's dtype: bf16 throughout for "bf16" and for the quantized
    modes, whose float leaves are bf16 there (`quant.quantized_float_dtype`),
    around the int8/fp8 dots.
    """
    if jax.default_backend() != "cpu":
      return None
    if self._params is None:
      bf16 = self._quant == "bf16"
    else:
      bf16 = models.compute_dtype(self._params) == jnp.bfloat16
    return jnp.dtype(jnp.float32) if bf16 else None

  def _default_cache_dtype(self):
    # The cache holds keys and values as the activations compute them, so
    # it takes their dtype: bf16 activations (a bf16 or, on an accelerator,
    # a quantized tree; `quant.quantized_float_dtype`) in a float32 cache
    # would double its reads at every decode step for no precision.
    if self._cache_dtype is not None:
      return jnp.dtype(self._cache_dtype)
    act = self.activation_dtype
    if act is None and self._params is not None:
      act = models.compute_dtype(self._params)
    elif act is None:
      act = jnp.bfloat16 if self._quant == "bf16" else jnp.float32
    if jnp.dtype(act) == jnp.bfloat16:
      return jnp.dtype(jnp.bfloat16)
    return jnp.dtype(jnp.float32)

  def _run_chunk(
    self,
    prompts: list[list[int]],
    prompt_index: list[int],
    sampling: SamplingConfig,
    max_steps: int | None = None,
  ):
    n = sampling.n
    prompt_len = self._bucket(max(len(p) for p in prompts))
    # Pad the prompt count to a power of two (capped at the chunk size) so the
    # tail chunk and small evaluation batches reuse compiles.
    cap = max(1, self.max_batch // n)
    num_prompts = min(_next_power_of_two(len(prompts)), max(cap, len(prompts)))
    tokens = np.full((num_prompts, prompt_len), self.pad_id, np.int32)
    mask = np.zeros((num_prompts, prompt_len), np.int32)
    for i, p in enumerate(prompts):
      tokens[i, prompt_len - len(p) :] = p
      mask[i, prompt_len - len(p) :] = 1
    index = np.zeros((num_prompts,), np.int32)
    index[: len(prompts)] = prompt_index
    row_prompt = np.repeat(index, n)
    row_sample = np.tile(np.arange(n, dtype=np.int32), num_prompts)
    keys = sample_keys(
      sampling.seed, jnp.asarray(row_prompt), jnp.asarray(row_sample)
    )
    greedy = sampling.is_greedy
    stop_ids = sampling.stop_token_ids or (-1,)
    plan = _Plan(
      num_prompts=num_prompts,
      prompt_len=prompt_len,
      n=n,
      new_token_capacity=new_token_capacity(sampling.max_new_tokens),
      greedy=greedy,
      top_k=0 if greedy else int(sampling.top_k),
      use_top_p=not greedy and sampling.top_p < 1.0,
      num_stop_ids=len(stop_ids),
      pad_id=self.pad_id,
      cache_dtype=self._default_cache_dtype(),
      activation_dtype=self.activation_dtype,
      mesh=self.mesh,
      fuse_projections=self.fuse_projections,
    )
    self._signatures.add((plan, _weight_layout(self._params)))
    tokens, mask = self._put_rows(tokens), self._put_rows(mask)
    out = _generate_chunk(
      self.rollout_config,
      plan,
      self._params,
      tokens,
      mask,
      self._put_rows(keys),
      jnp.float32(1.0 if greedy else sampling.temperature),
      jnp.float32(sampling.top_p),
      jnp.asarray(stop_ids, jnp.int32),
      jnp.int32(
        sampling.max_new_tokens
        if max_steps is None
        else min(max_steps, sampling.max_new_tokens)
      ),
    )
    out_tokens, out_logp, lengths, steps = jax.device_get(out)
    return out_tokens, out_logp, lengths, int(steps)

  def _put_rows(self, x):
    """`x` on the device, split by rows over ("data", "fsdp") on a mesh
    (replicated when they do not divide the row count)."""
    if self.mesh is None:
      return jnp.asarray(x)
    sharding = sharding_lib.batch_sharding(self.mesh)
    if np.shape(x)[0] % (self.mesh.shape["data"] * self.mesh.shape["fsdp"]):
      sharding = jax.sharding.NamedSharding(
        self.mesh, jax.sharding.PartitionSpec()
      )
    return jax.device_put(x, sharding)
