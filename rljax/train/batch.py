"""From a rollout and its rewards to the arrays the update step trains on.

Pure NumPy/JAX glue between `rljax.rollout` (token lists), `rljax.core`
(advantages, shaping, group filtering) and `rljax.train.update` (a dict of
equally shaped arrays). No model is called here.
"""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp

from rljax.core import advantages as adv_lib
from rljax.core import shaping
from rljax.train.config import TrainConfig


def seed_for(*parts: int) -> int:
  """A 31-bit seed derived from integers (rollout of step k, round r, ...)."""
  h = np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts])
  return int(h.generate_state(1)[0] & 0x7FFFFFFF)


def minibatch_seeds(seed: int, step: int, epochs: int) -> list[int]:
  """The seeds of the minibatch orders of step `step`, one per epoch."""
  return [seed_for(seed, step, 1000 + epoch) for epoch in range(epochs)]


def pad_id(tokenizer) -> int:
  """The tokenizer's pad id, 0 when it has none."""
  pad = getattr(tokenizer, "pad_token_id", None)
  return int(pad) if pad is not None else 0


def bucket(length: int, multiple: int = 32) -> int:
  """Rounds up to a multiple, so that jit compiles are reused across steps."""
  return max(multiple, -(-length // multiple) * multiple)


def prompt_width(length: int) -> int:
  """The width of the prompt part of an update batch holding prompts of up to
  `length` tokens: a multiple of 8 up to 64, then 4 sizes per octave (80,
  96, 112, 128, 160, ..., 256, 320, ...).

  Every column is paid for by the update step's decoder, so the padding
  stays under 8 columns up to 64 and under 1/5 of the width beyond, while
  the number of shapes (one compile of the update step each) grows only
  with log(length). The default job's 49-51-token prompts take 56 columns,
  where `bucket` gave 64: 7.6% fewer FLOPs per update step.
  """
  if length < 1:
    raise ValueError(f"prompt_width: length={length}; expected >= 1")
  step = 8 if length <= 64 else (1 << (length - 1).bit_length()) // 8
  return -(-length // step) * step


def sequence_advantages(
  cfg: TrainConfig, rewards: np.ndarray, valid: np.ndarray
) -> np.ndarray:
  """Per-sequence advantages [B] for the outcome-reward estimators.

  `valid` marks sequences that take part (dynamic sampling may fill a batch
  with masked-out groups); the returned advantage is 0 elsewhere. The
  REINFORCE++ estimators here whiten one number per sequence; the trainer
  trains them token-level, as their paper does
  (`build_batch.reinforce_pp_advantages`).
  """
  r = jnp.asarray(rewards, jnp.float32)
  g = cfg.rollout.group_size
  if cfg.advantage.estimator == "grpo":
    a = adv_lib.grpo(r, g)
  elif cfg.advantage.estimator == "drgrpo":
    a = adv_lib.drgrpo(r, g)
  elif cfg.advantage.estimator == "rloo":
    a = adv_lib.rloo(r, g)
  elif cfg.advantage.estimator == "reinforce_pp":
    a = adv_lib.reinforce_pp(r, jnp.asarray(valid))
  elif cfg.advantage.estimator == "reinforce_pp_baseline":
    a = adv_lib.reinforce_pp_baseline(r, g, valid=jnp.asarray(valid, bool))
  elif cfg.advantage.estimator == "reinforce":
    a = r
  else:
    raise ValueError(
      f"advantage={cfg.advantage.estimator!r} is not an outcome estimator"
    )
  return np.where(valid, np.asarray(a), 0.0).astype(np.float32)


def shaped_rewards(
  cfg: TrainConfig, rewards: np.ndarray, response_lengths: np.ndarray
) -> np.ndarray:
  """Adds DAPO's soft overlong punishment when configured (Yu et al. 2025).

  `cfg.overlong_lengths()` gives (L_max, L_cache); the penalty is
  `rljax.core.shaping.soft_overlong_punishment` of the response lengths.
  """
  lengths = cfg.overlong_lengths()
  if lengths is None:
    return rewards
  penalty = shaping.soft_overlong_punishment(
    jnp.asarray(response_lengths), *lengths
  )
  return rewards + np.asarray(penalty, np.float32)


def group_keep(cfg: TrainConfig, rewards: np.ndarray) -> np.ndarray:
  """bool [n_groups]: groups with reward variance (DAPO dynamic sampling)."""
  if not cfg.advantage.dynamic_sampling:
    return np.ones(len(rewards) // cfg.rollout.group_size, bool)
  zero_var = shaping.zero_variance_groups(
    jnp.asarray(rewards, jnp.float32), cfg.rollout.group_size
  )
  return ~np.asarray(zero_var)
