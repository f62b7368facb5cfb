"""The host side of a streamed slot run's cut and of its continuations
(`prompt_feed`): what a cut hands back, and how a prompt handed back (or
restored from a checkpoint) re-enters the run where its rows stopped.

  cut at a swap point            admit a prompt with `partial`
  ───────────────────            ─────────────────────────────
  every prompt with rows    ──►  its rows keep what they sampled; rows that
  not ended (`handback`):        ended stay ended; the prompt is prefilled
  its rows' tokens,              as any prompt (its entry, the rows' keys),
  log-probs, versions, and       then a started row takes its saved state
  which ended                    (`take_up`: last token, position, length)
                                 instead of the prefill's first token, and
                                 when it joins the decode batch its own KV
                                 is recomputed from its tokens with the
                                 run's weights (`slot_recompute`)

A continued row samples token t with `fold_in(key, t)`, the key its first
prefill gave it, so it goes on exactly as it would have in a run that
recomputed its KV at that point (an in-flight swap under "recompute").
"""

from __future__ import annotations

import numpy as np

from rljax.rollout import prompt_feed


def add_prompt(book, item: prompt_feed.StreamPrompt, limits, priorities):
  """`book.add_prompt` of a streamed prompt; with `partial`, its rows take
  what they sampled (rows that ended leave the queue). Returns the prompt's
  index in the book."""
  p = book.add_prompt(
    item.ids, item.index, item.seed, item.tag, limits, priorities
  )
  part = item.partial
  if part is None:
    return p
  n = book.plan.n
  if len(part.tokens) != n:
    raise ValueError(
      f"streamed prompt {item.tag!r}: {len(part.tokens)} partial rows; "
      f"expected n={n}"
    )
  if part.ended.all():
    raise ValueError(
      f"streamed prompt {item.tag!r}: every partial row ended; a finished "
      "prompt is not handed back"
    )
  for j in range(n):
    row = book.rows[p * n + j]
    if len(part.tokens[j]):
      row.tokens = [np.asarray(part.tokens[j], np.int32)]
      row.logps = [np.asarray(part.logp[j], np.float32)]
      row.versions = [np.asarray(part.versions[j], np.int32)]
    if part.ended[j]:
      row.ended = True
      book.prompts[p].rows_left -= 1
  book.drop_ended_from_queue()
  return p


def take_up(book, r: int) -> bool:
  """After its prompt's prefill: row r, if it brings tokens from an
  earlier run, takes up where they stopped (the last token is fed next, at
  position prompt + L - 1; the key stays the prefill's). True for such a
  row (its own KV is still to be written: `fed`)."""
  row = book.rows[r]
  if not row.tokens:
    return False
  size = sum(t.size for t in row.tokens)
  row.tok = int(row.tokens[-1][-1])
  row.length = size
  row.pos = len(book.prompts[row.prompt].ids) + size - 1
  return True


def fed(book, r: int) -> int:
  """Tokens of row r whose KV the decode steps read (all but the last)."""
  return max(0, book.rows[r].length - 1)


def handback(book) -> list[prompt_feed.StreamPrompt]:
  """Every prompt of the run with rows not ended, in admission order, as
  a cut hands it back: ids, index, seed, tag, and its rows so far
  (`partial`; None when no row had started)."""
  n, out = book.plan.n, []
  for p, prompt in enumerate(book.prompts):
    if not prompt.rows_left:
      continue
    rows = book.rows[p * n : (p + 1) * n]
    part = prompt_feed.PartialRows(
      tokens=[_cat(row.tokens, np.int32) for row in rows],
      logp=[_cat(row.logps, np.float32) for row in rows],
      versions=[_cat(row.versions, np.int32) for row in rows],
      ended=np.array([row.ended for row in rows], bool),
    )
    out.append(
      prompt_feed.StreamPrompt(
        list(prompt.ids),
        int(prompt.index),
        int(prompt.seed),
        prompt.tag,
        part if part.started.any() else None,
      )
    )
  return out


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
  if not parts:
    return np.zeros((0,), dtype)
  return np.concatenate(parts).astype(dtype)
