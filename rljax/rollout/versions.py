"""Validation of `RolloutBatch.policy_version`: the version of the weights
that sampled each response token (issue 47, per-token policy versions)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rljax.core import _validation as v


def check_policy_version(
  policy_version: Any, response_ids: list[list[int]]
) -> list[np.ndarray]:
  """`RolloutBatch.policy_version` validated: one array of non-negative
  integers per response, of its length; returned as int32 arrays."""
  if isinstance(policy_version, (str, bytes, np.ndarray)) or not isinstance(
    policy_version, Sequence
  ):
    raise TypeError(
      v.field_message(
        "RolloutBatch.policy_version",
        policy_version,
        "a list of per-response int arrays, or None",
      )
    )
  if len(policy_version) != len(response_ids):
    raise ValueError(
      f"RolloutBatch.policy_version has {len(policy_version)} entries; "
      f"expected one per response ({len(response_ids)})"
    )
  out = []
  for row, (ver, ids) in enumerate(zip(policy_version, response_ids)):
    arr = np.asarray(ver)
    if arr.ndim != 1 or len(arr) != len(ids):
      raise ValueError(
        f"RolloutBatch.policy_version[{row}] has shape {arr.shape}; expected "
        f"({len(ids)},), one version per token of response {row}"
      )
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
