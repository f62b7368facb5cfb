"""Evaluation metrics over n sampled answers per problem: pass@k and avg@k."""

from __future__ import annotations

import numpy as np

__all__ = ["avg_at_k", "mean_pass_at_k", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples of which c are correct.

  pass@k = 1 - C(n-c, k) / C(n, k)  (Chen et al. 2021, "Evaluating Large
  Language Models Trained on Code", eq. 1), evaluated as the product
  1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms huge binomials.
  """
  for name, value in (("n", n), ("c", c), ("k", k)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
      raise TypeError(
        f"pass_at_k: {name} is {type(value).__name__} {value!r}; expected an int"
      )
  if n < 1:
    raise ValueError(f"pass_at_k: n is {n}; expected n >= 1")
  if not 0 <= c <= n:
    raise ValueError(f"pass_at_k: c is {c}; expected 0 <= c <= n = {n}")
  if not 1 <= k <= n:
    raise ValueError(f"pass_at_k: k is {k}; expected 1 <= k <= n = {n}")
  if n - c < k:
    return 1.0
  i = np.arange(n - c + 1, n + 1, dtype=np.float64)
  return float(1.0 - np.prod(1.0 - k / i))


def _as_correct_matrix(correct, name: str) -> np.ndarray:
  matrix = np.asarray(correct)
  if matrix.ndim != 2 or matrix.shape[1] == 0:
    raise ValueError(
      f"{name}: correct has shape {matrix.shape}; expected [num_problems, n] with n >= 1"
    )
  return matrix


def mean_pass_at_k(correct, k: int) -> float:
  """Mean over problems of ``pass_at_k(n, c_p, k)``.

  Args:
    correct: [num_problems, n] booleans (or 0/1 scores; > 0.5 is correct).
    k: 1 <= k <= n.
  """
  matrix = _as_correct_matrix(correct, "mean_pass_at_k") > 0.5
  n = matrix.shape[1]
  return float(np.mean([pass_at_k(n, int(c), k) for c in matrix.sum(axis=1)]))


def avg_at_k(correct, k: int | None = None) -> float:
  """Avg@k: mean score over the first k samples of every problem (all n by
  default), i.e. the expected single-sample accuracy.

  Args:
    correct: [num_problems, n] scores in [0, 1].
    k: 1 <= k <= n, or None for n.
  """
  matrix = _as_correct_matrix(correct, "avg_at_k").astype(np.float64)
  n = matrix.shape[1]
  k = n if k is None else k
  if not 1 <= k <= n:
    raise ValueError(f"avg_at_k: k is {k}; expected 1 <= k <= n = {n}")
  return float(matrix[:, :k].mean())
