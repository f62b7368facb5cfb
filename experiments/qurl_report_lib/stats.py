"""The statistics of the QuRL page: mean ± std over seeds, the paired
bootstrap, the verdict rule, and the formatting of numbers.

Statistics (issue 17). Per config: mean ± sample std over seeds. Per claim
"B beats A" or "B is no worse than A": the paired difference of final
held-out accuracy, B − A, over the seeds both configs finished (the same
seed draws the same held-out problems for both), with a 95% percentile
bootstrap interval from `paired_bootstrap` (resample seeds, then problems
within each seed, with replacement; fixed RNG). The verdict (`verdict`):
  * fewer than MIN_SEEDS paired seeds: "not resolved at this scale";
  * superiority claim (B − A > 0): "supported" if the interval's low end is
    > 0; "not supported" if its high end is < MARGIN (no gain as large as
    the margin is compatible with the data); else "not resolved";
  * non-inferiority claim (B no worse than A by more than MARGIN):
    "supported" if low > −MARGIN; "not supported" if high < −MARGIN; else
    "not resolved at this scale".
"""

from __future__ import annotations

import numpy as np

MIN_SEEDS = 3
MARGIN = 0.03  # accuracy (3 points): the smallest effect worth a claim
CONFIDENCE = 0.95
N_BOOT = 10_000


def sample_mean_std(values) -> tuple[float | None, float | None, int]:
  """(mean, sample std with ddof=1 or None for one value, n) of the
  non-None values."""
  vals = [float(v) for v in values if v is not None]
  if not vals:
    return None, None, 0
  sd = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
  return float(np.mean(vals)), sd, len(vals)


def paired_bootstrap(
  a, b, n_boot: int = N_BOOT, seed: int = 0, confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
  """(mean of b − a, low, high): a percentile bootstrap interval of the
  paired difference of two configs' per-problem scores.

  a, b: [S, P] scores of the same S seeds × P held-out problems (row s of
  both is seed s, whose problems are the same for both configs). Each
  bootstrap draw resamples S seeds with replacement, then P problems with
  replacement within each drawn seed, and averages b − a over the draw.
  The RNG is numpy's default_rng(seed): the same inputs give the same
  interval.
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.ndim != 2 or a.shape != b.shape or a.size == 0:
    raise ValueError(
      f"paired_bootstrap: a {a.shape} and b {b.shape} must be "
      "the same non-empty [seeds, problems] shape"
    )
  if not 0.0 < confidence < 1.0:
    raise ValueError(
      f"paired_bootstrap: confidence={confidence}; expected in (0, 1)"
    )
  d = b - a
  s, p = d.shape
  rng = np.random.default_rng(seed)
  seeds = rng.integers(0, s, size=(n_boot, s))
  probs = rng.integers(0, p, size=(n_boot, s, p))
  draws = d[seeds[:, :, None], probs].mean(axis=(1, 2))
  tail = (1.0 - confidence) / 2.0
  low, high = np.quantile(draws, [tail, 1.0 - tail])
  return float(d.mean()), float(low), float(high)


def verdict(
  low: float,
  high: float,
  kind: str,
  n_seeds: int,
  margin: float = MARGIN,
  min_seeds: int = MIN_SEEDS,
) -> tuple[str, str]:
  """(verdict, reason) of a claim from its interval of B − A (rule: the
  module docstring)."""
  if kind not in ("superiority", "non_inferiority"):
    raise ValueError(
      f"verdict: kind={kind!r}; expected 'superiority' or 'non_inferiority'"
    )
  if n_seeds < min_seeds:
    return (
      "not resolved at this scale",
      f"{n_seeds} paired seed(s); the rule needs >= {min_seeds}",
    )
  if kind == "superiority":
    if low > 0:
      return "supported", "the interval lies above 0"
    if high < margin:
      return "not supported", f"the interval excludes a gain of {margin:g}"
    return (
      "not resolved at this scale",
      f"the interval holds 0 and a gain of {margin:g}",
    )
  if low > -margin:
    return "supported", f"the interval excludes a loss of {margin:g}"
  if high < -margin:
    return "not supported", f"the interval lies below -{margin:g}"
  if high < 0:
    # B is worse than A, but whether by more than the margin is open.
    return (
      "not resolved at this scale",
      f"the interval lies below 0 and holds a loss of {margin:g}",
    )
  return (
    "not resolved at this scale",
    f"the interval holds both 0 and a loss of {margin:g}",
  )


def fmt(v, digits=3) -> str:
  if v is None or (isinstance(v, float) and not np.isfinite(v)):
    return "–"
  if isinstance(v, (int, np.integer)):
    return str(int(v))
  if abs(v) >= 100:
    return f"{v:.0f}"
  if abs(v) >= 10:
    return f"{v:.1f}"
  if abs(v) < 1e-2 and v != 0:
    return f"{v:.2e}"
  return f"{v:.{digits}f}"


def mean_std(values) -> tuple[float | None, float | None]:
  vals = [v for v in values if v is not None]
  if not vals:
    return None, None
  return float(np.mean(vals)), float(np.std(vals))
