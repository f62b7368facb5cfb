"""A generated rollout as flat numpy arrays and back: how a checkpoint
stores the rollouts in flight (`checkpoint.save_step`), with no pickles.

Ragged rows (prompts, responses, behaviour log-probs, per-token versions,
a trajectory's action mask and per-turn rewards) become one flat array and
one array of lengths each; the rollout's metrics a sorted list of keys and
one of values.
"""

from __future__ import annotations

import numpy as np

from rljax.rollout.base import RolloutBatch


def _ragged(rows, dtype) -> tuple[np.ndarray, np.ndarray]:
  lengths = np.array([len(r) for r in rows], np.int64)
  flat = (
    np.concatenate([np.asarray(r, dtype) for r in rows])
    if rows
    else np.zeros((0,), dtype)
  )
  return flat.astype(dtype), lengths


def _unragged(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
  return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []


def rollout_to_arrays(
  rb: RolloutBatch, extra: dict, prefix: str
) -> dict[str, np.ndarray]:
  """A generated rollout and its metrics as flat arrays (no pickles)."""
  out = {}
  for name, rows, dtype in (
    ("prompt_ids", rb.prompt_ids, np.int64),
    ("response_ids", rb.response_ids, np.int64),
    ("behav_logp", rb.behav_logp, np.float32),
  ):
    out[prefix + name], out[prefix + name + "_len"] = _ragged(rows, dtype)
  out[prefix + "finish_reason"] = np.array(rb.finish_reason, dtype=np.str_)
  out[prefix + "n"] = np.array(rb.n, np.int64)
  # Multi-turn fields, only when present (a resumed trajectory batch must
  # not train on its observation tokens).
  if rb.action_mask is not None:
    name = prefix + "action_mask"
    out[name], out[name + "_len"] = _ragged(rb.action_mask, np.int8)
  if rb.turn_rewards is not None:
    for name, col, dtype in (
      ("turn_index", 0, np.int64),
      ("turn_reward", 1, np.float64),
    ):
      rows = [[pair[col] for pair in r] for r in rb.turn_rewards]
      out[prefix + name], out[prefix + name + "_len"] = _ragged(rows, dtype)
  # The version of the weights behind each token: the resumed step reports
  # the lag the uninterrupted one did (absent: unknown, as generated).
  if rb.policy_version is not None:
    name = prefix + "policy_version"
    out[name], out[name + "_len"] = _ragged(rb.policy_version, np.int32)
  out[prefix + "extra_keys"] = np.array(sorted(extra), dtype=np.str_)
  out[prefix + "extra_values"] = np.array(
    [extra[k] for k in sorted(extra)], np.float64
  )
  return out


def rollout_from_arrays(aux: dict, prefix: str) -> tuple[RolloutBatch, dict]:
  """`rollout_to_arrays` inverted."""
  get = lambda name: _unragged(aux[prefix + name], aux[prefix + name + "_len"])
  rb = RolloutBatch(
    prompt_ids=[r.tolist() for r in get("prompt_ids")],
    response_ids=[r.tolist() for r in get("response_ids")],
    behav_logp=[r.astype(np.float32) for r in get("behav_logp")],
    finish_reason=[str(f) for f in aux[prefix + "finish_reason"]],
    n=int(aux[prefix + "n"]),
    action_mask=(
      [r.astype(bool) for r in get("action_mask")]
      if prefix + "action_mask" in aux
      else None
    ),
    turn_rewards=(
      [
        [(int(i), float(r)) for i, r in zip(idx, rew)]
        for idx, rew in zip(get("turn_index"), get("turn_reward"))
      ]
      if prefix + "turn_index" in aux
      else None
    ),
    policy_version=(
      [r.astype(np.int32) for r in get("policy_version")]
      if prefix + "policy_version" in aux
      else None
    ),
  )
  extra = {
    str(k): float(v)
    for k, v in zip(aux[prefix + "extra_keys"], aux[prefix + "extra_values"])
  }
  return rb, extra
