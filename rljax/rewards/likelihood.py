"""Verifiable Rewards via Completion Likelihood Improvement (VR-CLI).

Gurung & Lapata 2025, "Learning to Reason for Long-Form Story Generation"
(COLM 2025): the policy writes a reasoning trace a for a prompt x; a frozen
reference model π_G judges a by how much it helps predict the gold
continuation y (a book's next chapter, or a task's known answer):

    I(x, a, y) = [1 − PPL_πG(y | x, a) / PPL_πG(y | x)] × 100,

    PPL(y | c) = exp(−(1/|y|) Σ_t log π_G(y_t | c, y_<t)).

I > 0 when the reasoning makes y more likely, 0 when it does not change it;
it is at most 100 and has no lower bound. The ratio of perplexities is
exp(NLL(y | x, a) − NLL(y | x)) with NLL the mean per-token negative
log-likelihood, which is how it is computed here (no overflow of exp(NLL)).

`likelihood_improvement` is the kernel on per-token log-probs;
`LikelihoodImprovementReward` builds both contexts of every item into one
[2B, T] batch and runs the reference model once (`models.token_logprobs`).
"""

from __future__ import annotations

import functools
import time
from typing import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rljax import models
from rljax.rewards import batched
from rljax.rewards.pool import RewardBatch, RewardInput

__all__ = [
  "LikelihoodImprovementReward",
  "build_vrcli_batch",
  "likelihood_improvement",
  "mean_nll",
  "vrcli_rewards",
]


def mean_nll(logp: chex.Array, mask: chex.Array) -> chex.Array:
  """Mean per-token negative log-likelihood [B]: −Σ_t m_t logp_t / Σ_t m_t.

  log PPL(y | c) when `mask` selects the tokens of y. A row with no masked
  token gives 0 (not NaN).
  """
  chex.assert_rank([logp, mask], 2)
  chex.assert_equal_shape([logp, mask])
  mask = mask.astype(jnp.float32)
  total = -jnp.sum(logp.astype(jnp.float32) * mask, axis=1)
  return total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)


def likelihood_improvement(
  logp_with: chex.Array,
  mask_with: chex.Array,
  logp_without: chex.Array,
  mask_without: chex.Array,
) -> chex.Array:
  """VR-CLI reward [B] = [1 − PPL(y | x, a) / PPL(y | x)] × 100.

  Gurung & Lapata 2025, "Learning to Reason for Long-Form Story Generation".

  Args:
    logp_with: [B, T1] reference log-probs of the sequences x, a, y.
    mask_with: [B, T1] 1 on the positions that predict a token of y.
    logp_without: [B, T2] reference log-probs of the sequences x, y.
    mask_without: [B, T2] 1 on the positions that predict a token of y.

  Returns:
    float32 [B]; (1 − exp(NLL_with − NLL_without)) × 100.
  """
  chex.assert_rank([logp_with, mask_with, logp_without, mask_without], 2)
  chex.assert_equal_shape([logp_with, mask_with])
  chex.assert_equal_shape([logp_without, mask_without])
  chex.assert_equal_shape_prefix([logp_with, logp_without], 1)
  log_ratio = mean_nll(logp_with, mask_with) - mean_nll(
    logp_without, mask_without
  )
  return (1.0 - jnp.exp(log_ratio)) * 100.0


