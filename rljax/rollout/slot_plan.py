"""What a continuous run compiles, fixed before it starts: a request's
`SlotPlan` (`make_plan`), the prefill sizes and own-cache capacities it may
use, the traced sampling scalars, the weights as the slot programs read them
(`prepare_params`), and `warm`, which compiles every one of those programs
ahead of a run on throwaway prompts.

The run itself, the host loop that calls these programs, is
`slot_scheduler.run`; the programs are `slot_program`'s.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rljax.models import decoder as decoder_lib
from rljax.models import fusion as fusion_lib
from rljax.rollout import kv_pages
from rljax.rollout import slot_program
from rljax.rollout import slot_recompute
from rljax.rollout.base import SamplingConfig
from rljax.rollout.static_program import new_token_capacity
from rljax.rollout.token_sampling import sample_keys


@functools.partial(jax.jit, static_argnums=(1,))
def prepare_params(params, fuse: bool):
  """(prefill params, decode params): the decode program reads each layer's
  weights as a buffer of its own (`decoder.unstack_layers`), made once per
  rollout rather than once per chunk of steps."""
  if fuse:
    params = fusion_lib.fuse_projections(params)
  decode = {**params, "layers": decoder_lib.unstack_layers(params["layers"])}
  return params, decode


def prefill_sizes(groups: int) -> tuple[int, ...]:
  """Prompt counts a prefill program is compiled for: G/4, G/2, G (rounded
  up); a refill of fewer prompts pads to the next one."""
  return tuple(sorted({-(-groups // 4), -(-groups // 2), groups}))


def make_plan(
  sampling: SamplingConfig,
  groups: int,
  prompt_len: int,
  chunk_steps: int,
  pad_id: int,
  cache_dtype: Any,
  activation_dtype: Any,
  width: int,
  page_size: int = 0,
) -> slot_program.SlotPlan:
  """The static plan of a request's slot programs (`width` rows a group)."""
  greedy = sampling.is_greedy
  return slot_program.SlotPlan(
    groups=groups,
    n=width,
    prompt_len=prompt_len,
    rope_len=prompt_len + new_token_capacity(sampling.max_new_tokens),
    chunk_steps=chunk_steps,
    greedy=greedy,
    top_k=0 if greedy else int(sampling.top_k),
    use_top_p=not greedy and sampling.top_p < 1.0,
    num_stop_ids=len(sampling.stop_token_ids or (-1,)),
    pad_id=pad_id,
    cache_dtype=cache_dtype,
    activation_dtype=activation_dtype,
    page_size=page_size,
  )


def traced_args(sampling: SamplingConfig, max_new: int) -> tuple[Any, ...]:
  """The traced sampling scalars: temperature, top-p, stop ids, limit."""
  return (
    jnp.float32(1.0 if sampling.is_greedy else sampling.temperature),
    jnp.float32(sampling.top_p),
    jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32),
    jnp.int32(max_new),
  )


def capacities(most: int) -> tuple[int, ...]:
  """Every own-cache capacity `cache_capacity` can pick up to `most`."""
  sizes, size = [], 64
  while size < most:
    sizes.append(size)
    size *= 2
  sizes.append(most)
  return tuple(sorted(set(slot_program.cache_capacity(s, most) for s in sizes)))


def warm(
  config: Any,
  params: tuple[Any, Any],
  sampling: SamplingConfig,
  *,
  groups: int,
  prompt_len: int,
  chunk_steps: int,
  pad_id: int,
  cache_dtype: Any,
  activation_dtype: Any,
  note_program: Callable[[Any], None] = lambda sig: None,
  group_width: int | None = None,
  recompute: bool = False,
  page_size: int = 0,
) -> None:
  """Compiles the programs `run` may call for this request's shapes: a
  prefill of each size (`prefill_sizes`), a decode chunk at each own-cache
  capacity and the growing resizes between them (one step each, on
  throwaway prompts); with `recompute`, `recompute_kv` at each capacity.

  With pages (`page_size`), the decode chunks are compiled on the smallest
  pool only: the pool sizes a run reaches depend on its rows' lengths, so a
  larger pool's programs compile when a run first grows to it (at most
  `kv_pages.pool_unit`'s 16 steps × the capacities)."""
  prefill_params, decode_params = params
  plan = make_plan(
    sampling,
    groups,
    prompt_len,
    chunk_steps,
    pad_id,
    cache_dtype,
    activation_dtype,
    group_width or sampling.n,
    page_size,
  )
  traced = traced_args(sampling, sampling.max_new_tokens)
  most = new_token_capacity(sampling.max_new_tokens)
  sizes = capacities(most)
  pages = kv_pages.pool_unit(plan.slots, most, page_size) if page_size else 0
  note_program(("init", plan, pages or sizes[0]))
  state = slot_program.init_state(config, plan, pages or sizes[0])
  for f in prefill_sizes(groups):
    note_program(("prefill", plan, f))
    keys = sample_keys(
      0,
      jnp.zeros((f * plan.n,), jnp.int32),
      jnp.zeros((f * plan.n,), jnp.int32),
    )
    state, *_ = slot_program.prefill_groups(
      config,
      plan,
      prefill_params,
      state,
      jnp.full((f, prompt_len), pad_id, jnp.int32),
      jnp.ones((f, prompt_len), jnp.int32),
      jnp.arange(f, dtype=jnp.int32),
      jax.random.key_data(keys),
      jnp.full((f * plan.n,), 2, jnp.int32),
      *traced,
    )
  for i, capacity in enumerate(sizes):
    table = None
    if page_size:
      # A table of unheld pages: the compile needs its shape only.
      capacity = kv_pages.pages_for(capacity, page_size) * page_size
      table = jnp.full((plan.slots, capacity // page_size), pages, jnp.int32)
    elif i:
      note_program(("resize", plan, sizes[i - 1], capacity))
      state = slot_program.resize_cache(capacity, state)
    if recompute:
      note_program(("recompute", plan, capacity))
      state = slot_recompute.recompute_kv(
        config,
        plan,
        prefill_params,
        state,
        jnp.full((groups, prompt_len), pad_id, jnp.int32),
        jnp.ones((groups, prompt_len), jnp.int32),
        jnp.full((plan.slots, capacity), pad_id, jnp.int32),
        table,
      )
    note_program(("decode", plan, capacity, pages))
    out = slot_program.decode_chunk(
      config,
      plan,
      decode_params,
      state,
      *traced,
      jnp.int32(1),
      jnp.int32(groups + 1),
      table,
    )
    state = out[0]
  jax.block_until_ready(state)
