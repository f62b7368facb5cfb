"""The host side of a streamed slot run's cut and of its continuations
(`prompt_feed`): what a cut hands back, and how a prompt handed back (or
restored from a checkpoint) re-enters the slots where its rows stopped.

  cut at a swap point            admit a prompt with `partial`
  ───────────────────            ─────────────────────────────
  every unfinished prompt   ──►  its rows' tokens kept as they were; a unit
  (`handback_prompts`): its      (block of `width` rows) whose rows all
  rows' tokens, log-probs,       ended needs no slot, one whose rows started
  versions, which ended          is a continuation: prefilled as any unit
                                 (prefix entry, row keys), then its rows
                                 take their saved state and every live
                                 row's KV is recomputed from its tokens with
                                 the run's weights (`continue_rows`)

A continuation samples token t of a row with `fold_in(key, t)`, the key
its first prefill gave it, so it goes on exactly as the row would have in
a run that recomputed its KV at that point.
"""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
import numpy as np

from rljax.rollout import prompt_feed
from rljax.rollout import slot_recompute


def admit_rows(
  item: prompt_feed.StreamPrompt,
  n: int,
  width: int,
  rows: tuple[list, list, list, list],
) -> tuple[int, list[int]]:
  """Appends a prompt's n output rows to `rows` (tokens, logps, versions,
  ended lists; a handed-back prompt's rows with what they sampled) and
  returns (its rows still to end, the sample blocks that need a slot)."""
  tokens, logps, versions, ended = rows
  part = item.partial
  if part is None:
    for _ in range(n):
      tokens.append([])
      logps.append([])
      versions.append([])
      ended.append(False)
    return n, list(range(n // width))
  if len(part.tokens) != n:
    raise ValueError(
      f"streamed prompt {item.tag!r}: {len(part.tokens)} partial rows; "
      f"expected n={n}"
    )
  started = part.started
  for j in range(n):
    if started[j]:
      tokens.append([np.asarray(part.tokens[j], np.int32)])
      logps.append([np.asarray(part.logp[j], np.float32)])
      versions.append([np.asarray(part.versions[j], np.int32)])
    else:
      tokens.append([])
      logps.append([])
      versions.append([])
    ended.append(bool(part.ended[j]))
  units = []
  for k in range(n // width):
    block = slice(k * width, (k + 1) * width)
    if len(set(started[block].tolist())) != 1:
      raise ValueError(
        f"streamed prompt {item.tag!r}: sample block {k} is partly started;"
        " expected the rows of a block to start together"
      )
    if not part.ended[block].all():
      units.append(k)
  return n - int(np.sum(part.ended)), units


def handback_prompts(
  rows_left: list[int],
  meta: tuple[list, list, list, list],
  n: int,
  rows: tuple[list, list, list, list],
) -> list[prompt_feed.StreamPrompt]:
  """Every prompt of the run with rows left (`rows_left`), in admission
  order, as a cut hands them back: its ids, index, seed and tag (`meta`:
  the run's lists of each) with its rows so far (`partial`; None when no
  row had started)."""
  prompts, prompt_index, seeds, tags = meta
  tokens, logps, versions, ended = rows
  out = []
  for p in [p for p, left in enumerate(rows_left) if left]:
    rs = range(p * n, (p + 1) * n)
    cat = lambda parts, dtype: (
      np.concatenate(parts).astype(dtype) if parts else np.zeros((0,), dtype)
    )
    part = prompt_feed.PartialRows(
      tokens=[cat(tokens[r], np.int32) for r in rs],
      logp=[cat(logps[r], np.float32) for r in rs],
      versions=[cat(versions[r], np.int32) for r in rs],
      ended=np.array([ended[r] for r in rs], bool),
    )
    out.append(
      prompt_feed.StreamPrompt(
        list(prompts[p]),
        int(prompt_index[p]),
        int(seeds[p]),
        tags[p],
        part if part.started.any() else None,
      )
    )
  return out


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def continue_rows(
  config,
  plan,
  params,
  state,
  rows,
  last_token,
  length,
  done,
  prompt_tokens,
  prompt_mask,
  response,
  table=None,
):
  """Rows `rows` (bool [S], just prefilled) take up responses begun in an
  earlier run: length L (tokens sampled), their last token (fed by the
  next decode step, at position prompt + L - 1), done; then every live
  row's KV is recomputed with `params` (`slot_recompute.recompute_kv`),
  which writes the continued rows' own cache from `response`.

  Args:
    config, plan: static.
    params: the run's rollout weights (stacked layers).
    state: the slot state after the prefill (donated).
    rows: bool [S]; last_token, length: int32 [S]; done: bool [S].
    prompt_tokens, prompt_mask, response, table: as `recompute_kv`.
  """
  state = {
    **state,
    "tok": jnp.where(rows, last_token, state["tok"]),
    "pos": jnp.where(rows, state["pos"] + length - 1, state["pos"]),
    "length": jnp.where(rows, length, state["length"]),
    "done": jnp.where(rows, done, state["done"]),
  }
  return slot_recompute.recompute_state(
    config, plan, params, state, prompt_tokens, prompt_mask, response, table
  )


def continuation_arrays(
  continued: list[tuple[int, int]],
  slots: int,
  tokens: list,
  ended: list,
) -> tuple:
  """(rows, last_token, length, done) of `continue_rows` for the
  (slot row, output row) pairs `continued`, as device arrays."""
  rows = np.zeros((slots,), bool)
  last = np.zeros((slots,), np.int32)
  length = np.zeros((slots,), np.int32)
  done = np.zeros((slots,), bool)
  for row, out in continued:
    ids = np.concatenate(tokens[out])
    rows[row], last[row], length[row] = True, ids[-1], ids.size
    done[row] = ended[out]
  return tuple(jnp.asarray(x) for x in (rows, last, length, done))
