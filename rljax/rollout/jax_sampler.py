"""The JAX rollout engine (`JaxSampler`): the rljax decoder sampling in jit.

The flow of one `generate(prompts, sampling)` call, file by file:

  jax_sampler.JaxSampler      checks the request, holds the rollout weights
        │                     (cast / quantized, `update_weights`) and picks
        │                     the batching:
        ├─ continuous (default off a mesh)
        │    slot_scheduler.run   host loop: a queue of prompts, G slot groups
        │         │               of n rows; refills freed groups between
        │         │               chunks of decode steps
        │         └─ slot_program   jitted prefill into free groups, decode
        │                         chunks with per-row cache slots, cache
        │                         resize (own KV capacity follows the
        │                         longest live row)
        └─ static (batching="static", and on a mesh)
             static_program._generate_chunk  one program per chunk of
                                  prompts: prefill, decode to its longest row
  token_sampling                  one sampling step (temperature, top-k,
                                  top-p, greedy) and the per-row PRNG keys,
                                  shared by both programs

Both share the prompt's KV among its n samples (shared-prefix attention) and
draw token t of sample j of prompt i from fold_in(key(seed, i, j), t), so
greedy decoding gives the same tokens and log-probs either way
(tests/rollout/test_continuous_batching.py).

Compiles are keyed by shapes and switches only (prompt bucket, slot or
prompt count, n, new-token capacity bucket, greedy/top-k/top-p on, number of
stop ids, weight layout); temperature, top-p mass, stop ids and
max_new_tokens are traced, so an RL loop compiles a bounded set of programs.

On a mesh (`mesh=`, a ("data", "fsdp", "tensor") Mesh) the static program
runs: the weights, INT8 / FP8 codes and their scales included, are laid out
by the logical-axis rules (`rljax.models.sharding.param_shardings`: heads,
kv_heads, mlp and vocab over "tensor", embed over "fsdp", which XLA
all-gathers for each matmul); prompts, samples and both KV caches (prefix and
generated) are split over ("data", "fsdp") by rows and over "tensor" by KV
heads. Greedy decoding gives the single-device tokens and log-probs
(tests/rollout/test_jax_sampler.py).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rljax import models
from rljax.models import decoder as decoder_lib
from rljax.models import sharding as sharding_lib
from rljax import quant as quant_lib
from rljax.rollout import slot_scheduler
from rljax.rollout.base import RolloutBatch, SamplingConfig, SyncStats
from rljax.rollout.base import check_prompts
from rljax.rollout.static_program import _generate_chunk
from rljax.rollout.static_program import _Plan
from rljax.rollout.static_program import decode_segments
from rljax.rollout.static_program import new_token_capacity
from rljax.rollout.token_sampling import _TOP_P_FAST_K  # noqa: F401
from rljax.rollout.token_sampling import sample_keys
from rljax.rollout.token_sampling import sample_next_token  # noqa: F401

# Accepted values of `quant`; "none" and "f32" both mean "params as given".
QUANT_MODES = quant_lib.ROLLOUT_MODES
_LOW_BIT_MODES = quant_lib.MODES


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


BATCHING_MODES = ("continuous", "static")


def _check_row_limits(limits, rows: int, most: int) -> np.ndarray | None:
  if limits is None:
    return None
  arr = np.asarray(limits)
  if (
    arr.shape != (rows,)
    or not np.issubdtype(arr.dtype, np.integer)
    or (arr.size and (arr.min() < 1 or arr.max() > most))
  ):
    raise ValueError(
      f"JaxSampler.generate: max_new_tokens_per_sample has shape {arr.shape}"
      f" and dtype {arr.dtype}; expected {rows} ints (prompts x n) in "
      f"[1, max_new_tokens={most}]"
    )
  return arr.astype(np.int64)


def _static_kv_bytes(config, plan: _Plan, steps: int) -> int:
  """Bytes of a static chunk's prefix and own caches at its last segment."""
  own = next(
    (end for end in decode_segments(plan.new_token_capacity) if end >= steps),
    plan.new_token_capacity,
  )
  per_token = (
    2
    * config.num_layers
    * config.num_kv_heads
    * config.head_dim
    * jnp.dtype(plan.cache_dtype).itemsize
  )
  rows = plan.num_prompts * plan.n
  return per_token * (plan.num_prompts * plan.prompt_len + rows * own)


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
    batching: str = "static",
    decode_slots: int | None = None,
    chunk_steps: int = 32,
    group_width: int | None = None,
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
      batching: "static" (the default: each chunk of prompts decoded to
        its longest row, `static_program`) or "continuous" (decode slots
        refilled between chunks of steps as samples end,
        `slot_scheduler`). Static stays the default because continuous has
        not yet measured faster on this project's workloads
        (docs/performance.md). A mesh always runs "static".
      decode_slots: continuous batching's slot count S, rounded down to
        whole groups of n (at least one group); default `max_batch`.
      chunk_steps: continuous batching's most decode steps between two
        refills.
      group_width: continuous batching's rows per slot group, a divisor of
        every request's n; default n (a group is one prompt's n samples,
        reading one copy of its prompt's keys). Narrower groups refill
        sooner after a sample ends, at the cost of n / width prefix copies
        (`slot_scheduler.run`).
    """
    self._quant = _check_quant(quant, "JaxSampler")
    if batching not in BATCHING_MODES:
      raise ValueError(
        f"JaxSampler: batching={batching!r}; expected one of {BATCHING_MODES}"
      )
    for name, value in (
      ("decode_slots", decode_slots),
      ("chunk_steps", chunk_steps),
      ("group_width", group_width),
    ):
      if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or value < 1
      ):
        raise ValueError(f"JaxSampler: {name}={value!r}; expected an int >= 1")
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
    # The slot programs run on one device: a mesh keeps the static program.
    self.batching = "static" if mesh is not None else batching
    self.decode_slots = decode_slots
    self.chunk_steps = chunk_steps
    self.group_width = group_width
    self._params = None
    self._signatures: set[Any] = set()
    # (seconds into the last continuous rollout, live share) per chunk.
    self.last_timeline: list[tuple[float, float]] = []
    self._last_kv_bytes = 0
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
    if self.batching == "continuous":
      slot_scheduler.warm(
        self.rollout_config,
        self._slot_params(),
        sampling,
        **self._slot_args(prompts, sampling),
      )
      return time.perf_counter() - start
    seen = set()
    for chunk in chunks:
      chunk_prompts = [prompts[i] for i in chunk]
      shape = (len(chunk), self._bucket(max(len(p) for p in chunk_prompts)))
      if shape not in seen:
        seen.add(shape)
        self._run_chunk(chunk_prompts, chunk, sampling, max_steps=1)
    return time.perf_counter() - start

  def generate(
    self,
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    max_new_tokens_per_sample: Sequence[int] | None = None,
  ) -> RolloutBatch:
    """Samples `sampling.n` responses per prompt (see `RolloutBatch`).

    `max_new_tokens_per_sample` (P·n ints in [1, max_new_tokens], row order
    of `RolloutBatch`) caps each sample on its own, as vLLM's per-request
    `max_tokens` (the benchmark's long-tail workload).
    """
    prompts, chunks = self._check_generate_args(
      prompt_ids, sampling, "generate"
    )
    n = sampling.n
    limits = _check_row_limits(
      max_new_tokens_per_sample, len(prompts) * n, sampling.max_new_tokens
    )
    start = time.perf_counter()
    self._last_kv_bytes = 0
    if self.batching == "continuous":
      return self._generate_continuous(prompts, sampling, start, limits)
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
      rows = [i * n + j for i in chunk for j in range(n)]
      tokens, logp, lengths, steps = self._run_chunk(
        [prompts[i] for i in chunk],
        chunk,
        sampling,
        row_limits=None if limits is None else limits[rows],
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
      "kv_bytes_peak": self._last_kv_bytes,
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

  def _slot_params(self):
    """The rollout weights as the slot programs read them (made per call)."""
    layout = _weight_layout(self._params)
    self._signatures.add(("prepare", self.fuse_projections, layout))
    return slot_scheduler.prepare_params(self._params, self.fuse_projections)

  def _slot_args(self, prompts, sampling) -> dict[str, Any]:
    """The continuous engine's shapes for a request: G groups of n rows
    (fewer for a small request, a power of two of its prompt count, as the
    static engine's prompt count), the prompt bucket of its longest prompt."""
    n = sampling.n
    width = self.group_width or n
    if n % width:
      raise ValueError(
        f"JaxSampler: group_width={width} does not divide "
        f"SamplingConfig.n={n}; expected a divisor of every request's n"
      )
    most_groups = max(1, (self.decode_slots or self.max_batch) // width)
    units = len(prompts) * (n // width)
    groups = min(_next_power_of_two(units), most_groups)
    layout = _weight_layout(self._params)
    return {
      "group_width": width,
      "groups": groups,
      "prompt_len": self._bucket(max(len(p) for p in prompts)),
      "chunk_steps": self.chunk_steps,
      "pad_id": self.pad_id,
      "cache_dtype": self._default_cache_dtype(),
      "activation_dtype": self.activation_dtype,
      "note_program": lambda sig: self._signatures.add((sig, layout)),
    }

  def _generate_continuous(
    self, prompts, sampling, start, limits
  ) -> RolloutBatch:
    out = slot_scheduler.run(
      self.rollout_config,
      self._slot_params(),
      prompts,
      list(range(len(prompts))),
      sampling,
      row_limits=limits,
      **self._slot_args(prompts, sampling),
    )
    stop_set = set(sampling.stop_token_ids)
    reasons = [
      "stop" if ids and ids[-1] in stop_set else "length" for ids in out.tokens
    ]
    seconds = time.perf_counter() - start
    num_tokens = int(sum(len(r) for r in out.tokens))
    timing = {
      "seconds": seconds,
      "tokens": num_tokens,
      "tokens_per_s": num_tokens / seconds if seconds > 0 else float("inf"),
      **{k: v for k, v in out.stats.items() if k != "timeline"},
    }
    self.last_timeline = out.stats["timeline"]
    return RolloutBatch(
      prompt_ids=prompts,
      response_ids=out.tokens,
      behav_logp=out.logp,
      finish_reason=reasons,
      n=sampling.n,
      timing=timing,
    )

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
    row_limits: np.ndarray | None = None,
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
    limit = sampling.max_new_tokens
    if max_steps is not None:
      limit = min(max_steps, limit)
    limits = np.full((num_prompts * n,), limit, np.int32)
    if row_limits is not None:
      limits[: len(prompts) * n] = np.minimum(row_limits, limit)
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
      jnp.int32(limit),
      self._put_rows(limits),
    )
    out_tokens, out_logp, lengths, steps = jax.device_get(out)
    self._last_kv_bytes = max(
      self._last_kv_bytes,
      _static_kv_bytes(self.rollout_config, plan, int(steps)),
    )
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
