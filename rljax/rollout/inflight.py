"""In-flight weight updates of the continuous engine.

The lectures' Fix 2 (AReaL) and Fix 3 (PipelineRL): new weights reach the
engine between two decode chunks, without waiting for the rows in flight.

  decode_chunk ──► weight_updates() ──► None: the next chunk, same weights
                         │
                         └─► (params, version): prepared as at every sync
                               (`JaxSampler.update_weights`: cast, quantize)
                               ├─ keep       rows keep their KV, computed by
                               │             the old weights; only later
                               │             tokens see the new ones
                               │             (PipelineRL)
                               └─ recompute  every live row's KV recomputed
                                             with the new weights first
                                             (`slot_recompute.recompute_kv`,
                                             AReaL)

Either way the tokens already sampled and their behaviour log-probs stay
as they are (the old weights sampled them) and each token is stamped with
the version of the weights that sampled it (`RolloutBatch.policy_version`).
`slot_scheduler.run` polls; this module holds the options, the checks and
the host side of a swap.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rljax.rollout import sampler_weights
from rljax.rollout import slot_recompute

INFLIGHT_KV_MODES = ("keep", "recompute")


def check_inflight_kv(value: Any, where: str) -> str:
  """`value` if it is one of `INFLIGHT_KV_MODES`; a ValueError names it."""
  if not isinstance(value, str) or value not in INFLIGHT_KV_MODES:
    raise ValueError(
      f"{where}: inflight_kv={value!r}; expected one of {INFLIGHT_KV_MODES} "
      "(keep: rows keep their stale KV, PipelineRL; recompute: their KV is "
      "recomputed with the new weights, AReaL)"
    )
  return value


def check_version(value: Any, what: str, least: int = 0) -> int:
  """`value` as an int in [least, int32 max]; versions never go back."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{what}={value!r}; expected an int >= {least}")
  if not least <= int(value) <= np.iinfo(np.int32).max:
    raise ValueError(
      f"{what}={value!r}; expected an int32 >= {least} (versions never go "
      "back: the weights of a later update are newer)"
    )
  return int(value)


def swaps_for(
  engine: Any,
  weight_updates: Any,
  version: Any,
  slot_params: Callable[[], tuple[Any, Any]],
) -> "Swaps | None":
  """The `Swaps` of a `JaxSampler.generate` call on `engine` (None without a
  hook); refuses a hook the engine cannot honour. `slot_params`: the
  engine's weights as the slot programs read them."""
  if weight_updates is None:
    return None
  if engine.batching != "continuous":
    raise ValueError(
      "JaxSampler.generate: weight_updates given with "
      f"batching={engine.batching!r}; in-flight weight updates need "
      "batching='continuous' (off a mesh): the static engine decodes a "
      "chunk to its end in one program, with no point between decode "
      "chunks to take new weights"
    )
  if not callable(weight_updates):
    raise TypeError(
      f"JaxSampler.generate: weight_updates={weight_updates!r:.80}; expected "
      "a callable returning None or (params, new_version)"
    )
  version = check_version(version, "JaxSampler.generate: version")
  return Swaps(weight_updates, engine, slot_params, engine.inflight_kv, version)


@dataclasses.dataclass
class Swaps:
  """The in-flight updates of one continuous run.

  Attributes:
    hook: `weight_updates`, polled between decode chunks: None, or
      (full-precision params, new version).
    engine: the `JaxSampler`; an update goes through its `update_weights`
      (the path of every sync: cast, quantize, head copy).
    slot_params: the engine's weights as the slot programs read them.
    mode: "keep" or "recompute" (`INFLIGHT_KV_MODES`).
    version: the version of the weights sampling now.
    rows_in_flight: live rows at each swap.
    recompute_seconds: wall seconds of the KV recomputes (device included).
    prepare_seconds: wall seconds preparing the new weights (cast or
      quantize, then the slot programs' layout, `prepare_params`).
  """

  hook: Callable[[], Any]
  engine: Any
  slot_params: Callable[[], tuple[Any, Any]]
  mode: str
  version: int
  rows_in_flight: list[int] = dataclasses.field(default_factory=list)
  recompute_seconds: float = 0.0
  prepare_seconds: float = 0.0

  def poll(self) -> tuple[Any, Any] | None:
    """Polls the hook; on an update, the new slot params (prepared and
    installed in the engine), else None. The version moves to the
    update's."""
    update = self.hook()
    if update is None:
      return None
    if not isinstance(update, tuple) or len(update) != 2:
      raise TypeError(
        f"weight_updates returned {update!r:.80}; expected None or a "
        "(params, new_version) tuple"
      )
    params, new_version = update
    new_version = check_version(
      new_version, "weight_updates' new_version", self.version
    )
    start = time.perf_counter()
    layout = sampler_weights.weight_layout(self.engine.params)
    self.engine.update_weights(params)
    if sampler_weights.weight_layout(self.engine.params) != layout:
      raise ValueError(
        "JaxSampler.generate: weight_updates returned params whose rollout "
        "weights have other shapes or dtypes than the ones sampling; "
        "expected the same tree (an in-flight update cannot change the "
        "programs and caches the run was made for)"
      )
    slot_params = self.slot_params()
    jax.block_until_ready(slot_params)
    self.prepare_seconds += time.perf_counter() - start
    self.version = new_version
    return slot_params

  def recompute(
    self, config, plan, params, state, prompts, response, note, table=None
  ):
    """`slot_recompute.recompute_kv` on the live rows, timed (`table`: the
    block table of a paged own cache)."""
    start = time.perf_counter()
    note(("recompute", plan, int(response.shape[1])))
    state = slot_recompute.recompute_kv(
      config,
      plan,
      params,
      state,
      jnp.asarray(prompts[0]),
      jnp.asarray(prompts[1]),
      jnp.asarray(response),
      table,
    )
    jax.block_until_ready(state)
    self.recompute_seconds += time.perf_counter() - start
    return state

  def stats(self) -> dict[str, Any]:
    """The run's swap figures (SlotRun stats)."""
    return {
      "weight_swaps": len(self.rows_in_flight),
      "swap_rows_in_flight": list(self.rows_in_flight),
      "recompute_seconds": self.recompute_seconds,
      "swap_prepare_seconds": self.prepare_seconds,
      "final_version": self.version,
    }


def response_matrix(
  tokens: list[list[np.ndarray]],
  owner: np.ndarray,
  live: np.ndarray,
  capacity: int,
  pad_id: int,
) -> np.ndarray:
  """int32 [S, C]: each live slot row's sampled tokens so far (token t at
  column t, cut at C: `recompute_kv` reads only the fed ones, t < length - 1
  <= C), pad_id elsewhere."""
  out = np.full((owner.shape[0], capacity), pad_id, np.int32)
  for row in np.flatnonzero(live):
    ids = np.concatenate(tokens[owner[row]])[:capacity]
    out[row, : ids.size] = ids
  return out
