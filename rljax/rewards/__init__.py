"""rljax.rewards: verifiable rewards.

Contract: ``math_reward(completion, ground_truth) -> float``. Around it: answer
extraction, the reward-function interface (``RewardOutput``, ``combine``),
format rewards, the Countdown checker, DAPO overlong shaping, a process pool
with per-item timeouts, and pass@k / avg@k.
"""

from rljax.rewards.base import (
  CombinedReward,
  RewardFn,
  RewardOutput,
  combine,
  reward_name,
  to_reward_output,
)
from rljax.rewards.countdown import (
  CountdownError,
  countdown_reward,
  evaluate_countdown_expression,
)
from rljax.rewards.extraction import (
  extract_answer_phrase,
  extract_answer_tag,
  extract_boxed_all,
  extract_final_answer,
  extract_gsm8k,
  extract_last_boxed,
  extract_last_number,
)
from rljax.rewards.formats import (
  boxed_format_reward,
  has_boxed_answer,
  has_r1_format,
  r1_format_reward,
)
from rljax.rewards.math_verifier import (
  ground_truth_answer,
  math_equal,
  math_reward,
)
from rljax.rewards.metrics import avg_at_k, mean_pass_at_k, pass_at_k
from rljax.rewards.pool import RewardBatch, RewardInput, RewardPool, make_inputs
from rljax.rewards.shaping import OverlongPenalty, overlong_penalty
from rljax.rewards.verifiers import Correctness, correctness_reward

__all__ = [
  "CombinedReward",
  "Correctness",
  "CountdownError",
  "OverlongPenalty",
  "RewardBatch",
  "RewardFn",
  "RewardInput",
  "RewardOutput",
  "RewardPool",
  "avg_at_k",
  "boxed_format_reward",
  "combine",
  "correctness_reward",
  "countdown_reward",
  "evaluate_countdown_expression",
  "extract_answer_phrase",
  "extract_answer_tag",
  "extract_boxed_all",
  "extract_final_answer",
  "extract_gsm8k",
  "extract_last_boxed",
  "extract_last_number",
  "ground_truth_answer",
  "has_boxed_answer",
  "has_r1_format",
  "make_inputs",
  "math_equal",
  "math_reward",
  "mean_pass_at_k",
  "overlong_penalty",
  "pass_at_k",
  "r1_format_reward",
  "reward_name",
  "to_reward_output",
]
