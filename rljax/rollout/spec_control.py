"""The host side of speculative decoding in the continuous engine: per
decode chunk, the drafts of the live rows, the verify width T, and the
run's speculation figures.

  slot_scheduler.run ── a chunk of the live rows in row bucket B ──►
  Speculator.decode_chunk:
    0. a bucket no verify program holds (B·2 > budget·S: every slot, or
       nearly, live) decodes plainly with no drafts made;
    1. each live row's group index (`spec_drafts.GroupIndex`) catches up
       with what its rows sampled; its draft: the longest suffix match
       over the row's own text, its siblings' and earlier responses to
       the prompt (`spec_store`);
    2. T: the width with the most expected tokens per unit of step cost,
         E(T) = Σ_b Σ_{j=0}^{min(T-1, |draft_b|)} α_b^j
         cost(T) = 1 + β · B · T
       over T = 1 (plain decoding) and the verify widths of B
       (`spec_verify.verify_shapes`: B·T <= S). α_b is row b's acceptance
       so far, shrunk toward its draft source's acceptance in this run
       (a Beta mean); β the cost of one more token in a step relative to
       the step's fixed part (the weights' stream; docs/performance.md's
       decode profile: ~0.02 at bf16, ~0.05 at INT8 on the CPU). Rows
       whose drafts miss pull α down and T with it: at α ≈ 0 the chunk
       decodes plainly, so speculation turns itself down where it does
       not pay;
    3. the verify chunk (`spec_verify.verify_chunk`) or the plain one
       (`slot_program.decode_chunk`).

An in-flight weight update (`on_swap`) forgets the rows' and sources'
acceptance (it was the old policy's); the drafts themselves stay: they
are guesses, checked against the new policy's samples.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rljax.rollout import slot_plan
from rljax.rollout import slot_program
from rljax.rollout import spec_drafts
from rljax.rollout import spec_store
from rljax.rollout import spec_verify

MODES = ("off", "suffix")


@dataclasses.dataclass(frozen=True)
class SpecConfig:
  """Speculative decoding's settings (`--rollout.speculative` sets mode).

  Attributes:
    mode: "off" or "suffix" (drafts from suffix matches, `spec_drafts`).
    drafts: the matcher's n-gram lengths and longest draft.
    step_token_cost: β, one more token's cost in a step relative to the
      step's fixed part.
    prior_acceptance, prior_weight: the Beta prior of a source's
      acceptance (mean, pseudo-drafts) before the run has drafted from it.
    history: `PromptStore` bounds: prompts kept, responses per prompt.
    budget: a verify step's most tokens in units of the slot count S
      (`spec_verify.verify_shapes`); 1: never more than a full plain step.
  """

  mode: str = "suffix"
  drafts: spec_drafts.DraftSettings = spec_drafts.DraftSettings()
  step_token_cost: float = 0.03
  prior_acceptance: float = 0.5
  prior_weight: float = 8.0
  history_prompts: int = 4096
  history_per_prompt: int = 8
  budget: int = 1

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(
        f"SpecConfig: mode={self.mode!r}; expected one of {MODES}"
      )
    if not self.step_token_cost >= 0:
      raise ValueError(
        f"SpecConfig: step_token_cost={self.step_token_cost!r}; expected >= 0"
      )
    if isinstance(self.budget, bool) or self.budget not in (1, 2, 4):
      raise ValueError(
        f"SpecConfig: budget={self.budget!r}; expected 1, 2 or 4"
      )
    if not 0 <= self.prior_acceptance < 1 or not self.prior_weight > 0:
      raise ValueError(
        f"SpecConfig: prior_acceptance={self.prior_acceptance!r}, "
        f"prior_weight={self.prior_weight!r}; expected [0, 1) and > 0"
      )


def check_mode(value: Any, where: str) -> SpecConfig | None:
  """A `speculative=` argument as a SpecConfig (None: off)."""
  if value is None or isinstance(value, SpecConfig):
    return None if value is None or value.mode == "off" else value
  if value not in MODES:
    raise ValueError(
      f"{where}: speculative={value!r}; expected one of {MODES} or a SpecConfig"
    )
  return None if value == "off" else SpecConfig(mode=value)


def expected_tokens(alpha: np.ndarray, length: np.ndarray, width: int):
  """Σ_b Σ_{j=0}^{min(width-1, length_b)} α_b^j: tokens a verify step of
  `width` positions emits in expectation when each draft token is right
  with probability α_b given those before it were."""
  k = np.minimum(width - 1, length)
  alpha = np.clip(alpha, 0.0, 0.999)
  return float(np.sum((1 - alpha ** (k + 1)) / (1 - alpha)))


def figures(counts: dict[str, float]) -> dict[str, Any]:
  """The speculation figures (`spec_*`) of raw counts (`Speculator.raw`,
  summed over runs): acceptance (drafts emitted / drafts fed), tokens a
  live row emits per verify step, verify and plain decode steps, each
  source's share of the drafts and its acceptance, host µs per row."""
  c = collections.Counter(counts)
  drafted = c["drafted"]
  out = {
    "spec_verify_steps": float(c["verify_steps"]),
    "spec_plain_steps": float(c["plain_steps"]),
    "spec_drafted": float(drafted),
    "spec_accepted": float(c["accepted"]),
    "spec_acceptance": c["accepted"] / drafted if drafted else 0.0,
    "spec_tokens_per_row_step": (
      c["verify_tokens"] / c["verify_row_steps"]
      if c["verify_row_steps"]
      else 0.0
    ),
    "spec_draft_us_per_row": (
      1e6 * c["draft_seconds"] / c["draft_rows"] if c["draft_rows"] else 0.0
    ),
    # Row-chunks in buckets no verify program holds: not drafted at all.
    "spec_undrafted_rows": float(c["undrafted_rows"]),
  }
  for s in spec_drafts.SOURCES:
    n = c["drafted_" + s]
    out[f"spec_share_{s}"] = n / drafted if drafted else 0.0
    out[f"spec_acceptance_{s}"] = c["accepted_" + s] / n if n else 0.0
  return out


