"""Validation of `RolloutBatch.policy_version`: the version of the weights
that sampled each response token."""

from __future__ import annotations

from typing import Any

import numpy as np

from rljax.rollout import trajectories


def check_policy_version(
  policy_version: Any, response_ids: list[list[int]]
) -> list[np.ndarray]:
  """`RolloutBatch.policy_version` validated: one array of non-negative
  integers per response, of its length; returned as int32 arrays."""
  rows = trajectories.per_token_rows(
    "policy_version",
    policy_version,
    response_ids,
    "a list of per-response int arrays, or None",
    "version",
  )
  out = []
  for row, arr in enumerate(rows):
    if arr.size and (
      not np.issubdtype(arr.dtype, np.integer)
      or arr.min() < 0
      or arr.max() > np.iinfo(np.int32).max
    ):
      raise ValueError(
        f"RolloutBatch.policy_version[{row}] holds {arr!r:.80}; expected "
        "non-negative int32 versions (the step whose weights sampled the "
        "token)"
      )
    out.append(arr.astype(np.int32))
  return out
