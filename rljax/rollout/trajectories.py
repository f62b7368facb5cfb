"""Validation of `RolloutBatch`'s multi-turn fields (`action_mask`,
`turn_rewards`): a trajectory is one response row, model turns and the
environment's observation tokens concatenated, and these say which tokens
the policy sampled and which turns earned a reward."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rljax.core import _validation as v


def per_token_rows(
  field: str, value: Any, response_ids: list[list[int]], what: str, unit: str
) -> list[np.ndarray]:
  """The per-token fields of `RolloutBatch` (`action_mask`,
  `policy_version`) share their shape: a list with one 1-D array per
  response, of that response's length. Checks it and returns the arrays
  (dtype and values are each field's own check)."""
  name = f"RolloutBatch.{field}"
  if isinstance(value, (str, bytes, np.ndarray)) or not isinstance(
    value, Sequence
  ):
    raise TypeError(v.field_message(name, value, what))
  if len(value) != len(response_ids):
    raise ValueError(
      f"{name} has {len(value)} entries; expected one per response "
      f"({len(response_ids)})"
    )
  out = []
  for row, (entry, ids) in enumerate(zip(value, response_ids)):
    arr = np.asarray(entry)
    if arr.ndim != 1 or len(arr) != len(ids):
      raise ValueError(
        f"{name}[{row}] has shape {arr.shape}; expected ({len(ids)},), one "
        f"{unit} per token of response {row}"
      )
    out.append(arr)
  return out


def check_action_mask(
  action_mask: Any, response_ids: list[list[int]]
) -> list[np.ndarray]:
  """`RolloutBatch.action_mask` validated: one 0/1 array per response, of
  its length; returned as bool arrays."""
  rows = per_token_rows(
    "action_mask",
    action_mask,
    response_ids,
    "a list of per-response 0/1 arrays, or None",
    "flag",
  )
  out = []
  for row, arr in enumerate(rows):
    if arr.size and not (
      arr.dtype == bool
      or (np.issubdtype(arr.dtype, np.number) and np.isin(arr, (0, 1)).all())
    ):
      raise ValueError(
        f"RolloutBatch.action_mask[{row}] holds {arr!r:.80}; expected 0/1 "
        "or bool flags (1 = model token, 0 = observation token)"
      )
    out.append(arr.astype(bool))
  return out


def check_turn_rewards(
  turn_rewards: Any,
  response_ids: list[list[int]],
  action_mask: list[np.ndarray] | None,
) -> list[list[tuple[int, float]]]:
  """`RolloutBatch.turn_rewards` validated: each (index, reward) sits on a
  model token of its response (by convention the last one of the turn it
  rewards; an observation token is never an action to credit) and the
  reward is finite."""
  if isinstance(turn_rewards, (str, bytes)) or not isinstance(
    turn_rewards, Sequence
  ):
    raise TypeError(
      v.field_message(
        "RolloutBatch.turn_rewards",
        turn_rewards,
        "a list of per-response lists of (token_index, reward), or None",
      )
    )
  if len(turn_rewards) != len(response_ids):
    raise ValueError(
      f"RolloutBatch.turn_rewards has {len(turn_rewards)} entries; expected "
      f"one per response ({len(response_ids)})"
    )
  out = []
  for row, (pairs, ids) in enumerate(zip(turn_rewards, response_ids)):
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
      raise TypeError(
        v.field_message(
          f"RolloutBatch.turn_rewards[{row}]",
          pairs,
          "a list of (token_index, reward) pairs ([] for none)",
        )
      )
    size = len(ids)
    model = action_mask[row] if action_mask is not None else np.ones(size, bool)
    checked = []
    for pair in pairs:
      name = f"RolloutBatch.turn_rewards[{row}]"
      try:
        index, reward = pair
        index_ok = isinstance(index, (int, np.integer)) and not isinstance(
          index, bool
        )
        reward = float(reward)
      except (TypeError, ValueError):
        index_ok = False
      if not index_ok or not np.isfinite(reward):
        raise ValueError(
          v.field_message(
            name, pair, "(token_index: int, reward: finite float) pairs"
          )
        )
      index = int(index)
      if not 0 <= index < size:
        raise ValueError(
          f"{name} has token_index {index}; expected an index into response "
          f"{row}, in [0, {size})"
        )
      if not model[index]:
        raise ValueError(
          f"{name} has token_index {index}, an observation token "
          f"(action_mask[{index}] = 0); expected a model token, the last "
          "one of the turn the reward is for"
        )
      checked.append((index, reward))
    out.append(checked)
  return out
