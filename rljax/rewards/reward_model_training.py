"""Training a Bradley–Terry reward model: the jitted AdamW step on pair
batches, held-out scoring and evaluation, and the training loop.

The loss only sees score differences, so the head's bias is frozen at 0
(`make_train_step`), which the HF export relies on.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rljax import models
from rljax.rewards import batched
from rljax.rewards.bradley_terry import (
  bradley_terry_loss,
  pair_accuracy,
  score_batch,
  sequence_rewards,
)
from rljax.rewards.preference_pairs import PreferencePair, encode_pairs


def _pair_metrics(config, params, tokens, mask):
  # The loss only sees differences, so the bias's true gradient is 0; its
  # float round-off would still be scaled up to full-size steps by Adam. The
  # bias stays frozen (at 0), which the HF export (no bias) relies on.
  head = dict(
    params["head"], bias=jax.lax.stop_gradient(params["head"]["bias"])
  )
  r = sequence_rewards(config, dict(params, head=head), tokens, mask)
  r_c, r_r = jnp.split(r, 2)
  return bradley_terry_loss(r_c, r_r), {
    "accuracy": pair_accuracy(r_c, r_r),
    "margin": jnp.mean(r_c - r_r),
  }


def make_train_step(config: models.ModelConfig, optimizer):
  """jit(step)(params, opt_state, tokens, mask) -> (params, opt_state,
  {"loss", "accuracy", "margin"}) on one batch from `encode_pairs`."""

  @jax.jit
  def step(params, opt_state, tokens, mask):
    def loss_fn(p):
      return _pair_metrics(config, p, tokens, mask)

    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {"loss": loss, **aux}

  return step


def pair_scores(
  config: models.ModelConfig,
  params,
  tokenizer,
  pairs: Sequence[PreferencePair],
  max_len: int,
  pad_id: int,
  batch_size: int = 32,
) -> tuple[np.ndarray, np.ndarray]:
  """(r_chosen [N], r_rejected [N]) float32 of every pair."""
  r_c, r_r = np.zeros(len(pairs), np.float32), np.zeros(len(pairs), np.float32)
  for sl in batched.chunks(len(pairs), batch_size):
    tokens, mask = encode_pairs(tokenizer, pairs[sl], max_len, pad_id)
    r = np.asarray(
      score_batch(config, params, jnp.asarray(tokens), jnp.asarray(mask))
    )
    r_c[sl], r_r[sl] = np.split(r, 2)
  return r_c, r_r


def evaluate_pairs(
  config: models.ModelConfig,
  params,
  tokenizer,
  pairs: Sequence[PreferencePair],
  max_len: int,
  pad_id: int,
  batch_size: int = 32,
  kinds: Sequence[str] | None = None,
) -> dict[str, float]:
  """Held-out {"loss", "accuracy", "margin"} over the pairs (the kernels on
  `pair_scores`), plus "accuracy_<kind>" per distinct non-empty kind when
  `kinds` (one per pair) is given."""
  if not pairs:
    raise ValueError("evaluate_pairs: no pairs")
  r_c, r_r = pair_scores(
    config, params, tokenizer, pairs, max_len, pad_id, batch_size
  )
  r_c, r_r = jnp.asarray(r_c), jnp.asarray(r_r)
  out = {
    "loss": float(bradley_terry_loss(r_c, r_r)),
    "accuracy": float(pair_accuracy(r_c, r_r)),
    "margin": float(jnp.mean(r_c - r_r)),
  }
  if kinds is not None:
    if len(kinds) != len(pairs):
      raise ValueError(
        f"evaluate_pairs: {len(kinds)} kinds for {len(pairs)} pairs"
      )
    kinds = np.asarray(kinds)
    for kind in sorted(set(kinds.tolist()) - {""}):
      sel = jnp.asarray(kinds == kind)
      out[f"accuracy_{kind}"] = float(pair_accuracy(r_c[sel], r_r[sel]))
  return out


def train_reward_model(
  config: models.ModelConfig,
  params: dict[str, Any],
  tokenizer,
  train_pairs: Sequence[PreferencePair],
  held_out: Sequence[PreferencePair],
  *,
  steps: int,
  batch_size: int,
  learning_rate: float,
  max_len: int,
  seed: int = 0,
  eval_every: int = 0,
  warmup_steps: int = 0,
  log=None,
  held_out_kinds: Sequence[str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, float]]]:
  """Fits the Bradley–Terry loss with AdamW (warmup then cosine decay).

  Batches are drawn without replacement from a reshuffled copy of
  `train_pairs` each epoch. Held-out pairs are evaluated (`evaluate_pairs`)
  at step 0, every `eval_every` steps (0 = never in between) and at the end,
  with "eval_accuracy_<kind>" per `held_out_kinds` (one label per held-out
  pair). `log(row)` is called after every step.

  Returns:
    (params, history): one row per step {"step", "loss", "accuracy",
    "margin", "seconds"}, with "eval_loss", "eval_accuracy", "eval_margin"
    on evaluated steps.
  """
  for name, value in (
    ("steps", steps),
    ("batch_size", batch_size),
    ("max_len", max_len),
  ):
    if not isinstance(value, int) or value < 1:
      raise ValueError(
        f"train_reward_model: {name}={value!r}; expected an int >= 1"
      )
  if not train_pairs:
    raise ValueError("train_reward_model: no training pairs")
  pad = getattr(tokenizer, "pad_token_id", None)
  pad = int(pad) if pad is not None else 0
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, learning_rate, max(warmup_steps, 1), max(steps, warmup_steps + 1)
  )
  optimizer = optax.adamw(schedule)
  opt_state = optimizer.init(params)
  step_fn = make_train_step(config, optimizer)
  rng = np.random.default_rng(seed)
  order, cursor = rng.permutation(len(train_pairs)), 0
  history = []

  def evaluate(row):
    if held_out:
      ev = evaluate_pairs(
        config,
        params,
        tokenizer,
        held_out,
        max_len,
        pad,
        batch_size=max(batch_size, 8),
        kinds=held_out_kinds,
      )
      row.update({f"eval_{k}": v for k, v in ev.items()})

  start = {"step": 0}
  evaluate(start)
  history.append(start)
  if log is not None:
    log(start)
  for step in range(1, steps + 1):
    t0 = time.perf_counter()
    idx = []
    while len(idx) < batch_size:
      if cursor == len(order):
        order, cursor = rng.permutation(len(train_pairs)), 0
      take = min(batch_size - len(idx), len(order) - cursor)
      idx.extend(order[cursor : cursor + take])
      cursor += take
    tokens, mask = encode_pairs(
      tokenizer, [train_pairs[i] for i in idx], max_len, pad
    )
    params, opt_state, out = step_fn(
      params, opt_state, jnp.asarray(tokens), jnp.asarray(mask)
    )
    row = {
      "step": step,
      **{k: float(v) for k, v in out.items()},
      "seconds": time.perf_counter() - t0,
    }
    if step == steps or (eval_every and step % eval_every == 0):
      evaluate(row)
    history.append(row)
    if log is not None:
      log(row)
  return params, history
