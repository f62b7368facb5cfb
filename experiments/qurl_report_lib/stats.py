"""The statistics of the QuRL page: the readout, seed-level intervals and
tests, the Holm correction, the noise floor, and number formatting.

Readout. Per run, the held-out accuracy averaged over its last READOUT_K
evaluations (per problem: the mean of its `correct` over those
evaluations), on the run's held-out set (new studies: >= READOUT_PROBLEMS
problems). Archived runs kept per-problem records of their final
evaluation only: their readout is that one evaluation (256 problems), and
the page labels it so.

Per claim "B beats A" (superiority) or "B is no worse than A"
(non-inferiority): d_s = readout(B) − readout(A) on each seed s both arms
finished (the same seed evaluates both on the same problems). The primary
interval is seed-level: a t interval of the mean of d_s (n − 1 degrees of
freedom), or a BCa bootstrap over seeds once n >= BCA_MIN_SEEDS
(`seed_interval`). The bootstrap over seeds then problems
(`paired_bootstrap`) is printed beside it as a secondary column: it treats
problems as the unit and is narrower than the seeds allow.

Each claim is two one-sided tests of the mean of d_s (`claim_tests`):
  superiority      for: δ > 0          against: δ < MARGIN
  non-inferiority  for: δ > −MARGIN    against: δ < −MARGIN
  decrease         for: δ < 0          against: δ > 0   (no margin)
All the page's tests form one family; `holm` adjusts their p-values
(family-wise error ALPHA). `verdict_from_tests`: "supported" if the test
for is rejected at ALPHA after adjustment, "not supported" if the test
against is, else "not resolved at this scale"; fewer than MIN_SEEDS paired
seeds: "not resolved at this scale" without a test. With one claim on the
page this is the 95% two-sided interval's rule (each one-sided test at
0.025).

Noise floor. A perturbed A/A arm runs its twin's config with another
training-data order; `aa_spread` is the root mean square over seeds of
readout(A/A) − readout(twin): the size of a difference between two runs
of one config that nothing but a harmless perturbation separates. A
superiority or decrease claim whose |mean d_s| is inside it reads "within
noise" (`within_noise`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sp_stats

MIN_SEEDS = 3
MARGIN = 0.03  # accuracy (3 points): the smallest effect worth a claim
CONFIDENCE = 0.95
ALPHA = 1.0 - CONFIDENCE  # family-wise, over every test on the page
N_BOOT = 10_000
BCA_MIN_SEEDS = 10
READOUT_K = 4  # evaluations averaged per run (new studies)
READOUT_PROBLEMS = 1024  # held-out problems per run (new studies)
KINDS = ("superiority", "non_inferiority", "decrease")
WITHIN_NOISE = "within noise"

SUPPORTED, NOT_SUPPORTED = "supported", "not supported"
NOT_RESOLVED = "not resolved at this scale"


def sample_mean_std(values) -> tuple[float | None, float | None, int]:
  """(mean, sample std with ddof=1 or None for one value, n) of the
  non-None values."""
  vals = [float(v) for v in values if v is not None]
  if not vals:
    return None, None, 0
  sd = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
  return float(np.mean(vals)), sd, len(vals)


def _diffs(d, where: str, least: int = 1) -> np.ndarray:
  d = np.asarray(d, np.float64)
  if d.ndim != 1 or d.size < least or not np.all(np.isfinite(d)):
    raise ValueError(
      f"{where}: d {d.shape}; expected [seeds] of finite values, S >= {least}"
    )
  return d


def _check_confidence(confidence: float, where: str) -> None:
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"{where}: confidence={confidence}; expected in (0, 1)")


def t_interval(d, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
  """(mean, low, high): the two-sided t interval of the mean of the per-seed
  differences d: mean ± t_{1−(1−c)/2, n−1} · sd/√n (sd with ddof=1)."""
  d = _diffs(d, "t_interval", least=2)
  _check_confidence(confidence, "t_interval")
  n, mean = d.size, float(d.mean())
  if np.all(d == d[0]):
    return mean, mean, mean
  half = float(
    sp_stats.t.ppf(1.0 - (1.0 - confidence) / 2.0, n - 1)
    * d.std(ddof=1)
    / math.sqrt(n)
  )
  return mean, mean - half, mean + half


def t_pvalue(d, null: float, greater: bool) -> float:
  """One-sided p of the t test of the mean of d: H1 mean > null (greater)
  or mean < null. With no spread (every d equal) p is 0 or 1 (0.5 at the
  null itself)."""
  d = _diffs(d, "t_pvalue", least=2)
  diff = float(d.mean()) - null
  sd = 0.0 if np.all(d == d[0]) else float(d.std(ddof=1))
  if sd == 0.0:
    if diff == 0.0:
      return 0.5
    return 0.0 if (diff > 0) == greater else 1.0
  t = diff / (sd / math.sqrt(d.size))
  return float(sp_stats.t.sf(t if greater else -t, d.size - 1))


def _boot_means(d: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)


def _bca_constants(d: np.ndarray, means: np.ndarray) -> tuple[float, float]:
  """(z0, a): BCa's bias correction (the share of bootstrap means below the
  estimate, ties counted half) and acceleration (jackknife skewness)."""
  est = d.mean()
  share = (np.sum(means < est) + 0.5 * np.sum(means == est)) / means.size
  share = min(max(share, 0.5 / means.size), 1.0 - 0.5 / means.size)
  z0 = float(sp_stats.norm.ppf(share))
  jack = (d.sum() - d) / (d.size - 1)
  u = jack.mean() - jack
  den = 6.0 * float(np.sum(u * u)) ** 1.5
  a = float(np.sum(u**3)) / den if den > 0 else 0.0
  return z0, a


def bca_interval(
  d, confidence: float = CONFIDENCE, n_boot: int = N_BOOT, seed: int = 0
) -> tuple[float, float, float]:
  """(mean, low, high): Efron's bias-corrected and accelerated bootstrap
  interval of the mean of d, resampling seeds (numpy default_rng(seed)):
  the percentiles Φ(z0 + (z0 + z)/(1 − a(z0 + z))) of the bootstrap means
  at z = z_{(1−c)/2} and z_{(1+c)/2}."""
  d = _diffs(d, "bca_interval", least=2)
  _check_confidence(confidence, "bca_interval")
  means = _boot_means(d, n_boot, seed)
  z0, a = _bca_constants(d, means)
  tail = (1.0 - confidence) / 2.0
  qs = []
  for z in sp_stats.norm.ppf([tail, 1.0 - tail]):
    u = z0 + z
    qs.append(float(sp_stats.norm.cdf(z0 + u / (1.0 - a * u))))
  low, high = np.quantile(means, qs)
  return float(d.mean()), float(low), float(high)


def bca_pvalue(
  d, null: float, greater: bool, n_boot: int = N_BOOT, seed: int = 0
) -> float:
  """One-sided p of BCa (its achieved significance level): the α at which
  the one-sided BCa bound of level 1 − α reaches `null`; H1 mean > null
  (greater) or mean < null."""
  d = _diffs(d, "bca_pvalue", least=2)
  means = _boot_means(d, n_boot, seed)
  if np.all(means == means[0]):
    return t_pvalue(d, null, greater)  # no spread: the exact answer
  z0, a = _bca_constants(d, means)
  below = float(np.mean(means < null))
  below = min(max(below, 0.5 / n_boot), 1.0 - 0.5 / n_boot)
  w = float(sp_stats.norm.ppf(below)) - z0
  z = w / (1.0 + a * w) - z0  # solves Φ(z0 + (z0+z)/(1 − a(z0+z))) = below
  p_lower = float(sp_stats.norm.cdf(z))  # H1: mean > null
  return p_lower if greater else 1.0 - p_lower


def seed_interval(d, confidence: float = CONFIDENCE) -> dict:
  """The primary interval of a claim: {"method": "t" or "BCa", "mean",
  "low", "high"} of the per-seed differences d (BCa once
  len(d) >= BCA_MIN_SEEDS)."""
  d = _diffs(d, "seed_interval", least=2)
  bca = d.size >= BCA_MIN_SEEDS
  mean, low, high = (bca_interval if bca else t_interval)(d, confidence)
  return {
    "method": "BCa" if bca else "t",
    "mean": mean,
    "low": low,
    "high": high,
  }


def one_sided_p(d, null: float, greater: bool) -> float:
  """`t_pvalue`, or `bca_pvalue` once len(d) >= BCA_MIN_SEEDS."""
  d = _diffs(d, "one_sided_p", least=2)
  if d.size >= BCA_MIN_SEEDS:
    return bca_pvalue(d, null, greater)
  return t_pvalue(d, null, greater)


def claim_tests(d, kind: str, margin: float = MARGIN) -> dict[str, float]:
  """{"for": p, "against": p}: the claim's two one-sided tests (module
  docstring) on the per-seed differences d."""
  if kind not in KINDS:
    raise ValueError(f"claim_tests: kind={kind!r}; expected one of {KINDS}")
  if kind == "superiority":
    return {
      "for": one_sided_p(d, 0.0, greater=True),
      "against": one_sided_p(d, margin, greater=False),
    }
  if kind == "non_inferiority":
    return {
      "for": one_sided_p(d, -margin, greater=True),
      "against": one_sided_p(d, -margin, greater=False),
    }
  return {
    "for": one_sided_p(d, 0.0, greater=False),
    "against": one_sided_p(d, 0.0, greater=True),
  }


def holm(pvalues) -> list[float | None]:
  """Holm's step-down adjustment: the i-th smallest of m p-values becomes
  max over j <= i of min(1, (m − j + 1)·p_(j)); None entries (no test) stay
  None and do not count in m."""
  idx = [i for i, p in enumerate(pvalues) if p is not None]
  for i in idx:
    if not 0.0 <= pvalues[i] <= 1.0:
      raise ValueError(f"holm: p-value {pvalues[i]!r} at {i}; expected [0, 1]")
  out: list[float | None] = [None] * len(pvalues)
  m, running = len(idx), 0.0
  for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
    running = max(running, min(1.0, (m - rank) * pvalues[i]))
    out[i] = running
  return out


def _what(kind: str, margin: float) -> tuple[str, str]:
  if kind == "superiority":
    return "B − A > 0", f"B − A < {margin:g}"
  if kind == "non_inferiority":
    return f"B − A > −{margin:g}", f"B − A < −{margin:g}"
  return "B − A < 0", "B − A > 0"


def verdict_from_tests(
  p_for: float | None,
  p_against: float | None,
  kind: str,
  n_seeds: int,
  margin: float = MARGIN,
  alpha: float = ALPHA,
  min_seeds: int = MIN_SEEDS,
) -> tuple[str, str]:
  """(verdict, reason) from the claim's Holm-adjusted one-sided p-values
  (module docstring)."""
  if kind not in KINDS:
    raise ValueError(
      f"verdict_from_tests: kind={kind!r}; expected one of {KINDS}"
    )
  if n_seeds < min_seeds or p_for is None or p_against is None:
    return NOT_RESOLVED, (
      f"{n_seeds} paired seed(s); the rule needs >= {min_seeds}"
    )
  h_for, h_against = _what(kind, margin)
  if p_for <= alpha:
    return SUPPORTED, f"Holm p = {p_for:.2g} for {h_for}"
  if p_against <= alpha:
    return NOT_SUPPORTED, f"Holm p = {p_against:.2g} for {h_against}"
  return NOT_RESOLVED, (
    f"Holm p = {p_for:.2g} for {h_for}, {p_against:.2g} for {h_against}: "
    f"neither <= {alpha:g}"
  )


def aa_spread(per_seed) -> float:
  """Root mean square of the per-seed A/A differences (module docstring)."""
  d = _diffs(per_seed, "aa_spread")
  return float(np.sqrt(np.mean(d * d)))


def within_noise(delta: float, spread: float | None, kind: str) -> bool:
  """True if a superiority or decrease claim's mean difference is inside
  the A/A spread; a non-inferiority claim asserts a small difference, so it
  never is (its spread is printed, not applied)."""
  return (
    spread is not None and kind != "non_inferiority" and abs(delta) <= spread
  )


def paired_bootstrap(
  a, b, n_boot: int = N_BOOT, seed: int = 0, confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
  """(mean of b − a, low, high): a percentile bootstrap interval of the
  paired difference of two configs' per-problem scores (the page's
  secondary column).

  a, b: [S, P] scores of the same S seeds × P held-out problems (row s of
  both is seed s, whose problems are the same for both configs). Each
  bootstrap draw resamples S seeds with replacement, then P problems with
  replacement within each drawn seed, and averages b − a over the draw.
  The RNG is numpy's default_rng(seed): the same inputs give the same
  interval. With 3 seeds it spans about the seeds' min..max.
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.ndim != 2 or a.shape != b.shape or a.size == 0:
    raise ValueError(
      f"paired_bootstrap: a {a.shape} and b {b.shape} must be "
      "the same non-empty [seeds, problems] shape"
    )
  _check_confidence(confidence, "paired_bootstrap")
  d = b - a
  s, p = d.shape
  rng = np.random.default_rng(seed)
  seeds = rng.integers(0, s, size=(n_boot, s))
  probs = rng.integers(0, p, size=(n_boot, s, p))
  draws = d[seeds[:, :, None], probs].mean(axis=(1, 2))
  tail = (1.0 - confidence) / 2.0
  low, high = np.quantile(draws, [tail, 1.0 - tail])
  return float(d.mean()), float(low), float(high)


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
  _check_confidence(confidence, "seed_bootstrap")
  draws = _boot_means(d, n_boot, seed)
  tail = (1.0 - confidence) / 2.0
  low, high = np.quantile(draws, [tail, 1.0 - tail])
  return float(d.mean()), float(low), float(high)


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


