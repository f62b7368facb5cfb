"""What a continuous run compiles, fixed before it starts: a request's
`SlotPlan` (`make_plan`), the prefill sizes and row buckets it may use, the
traced sampling scalars, the weights as the slot programs read them
(`prepare_params`), and `warm`, which compiles every one of those programs
ahead of a run on throwaway inputs.

The run itself, the host loop that calls these programs, is
`slot_scheduler.run`; the programs are `slot_program`'s.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import decoder as decoder_lib
from rljax.models import fusion as fusion_lib
from rljax.rollout import kv_pages
from rljax.rollout import paged_attention as attention_lib
from rljax.rollout import slot_program
from rljax.rollout import slot_recompute
from rljax.rollout.base import SamplingConfig
from rljax.rollout.static_program import new_token_capacity

# Token slots a page when the caller gives none.
DEFAULT_PAGE_SIZE = 16


@functools.partial(jax.jit, static_argnums=(1,))
def prepare_params(params, fuse: bool):
  """(prefill params, decode params): the decode program reads each layer's
  weights as a buffer of its own (`decoder.unstack_layers`), made once per
  rollout rather than once per chunk of steps."""
  if fuse:
    params = fusion_lib.fuse_projections(params)
  decode = {**params, "layers": decoder_lib.unstack_layers(params["layers"])}
  return params, decode


def prefill_sizes(most: int) -> tuple[int, ...]:
  """Prompt counts a prefill program is compiled for: 1, 2, 4, ... up to
  `most` (a power of two at or above it); a prefill of fewer prompts pads
  to the next one, so at most half of a prefill is padding."""
  sizes, size = [1], 1
  while size < most:
    size *= 2
    sizes.append(size)
  return tuple(sizes)


def page_aligned(prompt_len: int, page_size: int) -> int:
  """The prompt bucket rounded up to whole pages (prompts are left-padded,
  so the extra slots are padding before the prompt)."""
  return kv_pages.pages_for(prompt_len, page_size) * page_size


def make_plan(
  config: Any,
  sampling: SamplingConfig,
  *,
  slots: int,
  prompt_len: int,
  chunk_steps: int,
  pad_id: int,
  cache_dtype: Any,
  activation_dtype: Any,
  page_size: int = DEFAULT_PAGE_SIZE,
  entries: int | None = None,
) -> slot_program.SlotPlan:
  """The static plan of a request's slot programs: S = `slots` rows at
  most, E = `entries` prompt entries (default S: every live row's prompt,
  with room for the prompts of rows waiting for a slot)."""
  greedy = sampling.is_greedy
  return slot_program.SlotPlan(
    slots=slots,
    n=sampling.n,
    prompt_len=page_aligned(prompt_len, page_size),
    new_tokens=new_token_capacity(sampling.max_new_tokens),
    chunk_steps=chunk_steps,
    greedy=greedy,
    top_k=0 if greedy else int(sampling.top_k),
    use_top_p=not greedy and sampling.top_p < 1.0,
    num_stop_ids=len(sampling.stop_token_ids or (-1,)),
    pad_id=pad_id,
    cache_dtype=jnp.dtype(cache_dtype),
    activation_dtype=activation_dtype,
    page_size=page_size,
    entries=entries or slots,
    attention=attention_lib.choose(config.head_dim, page_size, cache_dtype),
  )


def traced_args(sampling: SamplingConfig) -> tuple[Any, ...]:
  """The traced sampling scalars: temperature, top-p, stop ids."""
  return (
    jnp.float32(1.0 if sampling.is_greedy else sampling.temperature),
    jnp.float32(sampling.top_p),
    jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32),
  )


def empty_rows(plan: slot_program.SlotPlan, count: int) -> dict[str, Any]:
  """A bucket of `count` padding rows (done, no entry), as numpy."""
  key = jax.random.key_data(jax.random.key(0))
  return {
    "tok": np.full((count,), plan.pad_id, np.int32),
    "pos": np.zeros((count,), np.int32),
    "length": np.ones((count,), np.int32),
    "limit": np.ones((count,), np.int32),
    "done": np.ones((count,), bool),
    "keys": np.broadcast_to(np.asarray(key), (count, *key.shape)).copy(),
    "entry": np.full((count,), -1, np.int32),
  }


def empty_prefix(plan: slot_program.SlotPlan) -> attention_lib.Prefix:
  """Entries holding no pages (numpy)."""
  return attention_lib.Prefix(
    np.full((plan.entries, plan.prompt_pages), plan.pool_pages, np.int32),
    np.zeros((plan.entries,), np.int32),
    np.zeros((plan.entries,), np.int32),
  )


def warm(
  config: Any,
  params: tuple[Any, Any],
  plan: slot_program.SlotPlan,
  sampling: SamplingConfig,
  *,
  most_prompts: int,
  note_program: Callable[[Any], None] = lambda sig: None,
  recompute: bool = False,
) -> None:
  """Compiles the programs `run` may call for this plan: the pool, a
  prefill of each size up to `most_prompts`, a decode chunk at each row
  bucket (one step each, on padding rows: nothing is written); with
  `recompute`, `recompute_kv` at each width and row count."""
  prefill_params, decode_params = params
  temperature, top_p, stop_ids = traced_args(sampling)
  note_program(("init", plan))
  pool = slot_program.init_pool(config, plan)
  n = plan.pool_pages
  for f in prefill_sizes(most_prompts):
    note_program(("prefill", plan, f))
    pool, *_ = slot_program.prefill(
      config,
      plan,
      prefill_params,
      pool,
      np.full((f, plan.prompt_len), plan.pad_id, np.int32),
      np.ones((f, plan.prompt_len), np.int32),
      np.full((f, plan.prompt_pages), n, np.int32),
      np.zeros((f,), np.uint32),
      np.zeros((f,), np.int32),
      temperature,
      top_p,
    )
  prefix = empty_prefix(plan)
  for rows in slot_program.row_buckets(plan.slots):
    note_program(("decode", plan, rows))
    pool, *_ = slot_program.decode_chunk(
      config,
      plan,
      decode_params,
      pool,
      empty_rows(plan, rows),
      np.full((rows, plan.own_pages), n, np.int32),
      prefix,
      temperature,
      top_p,
      stop_ids,
      jnp.int32(1),
      jnp.int32(0),
    )
  if recompute:
    for width in slot_recompute.capacities(plan.new_tokens, plan.page_size):
      for rows in slot_recompute.row_counts(plan.slots, plan.entries):
        note_program(("recompute", plan, rows, width))
        pool = slot_recompute.recompute_kv(
          config,
          plan,
          prefill_params,
          pool,
          jnp.full((rows, plan.prompt_len), plan.pad_id, jnp.int32),
          jnp.ones((rows, plan.prompt_len), jnp.int32),
          jnp.full((rows, plan.prompt_pages), n, jnp.int32),
          jnp.full((rows, width), plan.pad_id, jnp.int32),
          jnp.zeros((rows,), jnp.int32),
          jnp.full((rows, width // plan.page_size), n, jnp.int32),
        )
  jax.block_until_ready(pool)
