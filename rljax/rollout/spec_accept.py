"""Lossless speculative decoding: the coupled acceptance rule.

A verify step feeds row b its last token and k_b draft tokens d_1 .. d_k
(positions L_b - 1 .. L_b - 1 + k_b of its response, L_b = tokens sampled
so far) and gets the policy's next-token logits z_0 .. z_k after each of
them. Position j's sample is drawn exactly as plain decoding draws
response token L_b + j:

  s_j = sample(z_j, fold_in(key_b, L_b + j))        (`sample_positions`)

with the same sampler (`token_sampling.sample_next_token`: temperature,
top-k, top-p, greedy) and the row's own key (`token_sampling.sample_keys`).
The rule (`accepted_drafts`, `emitted_count`):

  m_b = max{m <= k_b : d_i = s_{i-1} for every i <= m}     drafts accepted
  emit s_0 .. s_{m_b}, cut after the first stop token and at the row's
  limit; the row's length grows by what is emitted, nothing else.

Claim: the emitted tokens are plain decoding's, token for token.
Proof, by induction over the emitted positions j = 0 .. m_b. z_0 is the
logit vector after the row's real prefix, as plain decoding's step L_b
computes it; with the same key and sampler, s_0 is plain decoding's token
L_b. For j >= 1, s_j is emitted only if d_1 .. d_j = s_0 .. s_{j-1}, i.e.
the verify pass fed z_j exactly the prefix plain decoding has after
emitting s_0 .. s_{j-1} (the induction hypothesis), so z_j is plain
decoding's logit vector there, its key fold_in(key_b, L_b + j) is plain
decoding's, and s_j is its token L_b + j. The stop and limit cuts are
plain decoding's own. The KV the pass wrote for positions up to the new
length - 1 is that of these tokens; the slots of rejected drafts lie at or
beyond it, are never read, and are overwritten by later steps.

Hence the distribution: the output is a deterministic function of the
keys equal to plain decoding's, path by path, whatever the drafts are (a
draft may depend on anything, even on the keys: it only decides how many
tokens one step emits). So the law of every response is the policy's π,
and each emitted token's behaviour log-prob log π(s_j | prefix) is the
sampler's on z_j. Marginally, a draft d is accepted with probability
π(d), the acceptance of speculative sampling (Leviathan et al., 2023,
"Fast Inference from Transformers via Speculative Decoding"; Chen et al.,
2023) for a draft distribution that is a point mass, and a rejected
position emits π conditioned on "not d", its residual; the coupling adds
that the path equals plain decoding's under the same keys.

Floats: the verify pass computes z_j in another XLA program than plain
decoding's step, in a batch of B·T positions where plain decoding
computes it in a batch of its row bucket. The dots alone give a row the
same bits at those row counts (`spec_verify.verify_shapes` keeps B·T
within the row buckets), but the program as a whole may sum or round in
another order, so z_j may differ in its last bits, and a token may differ
where the sampler's uniform falls within that noise of a CDF boundary
(greedy: where the two top logits are that close). The model's kernels
are kept row-count invariant (`layers.rms_norm`), and `sample_positions`
samples each position as plain decoding does, so on SmolLM2 the tokens
are plain decoding's (docs/speculative.md, "Floats"); the coupling's
exactness holds for the z_j the verify pass computed.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def sample_positions(
  sample: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]],
  logits: jax.Array,
  key_data: jax.Array,
  first: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """s_j = sample(z_j, fold_in(key_b, first_b + j)) at every position.

  Args:
    sample: the plain decoding sampler, (logits [R, V], keys [R]) ->
      (tokens [R], log-probs [R]) (`slot_program._sampler`).
    logits: f32 [B, T, V], z_j of each row.
    key_data: raw key data [B, ...] of each row's key.
    first: int32 [B], L_b: the response index of position 0's sample.

  Returns:
    (tokens int32 [B, T], their log-probs f32 [B, T]).
  """
  if logits.ndim != 3 or first.shape != logits.shape[:1]:
    raise ValueError(
      f"sample_positions: logits {logits.shape}, first {first.shape}; "
      "expected [B, T, V] and [B]"
    )
  t = logits.shape[1]
  keys = jax.random.wrap_key_data(key_data)
  index = first[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
  folded = jax.vmap(jax.vmap(jax.random.fold_in, (None, 0)))(keys, index)
  # Position by position: each call is plain decoding's on its B rows (a
  # softmax over [B·T, V] at once may reduce in another order).
  out = [sample(logits[:, j], folded[:, j]) for j in range(t)]
  return (
    jnp.stack([tok for tok, _ in out], axis=1),
    jnp.stack([logp for _, logp in out], axis=1),
  )


def accepted_drafts(
  samples: jax.Array, drafts: jax.Array, num_drafts: jax.Array
) -> jax.Array:
  """m_b: the leading drafts equal to the samples before them.

  Args:
    samples: int32 [B, T], s_0 .. s_{T-1}.
    drafts: int32 [B, T - 1], d_1 .. d_{T-1} (d_i fed at position i).
    num_drafts: int32 [B], k_b <= T - 1 (drafts past it are padding).

  Returns:
    int32 [B] in [0, k_b].
  """
  t = samples.shape[1]
  if drafts.shape != (samples.shape[0], t - 1):
    raise ValueError(
      f"accepted_drafts: samples {samples.shape}, drafts {drafts.shape}; "
      "expected drafts [B, T - 1]"
    )
  match = (drafts == samples[:, :-1]) & (
    jnp.arange(t - 1)[None] < num_drafts[:, None]
  )
  return jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=1), axis=1)


def emitted_count(
  samples: jax.Array,
  accepted: jax.Array,
  stop_ids: jax.Array,
  room: jax.Array,
) -> jax.Array:
  """e_b: tokens row b emits: s_0 .. s_{m_b}, cut after the first stop
  token and at `room` (its limit minus its length, >= 1 for a live row).

  Args:
    samples: int32 [B, T]; accepted: int32 [B] (m_b); stop_ids: int32 [K];
    room: int32 [B].

  Returns:
    int32 [B] in [1, m_b + 1] for rows with room, 0 where room is 0.
  """
  t = samples.shape[1]
  stops = jnp.isin(samples, stop_ids)
  first_stop = jnp.min(
    jnp.where(stops, jnp.arange(t)[None], t), axis=1
  )  # t: none
  return jnp.minimum(jnp.minimum(accepted, first_stop) + 1, room).astype(
    jnp.int32
  )


def emitted_reference(
  samples: np.ndarray,
  drafts: np.ndarray,
  num_drafts: int,
  stop_ids: set[int],
  room: int,
) -> list[int]:
  """The rule for one row, as a loop (the tests' oracle)."""
  out = []
  for j, s in enumerate(samples):
    if len(out) >= room:
      break
    out.append(int(s))
    if int(s) in stop_ids or j >= num_drafts or int(drafts[j]) != int(s):
      break
  return out