def build_vrcli_batch(
  prompts: Sequence[Sequence[int]],
  reasonings: Sequence[Sequence[int]],
  golds: Sequence[Sequence[int]],
  separator: Sequence[int],
  pad_id: int,
  rows: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """One right-padded batch holding both contexts of every item.

  Rows 0..R−1 are x + a + sep + y, rows R..2R−1 are x + sep + y (R = `rows`,
  default the number of items; extra rows are padding with an empty target).

  Returns:
    tokens int32 [2R, T], attention_mask int32 [2R, T], and target_mask
    float32 [2R, T−1] with 1 where `models.token_logprobs`' position t
    predicts a token of y (i.e. token t+1 is in y).
  """
  count = len(prompts)
  if not len(reasonings) == len(golds) == count:
    raise ValueError(
      f"build_vrcli_batch: {count} prompts, {len(reasonings)} "
      f"reasonings, {len(golds)} golds"
    )
  rows = count if rows is None else rows
  if rows < count:
    raise ValueError(f"rows={rows} < {count} items")
  seqs, spans = [], []
  for with_reasoning in (True, False):
    for i in range(rows):
      if i >= count:
        seqs.append([pad_id]), spans.append((1, 1))
        continue
      if not golds[i]:
        raise ValueError(f"item {i}: the gold continuation y has no tokens")
      context = (
        list(prompts[i])
        + (list(reasonings[i]) if with_reasoning else [])
        + list(separator)
      )
      if not context:
        raise ValueError(
          f"item {i}: empty context (no prompt, reasoning or "
          "separator tokens) before y"
        )
      seqs.append(context + list(golds[i]))
      spans.append((len(context), len(context) + len(golds[i])))
  t = 16
  while t < max(len(s) for s in seqs):
    t *= 2
  tokens = np.full((2 * rows, t), pad_id, np.int32)
  attn = np.zeros((2 * rows, t), np.int32)
  target = np.zeros((2 * rows, t - 1), np.float32)
  for r, (s, (start, stop)) in enumerate(zip(seqs, spans)):
    tokens[r, : len(s)] = s
    attn[r, : len(s)] = 1
    target[r, start - 1 : stop - 1] = 1.0  # position t predicts token t+1
  return tokens, attn, target


@functools.partial(jax.jit, static_argnums=(0, 5))
def vrcli_rewards(
  config: models.ModelConfig,
  params,
  tokens: chex.Array,
  attention_mask: chex.Array,
  target_mask: chex.Array,
  chunk_size: int | None = None,
) -> chex.Array:
  """[R] VR-CLI rewards of a `build_vrcli_batch` batch: one forward pass of
  the reference over its 2R rows, then `likelihood_improvement`."""
  logp, _ = models.token_logprobs(
    config, params, tokens, attention_mask, chunk_size=chunk_size
  )
  with_a, without_a = jnp.split(logp, 2)
  m_with, m_without = jnp.split(target_mask, 2)
  return likelihood_improvement(with_a, m_with, without_a, m_without)


class LikelihoodImprovementReward:
  """VR-CLI as a batched reward: x = the rendered prompt, a = the policy's
  completion, y = the example's ground truth, joined as x + a + sep + y.

  The reference π_G is frozen (its params are never updated by the
  trainer). Component `vrcli` is the reward; `nll_gain` is
  NLL(y | x) − NLL(y | x, a) in nats per token.

  Args:
    config, params: the reference model.
    tokenizer: the policy's tokenizer (the reference must share it).
    separator: text between the reasoning and y (after x when no a).
    max_reasoning_tokens: a longer reasoning keeps its last tokens.
    batch_size: items per jitted call (2× rows); the last chunk is padded.
  """

  name = "vrcli"

  def __init__(
    self,
    config: models.ModelConfig,
    params,
    tokenizer,
    separator: str = "\n",
    max_reasoning_tokens: int = 512,
    batch_size: int = 16,
    chunk_size: int | None = None,
  ):
    if batch_size < 1:
      raise ValueError(f"batch_size={batch_size!r}; expected >= 1")
    self.config = config
    self.params = jax.device_put(params)
    self.tokenizer = tokenizer
    self.separator_ids = tokenizer.encode(separator, add_special_tokens=False)
    self.max_reasoning_tokens = max_reasoning_tokens
    self.batch_size = batch_size
    self.chunk_size = chunk_size
    pad = getattr(tokenizer, "pad_token_id", None)
    self.pad_id = int(pad) if pad is not None else 0

  def rewards(
    self,
    prompts: Sequence[str],
    reasonings: Sequence[str],
    golds: Sequence[str],
  ) -> np.ndarray:
    enc = lambda s: self.tokenizer.encode(s, add_special_tokens=False)
    out = np.zeros(len(prompts), np.float32)
    for sl in batched.chunks(len(prompts), self.batch_size):
      x = [enc(p) for p in prompts[sl]]
      a = [
        enc(r)[-self.max_reasoning_tokens :] if r else []
        for r in reasonings[sl]
      ]
      y = [enc(g) for g in golds[sl]]
      tokens, attn, target = build_vrcli_batch(
        x, a, y, self.separator_ids, self.pad_id, self.batch_size
      )
      r = vrcli_rewards(
        self.config,
        self.params,
        jnp.asarray(tokens),
        jnp.asarray(attn),
        jnp.asarray(target),
        self.chunk_size,
      )
      out[sl] = np.asarray(r)[: sl.stop - sl.start]
    return out

  def score(self, inputs: Sequence[RewardInput]) -> RewardBatch:
    t0 = time.perf_counter()
    r = self.rewards(
      [i.prompt for i in inputs],
      [i.completion for i in inputs],
      [i.ground_truth for i in inputs],
    )
    # log(1 − I/100) = NLL_with − NLL_without: the gain in nats per token.
    gain = -np.log(np.maximum(1.0 - r / 100.0, 1e-30))
    return batched.reward_batch(
      r, {"vrcli": r, "nll_gain": gain}, seconds=time.perf_counter() - t0
    )

  def close(self) -> None:
    pass
