"""The in-flight KV recompute of continuous batching (AReaL's re-prefill):
`recompute_kv` rewrites every live slot row's KV with new weights, for an
in-flight weight update in "recompute" mode (`inflight`). The slot state and
the other slot programs are `slot_program`'s.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rljax import models
from rljax.models import decoder as decoder_lib
from rljax.rollout import kv_pages
from rljax.rollout.slot_program import SlotPlan
from rljax.rollout.slot_program import own_capacity


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def recompute_kv(
  config,
  plan: SlotPlan,
  params,
  state,
  prompt_tokens,
  prompt_mask,
  response,
  table=None,
):
  """`recompute_state`, jitted (the in-flight swap of "recompute")."""
  return recompute_state(
    config, plan, params, state, prompt_tokens, prompt_mask, response, table
  )


def recompute_state(
  config,
  plan: SlotPlan,
  params,
  state,
  prompt_tokens,
  prompt_mask,
  response,
  table=None,
):
  """Every live row's KV recomputed with `params` (AReaL's re-prefill).

  One teacher-forced pass of `forward_with_cache` over each row's whole
  sequence, [its group's prompt (Lp, left-padded) | its own C slots]: the
  prompt's keys and values (taken from the group's first row) replace the
  group's prefix entry, the response's replace the row's own cache. Only
  the tokens the row has fed (t < length - 1) are attended to; its last
  sampled token is fed by the next decode step, as before the update. The
  sampled tokens, their log-probs and the row state (token, position,
  length, keys) are untouched: the old weights sampled them.

  Cost: one prefill of S·(Lp + C) tokens (the prompt part n-fold, once per
  row of a group), attention over (Lp + C)² per row, an [L, S, Lp + C, Hkv,
  hd] scratch cache. Chosen over replaying C decode steps (S·C tokens but C
  sequential steps, each as slow as a sampling step) because one batched
  pass keeps the matmuls large, reuses the tested prefill path, and writes
  what a fresh prefill of prompt + tokens would (a new engine given the
  sequence as its prompt). Rows that are done and groups with no live row
  keep their entries. One compile per (plan, C).

  Args:
    config, plan: static.
    params: the new rollout weights (stacked layers, as `prefill_groups`).
    state: the slot state (donated).
    prompt_tokens, prompt_mask: int32 [G, Lp], each group's prompt as its
      prefill wrote it (anything for a group with no live row).
    response: int32 [S, C] each row's sampled tokens, slot t = token t.
    table: with pages, the block table int32 [S, C/P] (the live rows'
      pages; the recomputed KV goes back into them).

  Returns:
    the state with new "prefix" and "cache".
  """
  n, lp = plan.n, plan.prompt_len
  capacity = own_capacity(plan, state, table)
  live = ~state["done"]
  fed = (
    jnp.arange(capacity, dtype=jnp.int32)[None] < state["length"][:, None] - 1
  )
  mask = jnp.concatenate(
    [
      jnp.repeat(prompt_mask, n, axis=0),
      (fed & live[:, None]).astype(jnp.int32),
    ],
    axis=1,
  )
  tokens = jnp.concatenate([jnp.repeat(prompt_tokens, n, axis=0), response], 1)
  cache = models.init_cache(config, plan.slots, lp + capacity, plan.cache_dtype)
  _, cache = models.forward_with_cache(
    config,
    params,
    tokens,
    decoder_lib.positions_from_mask(mask),
    cache,
    0,
    mask,
    activation_dtype=plan.activation_dtype,
    last_only=True,
  )
  prefix = decoder_lib.to_prefix_cache(
    {name: x[:, ::n, :lp] for name, x in cache.items()}
  )
  own = decoder_lib.to_decode_cache(
    {name: x[:, :, lp:] for name, x in cache.items()}
  )
  group_live = jnp.any(live.reshape(plan.groups, n), axis=1)

  def keep_dead(rows_live):
    def pick(new, old):
      return jnp.where(
        rows_live.reshape((-1,) + (1,) * (old.ndim - 1)),
        new.astype(old.dtype),
        old,
      )

    return pick

  if plan.page_size:
    pools = [
      kv_pages.scatter(pk, pv, k, v, table, live)
      for pk, pv, k, v in zip(
        state["cache"]["k"], state["cache"]["v"], own["k"], own["v"]
      )
    ]
    cache = {"k": tuple(p[0] for p in pools), "v": tuple(p[1] for p in pools)}
  else:
    cache = jax.tree.map(keep_dead(live), own, state["cache"])
  return {
    **state,
    "prefix": jax.tree.map(keep_dead(group_live), prefix, state["prefix"]),
    "cache": cache,
  }