def rule_lines(k: int = READOUT_K, problems: int = READOUT_PROBLEMS) -> list:
  """The verdict rules, printed once at the top of the page."""
  return [
    f"- **Readout.** Held-out greedy accuracy averaged over each run's last "
    f"{k} evaluations on >= {problems:,} held-out problems (new studies); "
    "archived runs kept per-problem records of their final evaluation only "
    "(256 problems), and their rows say `final eval`.",
    "- **Interval.** Per claim, d_s = readout(B) − readout(A) on each seed "
    f"both arms finished; {int(CONFIDENCE * 100)}% t interval of the mean "
    f"of d_s (BCa bootstrap over seeds from {BCA_MIN_SEEDS} seeds). The "
    "bootstrap over seeds then problems is printed beside it (secondary: it "
    "treats problems, not seeds, as the unit).",
    "- **Verdict.** Two one-sided tests per claim: superiority for B − A > 0 "
    f"and against B − A < {MARGIN:g}; non-inferiority for B − A > "
    f"−{MARGIN:g} and against B − A < −{MARGIN:g}; a decrease (KL slope) for "
    "B − A < 0 and against B − A > 0. Every test on the page is one family, "
    f"Holm-adjusted (family-wise error {ALPHA:g}): **supported** if the test "
    f"for is rejected, **not supported** if the test against is, else **"
    f"{NOT_RESOLVED}**; fewer than {MIN_SEEDS} paired seeds: {NOT_RESOLVED}, "
    "untested.",
    "- **Noise floor.** A perturbed A/A arm (the twin's config with another "
    "training-data order) gives the A/A spread: the root mean square over "
    "seeds of readout(A/A) − readout(twin). A superiority or decrease claim "
    f"whose |B − A| is inside it reads **{WITHIN_NOISE}**. A study without "
    "such an arm says **no noise floor measured**; a bit-identical A/A pair "
    "(deterministic ops) is not a floor.",
  ]


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
