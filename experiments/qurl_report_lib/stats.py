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


def ls_slope(x, y) -> float:
  """Least-squares slope of y on x: Σ(x − x̄)(y − ȳ) / Σ(x − x̄)²."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.ndim != 1 or x.shape != y.shape or x.size < 2:
    raise ValueError(
      f"ls_slope: x {x.shape} and y {y.shape} must be the same 1-D shape "
      "with >= 2 points"
    )
  dx = x - x.mean()
  if not np.any(dx):
    raise ValueError("ls_slope: every x is the same; the slope is undefined")
  return float(np.sum(dx * (y - y.mean())) / np.sum(dx * dx))


def seed_bootstrap(
  d, n_boot: int = N_BOOT, seed: int = 0, confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
  """(mean, low, high): percentile bootstrap interval of the mean of one
  paired difference per seed (d: [S]), resampling seeds with replacement;
  numpy's default_rng(seed). With S seeds there are at most S^S draws: the
  interval of 3 seeds is coarse (it spans their min..max at 95%)."""
  d = np.asarray(d, np.float64)
  if d.ndim != 1 or d.size == 0:
    raise ValueError(f"seed_bootstrap: d {d.shape}; expected [seeds], S >= 1")
  if not 0.0 < confidence < 1.0:
    raise ValueError(
      f"seed_bootstrap: confidence={confidence}; expected in (0, 1)"
    )
  rng = np.random.default_rng(seed)
  draws = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
  tail = (1.0 - confidence) / 2.0
  low, high = np.quantile(draws, [tail, 1.0 - tail])
  return float(d.mean()), float(low), float(high)


def decrease_verdict(
  low: float, high: float, n_seeds: int, min_seeds: int = MIN_SEEDS
) -> tuple[str, str]:
  """(verdict, reason) of "B − A < 0" from its interval (no margin was
  pre-registered for the KL slope, so none is used): supported if the
  interval lies below 0, not supported if above 0, else not resolved."""
  if n_seeds < min_seeds:
    return (
      "not resolved at this scale",
      f"{n_seeds} paired seed(s); the rule needs >= {min_seeds}",
    )
  if high < 0:
    return "supported", "the interval lies below 0"
  if low > 0:
    return "not supported", "the interval lies above 0"
  return "not resolved at this scale", "the interval holds 0"


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
