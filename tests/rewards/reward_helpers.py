"""Reward functions that misbehave on purpose, for the pool tests.

A module of its own so that worker processes can import them by name.
"""

import os
import time

from rljax.rewards import RewardOutput


def misbehaving_reward(prompt, completion, ground_truth, metadata):
  """Echo check, except on the command words: hang, raise, die."""
  if completion == "hang":
    time.sleep(600)
  if completion == "raise":
    raise RuntimeError("reward function bug")
  if completion == "die":
    os._exit(3)  # the process vanishes mid-item
  return 1.0 if completion == ground_truth else 0.0


def partial_components_reward(prompt, completion, ground_truth, metadata):
  """Only some items report the "bonus" component."""
  if completion == "bonus":
    return RewardOutput(2.0, {"base": 1.0, "bonus": 1.0})
  return RewardOutput(1.0, {"base": 1.0})