def _bucket(match: int) -> int:
  """Match lengths pooled for the acceptance estimate (longer is likelier
  right; past 8 tokens it barely changes)."""
  return min(int(match), 8)


class Speculator:
  """Speculation over one continuous run (module doc)."""

  def __init__(
    self,
    config: SpecConfig,
    store: spec_store.PromptStore | None = None,
  ):
    self.config = config
    self.plan: slot_program.SlotPlan | None = None  # the run's (its book's)
    self.store = store
    self.groups: dict[int, spec_drafts.GroupIndex] = {}
    # [accepted, refused] draft tokens since the last swap: per row, and
    # per (source, match length) over the run's rows (the row's prior).
    self.rows = collections.defaultdict(lambda: [0.0, 0.0])
    self.kinds = collections.defaultdict(lambda: [0.0, 0.0])
    self.counts = collections.Counter()
    self.widths = collections.Counter()

  # -- the run's events -------------------------------------------------------

  def on_swap(self) -> None:
    """New weights: acceptance so far was the old policy's."""
    self.rows.clear()
    self.kinds.clear()

  def prompt_done(self, p: int, prompt: list[int], responses) -> None:
    """Prompt p's rows all ended: its responses go to the store."""
    self.groups.pop(p, None)
    if self.store is not None:
      self.store.add(prompt, responses)

  # -- a chunk ----------------------------------------------------------------

  def _group(self, book, p: int) -> spec_drafts.GroupIndex:
    if p not in self.groups:
      ids = book.prompts[p].ids
      history = self.store.get(ids) if self.store is not None else []
      self.groups[p] = spec_drafts.GroupIndex(
        ids, book.plan.n, self.config.drafts, history
      )
    return self.groups[p]

  def _alpha(self, r: int, kind: tuple[str, int]) -> float:
    """α: P(a draft token is right | those before it were), a Beta mean:
    the row's record shrunk toward its kind's (source, match length),
    which is shrunk toward `prior_acceptance`."""
    w, a0 = self.config.prior_weight, self.config.prior_acceptance
    accepted, refused = self.kinds[kind]
    prior = (accepted + w * a0) / (accepted + refused + w)
    accepted, refused = self.rows[r]
    return (accepted + w * prior) / (accepted + refused + w)

  def drafts(self, book, active: list[int]):
    """(drafts int32 [R, D], lengths [R], kinds, α [R]) of the rows."""
    n, d = book.plan.n, self.config.drafts.max_len
    out = np.full((len(active), d), book.plan.pad_id, np.int32)
    lengths = np.zeros((len(active),), np.int32)
    alpha = np.zeros((len(active),), np.float64)
    kinds: list[tuple[str, int] | None] = []
    synced = set()
    for i, r in enumerate(active):
      p = book.rows[r].prompt
      group = self._group(book, p)
      if p not in synced:
        synced.add(p)
        for j in range(n):
          row = book.rows[p * n + j]
          if row.length > group.row_length(j) and row.tokens:
            group.sync(j, np.concatenate(row.tokens).tolist())
      draft = group.propose(r - p * n)
      if draft is None or not draft.tokens.size:
        kinds.append(None)
        continue
      out[i, : draft.tokens.size] = draft.tokens
      lengths[i] = draft.tokens.size
      kinds.append((draft.source, _bucket(draft.match)))
      alpha[i] = self._alpha(r, kinds[-1])
    return out, lengths, kinds, alpha

  def can_verify(self, size: int) -> bool:
    """Whether some verify program runs row bucket `size`
    (`spec_verify.verify_shapes`: B·T <= budget·S with T >= 2)."""
    shapes = spec_verify.verify_shapes(self.plan.slots, self.config.budget)
    return any(b == size for b, _ in shapes)

  def choose_width(self, size: int, lengths, alpha) -> int:
    """T maximising expected tokens per cost (module doc); 1: plain."""
    beta = self.config.step_token_cost
    best, best_rate = 1, (len(lengths)) / (1 + beta * size)
    shapes = spec_verify.verify_shapes(self.plan.slots, self.config.budget)
    for b, t in shapes:
      if b != size:
        continue
      rate = expected_tokens(alpha, lengths, t) / (1 + beta * b * t)
      if rate > best_rate * 1.0001:
        best, best_rate = t, rate
    return best

  def decode_chunk(
    self,
    config: Any,
    params: Any,
    pool: Any,
    book: Any,
    size: int,
    sampling_args: tuple[Any, Any, Any],
    exit_live: int,
    note_program: Callable[[Any], None],
  ):
    """The chunk `slot_program.decode_chunk` would run, verify or plain;
    returns its (pool, state, tokens, log-probs, steps, live row-steps)."""
    plan = self.plan = book.plan
    temperature, top_p, stop_ids = sampling_args
    began = time.perf_counter()
    active = list(book.active)
    width = 1
    if self.can_verify(size):
      drafts, lengths, kinds, alpha = self.drafts(book, active)
      if np.any(lengths > 0):
        width = self.choose_width(size, lengths, alpha)
      self.counts["draft_seconds"] += time.perf_counter() - began
      self.counts["draft_rows"] += len(active)
    else:
      # No verify program holds this bucket (B·2 > budget·S): a draft could
      # only be thrown away, so none is made. The rows' group indexes catch
      # up on their next draft (`GroupIndex.sync` takes the whole text).
      self.counts["undrafted_rows"] += len(active)
    if width == 1:
      book.reserve(plan.chunk_steps)
      rows, table = book.bucket_inputs(size)
      note_program(("decode", plan, size))
      pool, *out = slot_program.decode_chunk(
        config, plan, params, pool, rows, table, book.prefix(),
        temperature, top_p, stop_ids, jnp.int32(plan.chunk_steps),
        jnp.int32(exit_live),
      )  # fmt: skip
      state, out_tok, out_logp, steps, live = jax.device_get(out)
      self.counts["plain_steps"] += int(steps)
      self.widths[1] += int(steps)
      return pool, state, out_tok, out_logp, steps, live
    # Verify: each row's draft buffer, padded to the bucket.
    book.reserve(plan.chunk_steps * width)
    rows, table = book.bucket_inputs(size)
    buf = np.full((size, drafts.shape[1]), plan.pad_id, np.int32)
    buf[: len(active)] = drafts
    length = np.zeros((size,), np.int32)
    length[: len(active)] = lengths
    on_track = int(np.sum(lengths > 0))
    note_program(("verify", plan, size, width))
    pool, state, out_tok, out_logp, steps, live, spec = (
      spec_verify.verify_chunk(
        config, plan, width, params, pool, rows, table, book.prefix(),
        buf, length, np.full((size,), width - 1, np.int32), temperature,
        top_p, stop_ids, jnp.int32(plan.chunk_steps), jnp.int32(exit_live),
        jnp.int32(on_track // 2),
      )
    )  # fmt: skip
    state, out_tok, out_logp, steps, live, spec = jax.device_get(
      (state, out_tok, out_logp, steps, live, spec)
    )
    grew = state["length"][: len(active)] - rows["length"][: len(active)]
    for i, r in enumerate(active):
      accepted, refused = int(spec["accepted"][i]), int(spec["rejected"][i])
      self.rows[r][0] += accepted
      self.rows[r][1] += refused
      if kinds[i] is not None:
        self.kinds[kinds[i]][0] += accepted
        self.kinds[kinds[i]][1] += refused
        self.counts["drafted_" + kinds[i][0]] += int(spec["drafted"][i])
        self.counts["accepted_" + kinds[i][0]] += accepted
    self.counts["verify_steps"] += int(steps)
    self.counts["verify_row_steps"] += int(live)
    self.counts["verify_tokens"] += int(np.sum(grew))
    self.counts["drafted"] += int(np.sum(spec["drafted"]))
    self.counts["accepted"] += int(np.sum(spec["accepted"]))
    self.widths[width] += int(steps)
    return pool, state, out_tok, out_logp, steps, live

  # -- figures ----------------------------------------------------------------

  def raw(self) -> dict[str, float]:
    """The run's raw counts (summable over runs; `figures`)."""
    return dict(self.counts)

  def stats(self) -> dict[str, Any]:
    """The run's speculation figures (`figures`) and steps by width."""
    out = figures(self.counts)
    out["spec_widths"] = dict(sorted(self.widths.items()))
    out["spec_counts"] = self.raw()
    return out


def warm(
  config: Any,
  params: Any,
  plan: slot_program.SlotPlan,
  sampling: Any,
  spec: SpecConfig,
  *,
  note_program: Callable[[Any], None] = lambda sig: None,
) -> None:
  """Compiles the verify programs a run of `plan` may call (every
  `verify_shapes` entry, on padding rows: nothing is written)."""
  temperature, top_p, stop_ids = slot_plan.traced_args(sampling)
  pool = slot_program.init_pool(config, plan)
  prefix = slot_plan.empty_prefix(plan)
  d = spec.drafts.max_len
  for rows, width in spec_verify.verify_shapes(plan.slots, spec.budget):
    note_program(("verify", plan, rows, width))
    pool, *_ = spec_verify.verify_chunk(
      config, plan, width, params, pool, slot_plan.empty_rows(plan, rows),
      np.full((rows, plan.own_pages), plan.pool_pages, np.int32), prefix,
      np.full((rows, d), plan.pad_id, np.int32), np.zeros((rows,), np.int32),
      np.zeros((rows,), np.int32), temperature, top_p, stop_ids,
      jnp.int32(1), jnp.int32(0), jnp.int32(0),
    )  # fmt: skip
  jax.block_until_ready(pool)
