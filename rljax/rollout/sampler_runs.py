"""How a checked `JaxSampler` request runs, per batching mode: the host
side that turns the engine's settings into program arguments, runs the
programs and gathers what they sampled into a `RolloutBatch`.

  continuous  `_slot_plan` (S rows, the prompt bucket, pages),
              `_slot_params` (the weights as the slot programs read them),
              then `slot_scheduler.run` (`generate`, `generate_stream`)
  static      chunk by chunk (`request_plan.static_chunk`): `_run_chunk`
              puts a chunk's rows on the device (split over the mesh) and
              runs `static_program._generate_chunk` on them

`SamplerRuns` is `JaxSampler`'s base class, not an engine on its own: the
request checks, the weights and the choice of path are `jax_sampler`'s.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import sharding as sharding_lib
from rljax.rollout import inflight
from rljax.rollout import request_plan
from rljax.rollout import sampler_weights
from rljax.rollout import slot_episodes
from rljax.rollout import slot_plan
from rljax.rollout import slot_scheduler
from rljax.rollout import spec_control
from rljax.rollout.base import RolloutBatch, SamplingConfig
from rljax.rollout.static_program import _generate_chunk
from rljax.rollout.token_sampling import sample_keys


class SamplerRuns:
  """The request paths of `JaxSampler` (its base class).

  They read the engine's settings (`rollout_config`, `pad_id`, `max_batch`,
  `mesh`, `chunk_steps`, ...) and weights (`_params`), note each program
  they run in `_signatures` (`num_compiles`), and leave the last run's
  figures in `last_timeline`, `last_stats` and `_last_kv_bytes`.
  """

  # `generate_stream` honours a feed's cut and continues handed-back rows
  # (`prompt_feed`, `slot_resume`).
  stream_cuts = True

  # -- continuous batching ----------------------------------------------------

  def generate_stream(
    self,
    feed: Any,
    shape_prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    *,
    weight_updates: Any = None,
    version: int = 0,
  ) -> dict[str, Any]:
    """A streamed continuous-batching run (`prompt_feed`): the prompts
    `feed.poll` admits, while the run lasts, share the slots; each prompt's
    rows go to `feed.done` as soon as they all end. The run's shapes (slot
    groups, prompt bucket) are those of a request of `shape_prompts` (the
    first request it will run), so a run fed one request at a time samples
    what `generate` would. Returns when the feed has nothing more and every
    row ended (or `feed.stopped()`), with the run's stats (with a hook: the
    swaps and `final_version`). `sampling.seed` is unused: each prompt
    brings its request's seed. A feed with `cut`/`handback` may end the
    run at a swap point, its unfinished prompts handed back with their rows
    so far; a prompt with `partial` continues them (`prompt_feed`)."""
    prompts, _ = self._check_generate_args(
      shape_prompts, sampling, "generate_stream"
    )
    if self.batching != "continuous":
      raise ValueError(
        f"JaxSampler.generate_stream: batching={self.batching!r}; expected "
        "'continuous' (a stream refills free slots between decode chunks)"
      )
    swaps = inflight.swaps_for(self, weight_updates, version, self._slot_params)
    out = slot_scheduler.run(
      self.rollout_config,
      self._slot_params(),
      self._slot_plan(prompts, sampling),
      [],
      [],
      sampling,
      note_program=self._note(),
      swaps=swaps,
      feed=feed,
      spec=self._speculator(),
    )
    self.last_timeline = out.stats["timeline"]
    self.last_stats = out.stats
    self._add_spec_counts(out.stats)
    return out.stats

  @property
  def keeps_episode_kv(self) -> bool:
    """`run_episodes` is available: multi-turn rows keep their KV across
    turns and leave the decode batch while their tools run."""
    return self.batching == "continuous"

  def run_episodes(
    self,
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    host: slot_episodes.EpisodeHost,
    *,
    budget: int,
    first_limits: Sequence[int],
  ) -> dict[str, Any]:
    """Multi-turn episodes of `sampling.n` rows per prompt, each row's KV
    kept from turn to turn (`slot_episodes`): `host` reads every segment a
    row decodes and answers with the row's next step (an observation to
    append, a continuation, the end, or later). `budget` bounds a row's
    ids after its prompt (sampled and appended together); `first_limits`
    (P·n) its first segment. Returns the run's figures (also in
    `last_stats`). Continuous batching only; plain decoding (speculation
    and in-flight updates are not taken here)."""
    prompts, _ = self._check_generate_args(prompt_ids, sampling, "run_episodes")
    if not self.keeps_episode_kv:
      raise ValueError(
        f"JaxSampler.run_episodes: batching={self.batching!r}; expected "
        "'continuous' (episodes keep their rows' pages in the page pool)"
      )
    rows = len(prompts) * sampling.n
    plan = self._slot_plan(
      prompts, dataclasses.replace(sampling, max_new_tokens=budget)
    )
    # Powers of two, as the row buckets: the plan keys every program, so
    # exact counts would compile a new set for each batch size.
    plan = dataclasses.replace(
      plan,
      held_rows=request_plan.next_power_of_two(rows),
      entries=max(plan.entries, request_plan.next_power_of_two(len(prompts))),
    )
    stats = slot_episodes.run(
      self.rollout_config,
      self._slot_params(),
      plan,
      prompts,
      sampling,
      host,
      list(first_limits),
      note_program=self._note(),
    )
    self.last_stats = stats
    return stats

  def _speculator(self):
    """A `spec_control.Speculator` for the next run, if speculation is on."""
    if getattr(self, "speculative", None) is None:
      return None
    return spec_control.Speculator(self.speculative, self.draft_store)

  def _add_spec_counts(self, stats) -> None:
    counts = stats.get("spec_counts")
    if counts:
      if not hasattr(self, "_spec_counts"):
        self._spec_counts = collections.Counter()
      self._spec_counts.update(counts)

  def take_spec_metrics(self) -> dict[str, float]:
    """The speculation figures (`spec_control.figures`) of the runs since
    the last call (a training step's); {} with speculation off."""
    if getattr(self, "speculative", None) is None:
      return {}
    counts = getattr(self, "_spec_counts", collections.Counter())
    self._spec_counts = collections.Counter()
    return spec_control.figures(counts)

  def _slot_params(self):
    """The rollout weights as the slot programs read them (made per call)."""
    layout = sampler_weights.weight_layout(self._params)
    self._signatures.add(("prepare", self.fuse_projections, layout))
    return slot_plan.prepare_params(self._params, self.fuse_projections)

  def _slot_plan(self, prompts, sampling):
    """The continuous engine's plan for a request: S rows (fewer for a
    small request: a power of two of its row count, as the static engine's
    prompt count), the prompt bucket of its longest prompt, pages of
    `kv_page_size` slots in the cache dtype (`paged_cache_dtype`)."""
    if self.group_width and sampling.n % self.group_width:
      raise ValueError(
        f"JaxSampler: group_width={self.group_width} does not divide "
        f"SamplingConfig.n={sampling.n}; expected a divisor of every "
        "request's n"
      )
    rows = request_plan.next_power_of_two(len(prompts) * sampling.n)
    return slot_plan.make_plan(
      self.rollout_config,
      sampling,
      slots=min(rows, self.decode_slots or self.max_batch),
      prompt_len=self._bucket(max(len(p) for p in prompts)),
      chunk_steps=self.chunk_steps,
      pad_id=self.pad_id,
      cache_dtype=sampler_weights.paged_cache_dtype(
        self._cache_dtype, self._quant, self._params
      ),
      activation_dtype=self.activation_dtype,
      page_size=self.kv_page_size or slot_plan.DEFAULT_PAGE_SIZE,
    )

  def _note(self):
    layout = sampler_weights.weight_layout(self._params)
    return lambda sig: self._signatures.add((sig, layout))

  def _generate_continuous(
    self, prompts, sampling, start, limits, swaps=None, expected=None
  ) -> RolloutBatch:
    n = sampling.n
    priorities = None
    if limits is not None or expected is not None:
      # Longest expected first: a sample's own limit, capped by its prompt's
      # expected length (the trainer's running mean) where one is given.
      priorities = np.full((len(prompts) * n,), float(sampling.max_new_tokens))
      if limits is not None:
        priorities = np.minimum(priorities, limits)
      if expected is not None:
        priorities = np.minimum(priorities, np.repeat(expected, n))
    out = slot_scheduler.run(
      self.rollout_config,
      self._slot_params(),
      self._slot_plan(prompts, sampling),
      prompts,
      list(range(len(prompts))),
      sampling,
      note_program=self._note(),
      row_limits=limits,
      priorities=priorities,
      swaps=swaps,
      spec=self._speculator(),
    )
    self.last_timeline = out.stats["timeline"]
    self.last_stats = out.stats
    self._add_spec_counts(out.stats)
    # Timing takes the scalars (not the timeline, the per-swap row counts).
    stats = {
      k: v for k, v in out.stats.items() if not isinstance(v, (list, dict))
    }
    return _batch(
      prompts, out.tokens, out.logp, sampling, start, stats, out.versions
    )

  # -- static batching --------------------------------------------------------

  def _generate_static(
    self, prompts, chunks, sampling, start, limits
  ) -> RolloutBatch:
    """`generate`'s static path: each chunk of prompts (`chunks`, lists of
    prompt indices) decoded by one program, to its longest row."""
    n = sampling.n
    responses: list[list[int]] = []
    behav: list[np.ndarray] = []
    decode_steps = 0
    iterator = chunks
    if self.show_progress and len(chunks) > 1:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top

      iterator = tqdm(chunks, desc="rollout", unit="chunk")
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
        responses.append(tokens[row, :length].tolist())
        behav.append(np.asarray(logp[row, :length], np.float32))
    stats = {
      "decode_steps": decode_steps,
      "chunks": len(chunks),
      "kv_bytes_peak": self._last_kv_bytes,
    }
    return _batch(prompts, responses, behav, sampling, start, stats)

  def _run_chunk(
    self,
    prompts: list[list[int]],
    prompt_index: list[int],
    sampling: SamplingConfig,
    max_steps: int | None = None,
    row_limits: np.ndarray | None = None,
  ):
    greedy = sampling.is_greedy
    chunk = request_plan.static_chunk(
      prompts,
      prompt_index,
      sampling,
      prompt_len=self._bucket(max(len(p) for p in prompts)),
      max_batch=self.max_batch,
      pad_id=self.pad_id,
      cache_dtype=self._default_cache_dtype(),
      activation_dtype=self.activation_dtype,
      mesh=self.mesh,
      fuse_projections=self.fuse_projections,
      max_steps=max_steps,
      row_limits=row_limits,
    )
    plan = chunk.plan
    self._signatures.add((plan, sampler_weights.weight_layout(self._params)))
    keys = sample_keys(
      sampling.seed,
      jnp.asarray(chunk.row_prompt),
      jnp.asarray(chunk.row_sample),
    )
    out = _generate_chunk(
      self.rollout_config,
      plan,
      self._params,
      self._put_rows(chunk.tokens),
      self._put_rows(chunk.mask),
      self._put_rows(keys),
      jnp.float32(1.0 if greedy else sampling.temperature),
      jnp.float32(sampling.top_p),
      jnp.asarray(chunk.stop_ids, jnp.int32),
      jnp.int32(chunk.limit),
      self._put_rows(chunk.limits),
    )
    out_tokens, out_logp, lengths, steps = jax.device_get(out)
    self._last_kv_bytes = max(
      self._last_kv_bytes,
      request_plan.static_kv_bytes(self.rollout_config, plan, int(steps)),
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


def _batch(
  prompts, responses, behav, sampling, start, stats, versions=None
) -> RolloutBatch:
  """The request's `RolloutBatch`: finish reasons from the last token, the
  timing (wall seconds since `start`, tokens/s) plus the engine's `stats`,
  per-token policy `versions` (None: unknown)."""
  stop_set = set(sampling.stop_token_ids)
  reasons = [
    "stop" if ids and ids[-1] in stop_set else "length" for ids in responses
  ]
  seconds = time.perf_counter() - start
  num_tokens = int(sum(len(r) for r in responses))
  timing = {
    "seconds": seconds,
    "tokens": num_tokens,
    "tokens_per_s": num_tokens / seconds if seconds > 0 else float("inf"),
    **stats,
  }
  return RolloutBatch(
    prompt_ids=prompts,
    response_ids=responses,
    behav_logp=behav,
    finish_reason=reasons,
    n=sampling.n,
    timing=timing,
    policy_version=versions,
  )
