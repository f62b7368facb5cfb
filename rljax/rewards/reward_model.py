"""A Bradley–Terry reward model as a batched reward: `RewardModelReward`
scores (prompt, completion) with a trained model in the trainer's process.

The model's parts live in their own modules and are re-exported here, so
`rljax.rewards.reward_model.X` names all of them:
  `bradley_terry`          the pair loss and accuracy, r(x, y) from the value
                           head at the last real token (the math);
  `preference_pairs`       the JSONL pair files, a synthetic set, the held-out
                           split, tokenization into padded batches;
  `reward_model_training`  the AdamW step, held-out evaluation, the loop;
  `reward_model_io`        save (orbax + an HF sequence-classification export)
                           and load.
"""

from __future__ import annotations

import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rljax.rewards import batched
from rljax.rewards.bradley_terry import (
  bradley_terry_loss,
  init_reward_model,
  last_token_index,
  pair_accuracy,
  score_batch,
  sequence_rewards,
)
from rljax.rewards.pool import RewardBatch, RewardInput
from rljax.rewards.preference_pairs import (
  PAIR_FIELDS,
  PreferenceDataError,
  PreferencePair,
  encode_pairs,
  encode_texts,
  load_preference_pairs,
  split_pairs,
  synthetic_arithmetic_pairs,
  write_preference_pairs,
)
from rljax.rewards.reward_model_io import (
  FORMAT,
  RewardModel,
  load_reward_model,
  save_reward_model,
)
from rljax.rewards.reward_model_training import (
  evaluate_pairs,
  make_train_step,
  pair_scores,
  train_reward_model,
)

__all__ = [
  "FORMAT",
  "PAIR_FIELDS",
  "PreferenceDataError",
  "PreferencePair",
  "RewardModel",
  "RewardModelReward",
  "bradley_terry_loss",
  "encode_pairs",
  "encode_texts",
  "evaluate_pairs",
  "init_reward_model",
  "last_token_index",
  "load_preference_pairs",
  "load_reward_model",
  "make_train_step",
  "pair_accuracy",
  "pair_scores",
  "save_reward_model",
  "sequence_rewards",
  "split_pairs",
  "synthetic_arithmetic_pairs",
  "train_reward_model",
  "write_preference_pairs",
]


class RewardModelReward:
  """r(prompt, completion) of a trained reward model, as a batched reward.

  Runs in the trainer's process on its default device, `batch_size` rows per
  jitted call (the last chunk padded, so one shape compiles). Component
  `reward_model` holds the raw score; `scale`/`shift` map it to the reward:
  reward = scale · r + shift.
  """

  name = "reward_model"

  def __init__(
    self,
    model: RewardModel,
    tokenizer=None,
    batch_size: int = 32,
    scale: float = 1.0,
    shift: float = 0.0,
  ):
    self.model = model
    self.tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    if self.tokenizer is None:
      raise ValueError(
        "RewardModelReward needs a tokenizer: the reward "
        "model dir has none and none was given"
      )
    if batch_size < 1:
      raise ValueError(f"batch_size={batch_size!r}; expected >= 1")
    self.batch_size = batch_size
    self.scale, self.shift = float(scale), float(shift)
    pad = getattr(self.tokenizer, "pad_token_id", None)
    self.pad_id = int(pad) if pad is not None else 0
    self.params = jax.device_put(model.params)

  def rewards(
    self, prompts: Sequence[str], completions: Sequence[str]
  ) -> np.ndarray:
    """Raw scores r(x, y) [N] float32."""
    out = np.zeros(len(prompts), np.float32)
    for sl in batched.chunks(len(prompts), self.batch_size):
      tokens, mask = encode_texts(
        self.tokenizer,
        prompts[sl],
        completions[sl],
        self.model.max_len,
        self.pad_id,
        rows=self.batch_size,
      )
      r = score_batch(
        self.model.config, self.params, jnp.asarray(tokens), jnp.asarray(mask)
      )
      out[sl] = np.asarray(r)[: sl.stop - sl.start]
    return out

  def score(self, inputs: Sequence[RewardInput]) -> RewardBatch:
    t0 = time.perf_counter()
    raw = self.rewards(
      [i.prompt for i in inputs], [i.completion for i in inputs]
    )
    return batched.reward_batch(
      self.scale * raw + self.shift,
      {"reward_model": raw},
      seconds=time.perf_counter() - t0,
    )

  def close(self) -> None:
    pass
