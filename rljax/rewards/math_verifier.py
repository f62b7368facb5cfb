"""The math answer reward (contract: ``rewards.math_reward``).

``math_reward`` = 1 if the completion's final answer equals the ground truth
mathematically, else 0; it never raises and never hangs. Plain numbers are
compared in-process; anything symbolic runs in a private ``IsolatedWorker``
that is killed after ``timeout_s`` (a killed check scores 0). Inside a reward
pool worker, whose parent already enforces a per-item timeout, the symbolic
check runs inline.
"""

from __future__ import annotations

import atexit
import logging
import numbers
import threading

from rljax.rewards import equivalence, extraction, isolation

__all__ = [
  "DEFAULT_TIMEOUT_S",
  "ground_truth_answer",
  "math_equal",
  "math_reward",
]

DEFAULT_TIMEOUT_S = 5.0

_logger = logging.getLogger(__name__)
_worker: isolation.IsolatedWorker | None = None
_worker_lock = threading.Lock()


def _symbolic_worker() -> isolation.IsolatedWorker:
  global _worker
  with _worker_lock:
    if _worker is None:
      _worker = isolation.IsolatedWorker(
        equivalence.symbolic_equal, warm_up=equivalence.warm_up
      )
      atexit.register(_worker.kill)
    return _worker


def ground_truth_answer(ground_truth: object) -> str | None:
  """The answer string of a ground truth.

  Numbers are formatted (``27.0`` -> ``27``); a ground truth that still
  carries a worked solution (``\\boxed{}`` or ``####``) is reduced to its
  final answer.
  """
  if isinstance(ground_truth, bool) or ground_truth is None:
    return None
  if isinstance(ground_truth, numbers.Integral):
    return str(int(ground_truth))
  if isinstance(ground_truth, numbers.Real):
    value = float(ground_truth)
    return str(int(value)) if value.is_integer() else repr(value)
  if not isinstance(ground_truth, str):
    return None
  if "\\boxed" in ground_truth or "\\fbox" in ground_truth:
    answer = extraction.extract_last_boxed(ground_truth)
  elif "####" in ground_truth:
    answer = extraction.extract_gsm8k(ground_truth)
  else:
    answer = ground_truth
  if answer is None:
    return None
  return extraction.strip_answer_decorations(answer) or None


def math_equal(
  pred: str, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
  """Whether two already-extracted answers are equal; False on timeout/error."""
  if len(pred) > equivalence.MAX_ANSWER_CHARS:
    return False
  fast = equivalence.plain_numbers_equal(pred, gold)
  if fast is not None:
    return fast
  if isolation.in_isolated_worker():
    return equivalence.symbolic_equal(pred, gold)
  result = _symbolic_worker().call((pred, gold), timeout_s)
  if result.status != "ok":
    _logger.warning(
      "math answer check gave %s (%s) for %.80r vs %.80r",
      result.status,
      result.value,
      pred,
      gold,
    )
    return False
  return bool(result.value)


def math_reward(
  completion: str,
  ground_truth: str,
  *,
  timeout_s: float = DEFAULT_TIMEOUT_S,
  last_number_fallback: bool = False,
) -> float:
  """1.0 when the completion's final answer equals ``ground_truth``, else 0.0.

  The final answer is the content of the last ``<answer>`` tag, else the
  last ``\\boxed{}``, else the last ``#### x``, else the last "The answer is
  x" (see ``extraction``); a completion with none of them scores 0.
  Equality is exact for plain numbers and math-verify's symbolic equality
  otherwise (see ``equivalence`` for the rules on percentages, decimals,
  units). Never raises; a check that takes more than ``timeout_s`` seconds
  scores 0.

  ``last_number_fallback`` (off by default) grades the last number of a
  completion that has no answer format: a tiny model sampled at temperature
  1 rarely uses one at first (SmolLM2-135M on "easy" arithmetic: 0% strict,
  about 19% with the fallback), and an all-zero reward teaches nothing.
  """
  try:
    if not isinstance(completion, str):
      return 0.0
    pred = extraction.extract_final_answer(completion)
    if pred is None and last_number_fallback:
      pred = extraction.extract_last_number(completion)
    gold = ground_truth_answer(ground_truth)
    if pred is None or gold is None:
      return 0.0
    return 1.0 if math_equal(pred, gold, timeout_s=timeout_s) else 0.0
  except Exception:  # the contract: a reward never takes the run down
    _logger.warning("math_reward failed; scoring 0", exc_info=True)
    return 0.0
