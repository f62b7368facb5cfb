"""Correctness reward that picks its verifier from the example's metadata.

Datasets and generated tasks (``rljax.data``) set ``metadata["verifier"]``:
``"math"`` (default; ``math_reward``) or ``"countdown"`` (needs
``metadata["numbers"]`` and ``metadata["target"]``). One reward function then
serves a mixed batch.
"""
from __future__ import annotations

from typing import Any, Mapping

from rljax.rewards.base import RewardOutput
from rljax.rewards.countdown import countdown_reward
from rljax.rewards.math_verifier import math_reward

__all__ = ["VERIFIERS", "correctness_reward"]

VERIFIERS = ("math", "countdown")


def correctness_reward(
    prompt: str, completion: str, ground_truth: str, metadata: Mapping[str, Any]
) -> RewardOutput:
    """1 if the completion's final answer is right for its task, else 0.

    Raises:
      ValueError: unknown ``metadata["verifier"]``, or a countdown example
        without ``numbers``/``target`` (a data bug, not a model error).
    """
    verifier = metadata.get("verifier", "math") if metadata else "math"
    if verifier == "math":
        score = math_reward(completion, ground_truth)
    elif verifier == "countdown":
        missing = [key for key in ("numbers", "target") if key not in metadata]
        if missing:
            raise ValueError(f"countdown example metadata lacks {missing}; has {sorted(metadata)}")
        score = countdown_reward(completion, metadata["numbers"], int(metadata["target"]))
    else:
        raise ValueError(f"metadata['verifier'] is {verifier!r}; expected one of {VERIFIERS}")
    return RewardOutput(score, {"correct": score})
