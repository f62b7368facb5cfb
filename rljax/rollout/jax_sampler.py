"""The JAX rollout engine (`JaxSampler`): the rljax decoder sampling in jit.

One `generate(prompt_ids, sampling)` call, concern by concern (file by file):

  request: prompt_ids, SamplingConfig (base), per-sample caps
     │
     ▼
  jax_sampler.JaxSampler    the engine: checks the request, holds the
     │                      rollout weights (sampler_weights.prepare: cast /
     │                      quantized / head copy / mesh layout, at
     │                      `update_weights`), picks the batching
     ▼
  sampler_runs.SamplerRuns  the engine's request paths (its base class):
     │                      program arguments per batching mode, the
     │                      RolloutBatch of what the programs sampled
     ▼
  request_plan              prompt bucket; static chunks of whole prompt
     │                      groups or continuous slot groups; the padded
     │                      inputs and the shapes a program is compiled for
     ▼ scheduler
     ├─ continuous (batching="continuous", off a mesh)
     │    slot_plan            the run's plan, program sizes, `warm`
     │    slot_scheduler.run   host loop: a queue of rows (longest expected
     │         │               first), prefills prompts as slots free
     │         │               (all n first tokens at once), decodes the
     │         │               live rows in the smallest row bucket that
     │         │               holds them; takes in-flight weight updates
     │         │               between chunks (`inflight`);
     │         │               `generate_stream`: prompts of later
     │         │               requests join as slots free (`prompt_feed`)
     │         ├─ slot_rows      the book: rows, prompts, entries, pages
     │         ├─ slot_program   jitted prefill into prompt pages, decode
     │         │                 chunks of a row bucket over the page pool
     │         ├─ kv_pages       every key and value in P-token pages of one
     │         │                 pool (a prompt's shared by its samples)
     │         ├─ paged_attention each row's attention over its pages, to
     │         │                 its own length (a C++ kernel on the CPU)
     │         └─ slot_recompute in-flight "recompute": live rows' KV
     │                           rewritten with the new weights
     │    slot_episodes.run    `run_episodes`: multi-turn rows keep their KV
     │                         across turns, leave the batch while a tool
     │                         runs; observations appended (`slot_append`)
     └─ static (batching="static", the default, and on a mesh)
          static_program._generate_chunk   one program per chunk of
                                   prompts: prefill, decode to its longest row
     ▼ programs
  token_sampling            one sampling step (temperature, top-k, top-p,
     │                      greedy) and the per-row PRNG keys, shared by
     │                      both programs
     ▼
  RolloutBatch (base)       responses, behaviour log-probs, finish reasons,
                            timing (tokens/s, decode steps, peak KV bytes)

Both share the prompt's KV among its n samples (shared-prefix attention;
the continuous engine through shared prompt pages) and draw token t of
sample j of prompt i from
fold_in(key(seed, i, j), t), so greedy decoding gives the same tokens and
log-probs either way (tests/rollout/test_continuous_batching.py).

Compiles are keyed by shapes and switches only (prompt bucket, slot or
prompt count, row bucket, n, new-token capacity bucket, greedy/top-k/top-p
on, number of stop ids, weight layout); temperature, top-p mass, stop ids
and max_new_tokens are traced, so an RL loop compiles a bounded set of programs
(`num_compiles`; experiments/count_compiles.py counts them over a run).

On a mesh (`mesh=`, a ("data", "fsdp", "tensor") Mesh) the static program
runs: the weights, INT8 / FP8 codes and their scales included, are laid out
by the logical-axis rules (`rljax.models.sharding.param_shardings`: heads,
kv_heads, mlp and vocab over "tensor", embed over "fsdp", which XLA
all-gathers for each matmul); prompts, samples and both KV caches (prefix and
generated) are split over ("data", "fsdp") by rows and over "tensor" by KV
heads. Greedy decoding gives the single-device tokens and log-probs
(tests/rollout/test_jax_sampler.py).

The names this module had before the split (`default_prompt_buckets`,
`rollout_config`, `tree_nbytes`, `sample_keys`, `decode_segments`, ...)
stay importable from it.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rljax.rollout import compile_cache
from rljax.rollout import inflight
from rljax.rollout import request_plan
from rljax.rollout import sampler_weights
from rljax.rollout import slot_plan
from rljax.rollout import spec_control
from rljax.rollout import spec_store
from rljax.rollout.base import RolloutBatch, SamplingConfig, SyncStats
from rljax.rollout.base import check_prompts
from rljax.rollout.sampler_runs import SamplerRuns

# Re-exported: the public (and test-visible) names of this module before the
# split by concern, so that every import path keeps working.
from rljax.rollout.request_plan import check_row_limits as _check_row_limits  # noqa: F401
from rljax.rollout.request_plan import default_prompt_buckets  # noqa: F401
from rljax.rollout.request_plan import next_power_of_two as _next_power_of_two  # noqa: F401
from rljax.rollout.request_plan import static_kv_bytes as _static_kv_bytes  # noqa: F401
from rljax.rollout.sampler_weights import HEAD_QUANT_MODES as _HEAD_QUANT_MODES  # noqa: F401
from rljax.rollout.sampler_weights import LOW_BIT_MODES as _LOW_BIT_MODES  # noqa: F401
from rljax.rollout.sampler_weights import QUANT_MODES  # noqa: F401
from rljax.rollout.sampler_weights import check_quant as _check_quant  # noqa: F401
from rljax.rollout.sampler_weights import rollout_config  # noqa: F401
from rljax.rollout.sampler_weights import tree_nbytes  # noqa: F401
from rljax.rollout.sampler_weights import weight_layout as _weight_layout  # noqa: F401
from rljax.rollout.sampler_weights import with_head as _with_head  # noqa: F401
from rljax.rollout.static_program import _Plan  # noqa: F401
from rljax.rollout.static_program import decode_segments  # noqa: F401
from rljax.rollout.static_program import new_token_capacity  # noqa: F401
from rljax.rollout.token_sampling import _TOP_P_FAST_K  # noqa: F401
from rljax.rollout.token_sampling import sample_keys  # noqa: F401
from rljax.rollout.token_sampling import sample_next_token  # noqa: F401

BATCHING_MODES = ("continuous", "static")


class JaxSampler(SamplerRuns):
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
    inflight_kv: str = "keep",
    kv_page_size: int = 0,
    speculative: Any = "off",
    draft_store: spec_store.PromptStore | None = None,
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
      group_width: accepted for callers of the slot-group engine (a
        divisor of every request's n): rows now refill one at a time and
        always read their prompt's shared pages, so it changes nothing.
      inflight_kv: what an in-flight weight update (`generate`'s
        `weight_updates`) does to the rows it finds decoding: "keep" their
        KV, made by the old weights (PipelineRL), or "recompute" it with
        the new ones first (AReaL; `slot_recompute.recompute_kv`).
      kv_page_size: continuous batching's page size P, token slots a
        page of the KV pool (`kv_pages`); 0: the default (16). The pool
        holds every row's and prompt's keys and values and is allocated
        once per request at its full size.
      speculative: continuous batching's speculative decoding: "off",
        "suffix" (drafts from suffix matches over the row's own text, its
        siblings' and earlier responses to the prompt; `spec_control`) or
        a `spec_control.SpecConfig`. Samples and log-probs are those of
        plain decoding (`spec_accept`); only the speed changes.
      draft_store: the earlier responses per prompt that drafts may come
        from (`spec_store.PromptStore`); default one in memory for the
        sampler's life.
    """
    # Compiled programs persist across processes (`compile_cache`).
    compile_cache.enable()
    self._quant = sampler_weights.check_quant(quant, "JaxSampler")
    self.inflight_kv = inflight.check_inflight_kv(inflight_kv, "JaxSampler")
    if batching not in BATCHING_MODES:
      raise ValueError(
        f"JaxSampler: batching={batching!r}; expected one of {BATCHING_MODES}"
      )
    for name, value, least, hint in (
      ("decode_slots", decode_slots, 1, ""),
      ("chunk_steps", chunk_steps, 1, ""),
      ("group_width", group_width, 1, ""),
      ("kv_page_size", kv_page_size, 0, " (0: the default)"),
    ):
      if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or value < least
      ):
        raise ValueError(
          f"JaxSampler: {name}={value!r}; expected an int >= {least}{hint}"
        )
    prompt_buckets = request_plan.check_prompt_buckets(
      prompt_buckets, max_prompt_len
    )
    if not isinstance(max_batch, int) or max_batch < 1:
      raise ValueError(
        f"JaxSampler: max_batch={max_batch!r}; expected an int >= 1"
      )
    if head_quant not in sampler_weights.HEAD_QUANT_MODES:
      raise ValueError(
        f"JaxSampler: head_quant={head_quant!r}; expected one "
        f"of {sampler_weights.HEAD_QUANT_MODES}"
      )
    self.config = config
    self.head_quant = head_quant
    self.rollout_config = sampler_weights.rollout_config(config, head_quant)
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
    self.kv_page_size = kv_page_size
    self.speculative = spec_control.check_mode(speculative, "JaxSampler")
    if self.speculative is not None and draft_store is None:
      draft_store = spec_store.PromptStore(
        self.speculative.history_prompts, self.speculative.history_per_prompt
      )
    self.draft_store = draft_store
    self._params = None
    self._signatures: set[Any] = set()
    # (seconds into the last continuous rollout, live share) per chunk.
    self.last_timeline: list[tuple[float, float]] = []
    # The last continuous rollout's `SlotRun.stats` (swap figures included).
    self.last_stats: dict[str, Any] = {}
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

  @property
  def activation_dtype(self) -> jnp.dtype | None:
    """The rollout's activation dtype; None: the embedding's (the weights').
    The rule and why: `sampler_weights.activation_dtype`."""
    return sampler_weights.activation_dtype(self._quant, self._params)

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
    start = time.perf_counter()
    new_params = sampler_weights.prepare(
      self.config,
      params,
      self._quant,
      self.head_quant,
      self.fake_quant,
      self.mesh,
    )
    seconds = time.perf_counter() - start
    self._params = new_params
    return SyncStats(
      seconds=seconds, bytes=sampler_weights.tree_nbytes(new_params)
    )

  def close(self) -> None:
    self._params = None
    self._closed = True

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
      plan = self._slot_plan(prompts, sampling)
      slot_plan.warm(
        self.rollout_config,
        self._slot_params(),
        plan,
        sampling,
        most_prompts=min(len(prompts), plan.slots),
        note_program=self._note(),
        recompute=self.inflight_kv == "recompute",
      )
      if self.speculative is not None:
        spec_control.warm(
          self.rollout_config,
          self._slot_params()[1],
          plan,
          sampling,
          self.speculative,
          note_program=self._note(),
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
    *,
    weight_updates: Any = None,
    version: int = 0,
    expected_lengths: Sequence[float] | None = None,
  ) -> RolloutBatch:
    """Samples `sampling.n` responses per prompt (see `RolloutBatch`).

    `max_new_tokens_per_sample` (P·n ints in [1, max_new_tokens], row order
    of `RolloutBatch`) caps each sample on its own, as vLLM's per-request
    `max_tokens` (the benchmark's long-tail workload).

    `weight_updates`, continuous batching only (`inflight`): a callable
    polled between decode chunks, returning None or (full-precision params,
    new_version >= the current one), prepared as `update_weights` does
    (same path) and kept by the engine; rows in flight keep or recompute
    their KV (`inflight_kv`). The batch then carries `policy_version`
    (`version` before the first update, each update's after it) and
    `last_stats` the swaps. Without a hook: the call as before the option.

    `expected_lengths`, continuous batching only: per prompt, the response
    length expected (e.g. the trainer's running mean over earlier
    responses to it; None or NaN: unknown). Rows are admitted longest
    expected first (with `max_new_tokens_per_sample`, a sample's own cap
    bounds it), so the long rows do not start last and run alone at the
    end. Samples do not change with the order: a row's key is its own.
    """
    prompts, chunks = self._check_generate_args(
      prompt_ids, sampling, "generate"
    )
    swaps = inflight.swaps_for(self, weight_updates, version, self._slot_params)
    n = sampling.n
    limits = request_plan.check_row_limits(
      max_new_tokens_per_sample, len(prompts) * n, sampling.max_new_tokens
    )
    start = time.perf_counter()
    self._last_kv_bytes = 0
    expected = _check_expected(expected_lengths, len(prompts))
    if self.batching == "continuous":
      return self._generate_continuous(
        prompts, sampling, start, limits, swaps, expected
      )
    return self._generate_static(prompts, chunks, sampling, start, limits)

  # -- request checks ---------------------------------------------------------

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
    request_plan.check_prompt_lengths(prompts, self.max_prompt_len, where)
    chunks = request_plan.chunk_indices(
      len(prompts), sampling.n, self.max_batch
    )
    return prompts, chunks

  def _bucket(self, length: int) -> int:
    return request_plan.bucket_for(self.prompt_buckets, length)

  def _default_cache_dtype(self):
    """The static program's cache dtype (`sampler_weights.cache_dtype`)."""
    return sampler_weights.cache_dtype(
      self._cache_dtype, self._quant, self._params
    )


def _check_expected(expected, num_prompts: int):
  """`expected_lengths` as float64 [P] (unknown: max_new_tokens, i.e. no
  cap), or None."""
  if expected is None:
    return None
  arr = np.asarray(
    [np.inf if e is None else e for e in expected], dtype=np.float64
  )
  if arr.shape != (num_prompts,) or np.any(arr[~np.isnan(arr)] < 0):
    raise ValueError(
      f"JaxSampler.generate: expected_lengths has shape {arr.shape}; "
      f"expected {num_prompts} floats >= 0 (None/NaN: unknown)"
    )
  return np.where(np.isnan(arr), np.inf, arr)
