"""How a request becomes program inputs: prompt buckets, chunks, shapes.

Host-side planning of the JAX sampler, numpy only (no device work):

  prompts ──► check_prompt_lengths, bucket_for (padded prompt length)
     ├─ static:     chunk_indices (whole prompt groups of <= max_batch rows)
     │                └─ static_chunk: left-padded tokens and mask, per-row
     │                   prompt/sample ids and caps, the `_Plan` (compile key)
     └─ continuous: slot_groups (G groups of `width` rows)

Prompt counts round up to powers of two, and prompt lengths up to buckets,
so that the tail chunk, small evaluation batches and the next step's
request reuse the programs already compiled.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from rljax.rollout.base import SamplingConfig
from rljax.rollout.static_program import _Plan
from rljax.rollout.static_program import decode_segments
from rljax.rollout.static_program import new_token_capacity


def default_prompt_buckets(max_prompt_len: int) -> tuple[int, ...]:
  """16, 32, 64, then multiples of 64, up to (and covering) max_prompt_len."""
  buckets = [b for b in (16, 32, 64) if b < max_prompt_len]
  size = 64
  while size < max_prompt_len:
    size += 64
    buckets.append(size)
  buckets.append(max_prompt_len)
  return tuple(sorted(set(b for b in buckets if b <= max_prompt_len)))


def check_prompt_buckets(
  prompt_buckets: Sequence[int] | None, max_prompt_len: Any
) -> tuple[int, ...]:
  """The buckets (default `default_prompt_buckets`), checked to cover
  `max_prompt_len`."""
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
  return prompt_buckets


def next_power_of_two(x: int) -> int:
  return 1 << max(0, (x - 1).bit_length())


def bucket_for(buckets: Sequence[int], length: int) -> int:
  """The smallest bucket >= length."""
  for b in buckets:
    if b >= length:
      return b
  raise ValueError(
    f"prompt of {length} tokens exceeds the largest bucket {buckets[-1]}"
  )


def check_prompt_lengths(
  prompts: list[list[int]], max_prompt_len: int, where: str
) -> None:
  too_long = [i for i, p in enumerate(prompts) if len(p) > max_prompt_len]
  if too_long:
    i = too_long[0]
    raise ValueError(
      f"JaxSampler.{where}: prompt_ids[{i}] has {len(prompts[i])} tokens;"
      f" expected <= max_prompt_len={max_prompt_len}"
    )


def chunk_indices(num_prompts: int, n: int, max_batch: int) -> list[list[int]]:
  """Prompt indices of each static chunk: whole groups of n samples, at
  most max_batch rows (at least one prompt)."""
  per_chunk = max(1, max_batch // n)
  return [
    list(range(s, min(s + per_chunk, num_prompts)))
    for s in range(0, num_prompts, per_chunk)
  ]


def check_row_limits(limits, rows: int, most: int) -> np.ndarray | None:
  """`max_new_tokens_per_sample` as int64, or None; checked against the
  request's row count and max_new_tokens."""
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


@dataclasses.dataclass(frozen=True)
class StaticChunk:
  """One static program call's host inputs (P padded prompts, n rows each).

  tokens, mask: [P, Lp] int32, left-padded (the last prompt token of every
    row in column Lp - 1); row_prompt, row_sample: [P·n] int32, the ids the
    per-row PRNG keys fold in; stop_ids: at least one id (-1: none);
    limit: the loop's step bound; limits: [P·n] int32 per-row caps.
  """

  plan: _Plan
  tokens: np.ndarray
  mask: np.ndarray
  row_prompt: np.ndarray
  row_sample: np.ndarray
  stop_ids: tuple[int, ...]
  limit: int
  limits: np.ndarray


def static_chunk(
  prompts: list[list[int]],
  prompt_index: list[int],
  sampling: SamplingConfig,
  *,
  prompt_len: int,
  max_batch: int,
  pad_id: int,
  cache_dtype: Any,
  activation_dtype: Any,
  mesh: Any,
  fuse_projections: bool,
  max_steps: int | None = None,
  row_limits: np.ndarray | None = None,
) -> StaticChunk:
  """The inputs of one static chunk of `prompts` (indices `prompt_index` of
  the request), bucketed to `prompt_len`."""
  n = sampling.n
  # Pad the prompt count to a power of two (capped at the chunk size) so the
  # tail chunk and small evaluation batches reuse compiles.
  cap = max(1, max_batch // n)
  num_prompts = min(next_power_of_two(len(prompts)), max(cap, len(prompts)))
  tokens = np.full((num_prompts, prompt_len), pad_id, np.int32)
  mask = np.zeros((num_prompts, prompt_len), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, prompt_len - len(p) :] = p
    mask[i, prompt_len - len(p) :] = 1
  index = np.zeros((num_prompts,), np.int32)
  index[: len(prompts)] = prompt_index
  greedy = sampling.is_greedy
  stop_ids = tuple(sampling.stop_token_ids) or (-1,)
  plan = _Plan(
    num_prompts=num_prompts,
    prompt_len=prompt_len,
    n=n,
    new_token_capacity=new_token_capacity(sampling.max_new_tokens),
    greedy=greedy,
    top_k=0 if greedy else int(sampling.top_k),
    use_top_p=not greedy and sampling.top_p < 1.0,
    num_stop_ids=len(stop_ids),
    pad_id=pad_id,
    cache_dtype=cache_dtype,
    activation_dtype=activation_dtype,
    mesh=mesh,
    fuse_projections=fuse_projections,
  )
  limit = sampling.max_new_tokens
  if max_steps is not None:
    limit = min(max_steps, limit)
  limits = np.full((num_prompts * n,), limit, np.int32)
  if row_limits is not None:
    limits[: len(prompts) * n] = np.minimum(row_limits, limit)
  return StaticChunk(
    plan=plan,
    tokens=tokens,
    mask=mask,
    row_prompt=np.repeat(index, n),
    row_sample=np.tile(np.arange(n, dtype=np.int32), num_prompts),
    stop_ids=stop_ids,
    limit=limit,
    limits=limits,
  )


def static_kv_bytes(config, plan: _Plan, steps: int) -> int:
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


def slot_groups(
  num_prompts: int, n: int, group_width: int | None, most_rows: int
) -> tuple[int, int]:
  """(width, G): the continuous engine's rows per slot group and group
  count for a request, G a power of two of its group count (as the static
  engine's prompt count) capped at most_rows // width (at least one)."""
  width = group_width or n
  if n % width:
    raise ValueError(
      f"JaxSampler: group_width={width} does not divide "
      f"SamplingConfig.n={n}; expected a divisor of every request's n"
    )
  most_groups = max(1, most_rows // width)
  units = num_prompts * (n // width)
  return width, min(next_power_of_two(units), most_groups)
