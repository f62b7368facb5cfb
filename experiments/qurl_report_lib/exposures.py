"""The exposure column of the claims table: for each claim, how far the
mechanism it is about acted in each arm (A → B), read from the runs'
metrics: ACR's gradient share, the behaviour–proximal distance of a
quantized rollout, UAQ's visibility, a stale rollout's lag."""

from __future__ import annotations

import numpy as np

from qurl_report_lib import gates
from qurl_report_lib.claim_list import LAG, LR, Q, U
from qurl_report_lib.studies import run_quant_curves


def _arm_mean(study: dict, name: str, seeds, key: str) -> float | None:
  vals = [
    v for s in seeds for _, v in gates.metric_rows(study["runs"][name][s], key)
  ]
  return float(np.mean(vals)) if vals else None


def _arm_max(study: dict, name: str, seeds, key: str) -> float | None:
  vals = [
    v for s in seeds for _, v in gates.metric_rows(study["runs"][name][s], key)
  ]
  return max(vals) if vals else None


def _pair(fn, study, a, b, seeds, key, spec) -> str:
  x, y = (fn(study, n, seeds, key) for n in (a, b))
  show = lambda v: "–" if v is None else format(v, spec)  # noqa: E731
  return f"{show(x)} → {show(y)}"


def quant_exposure(study: dict, a: str, b: str, seeds) -> str:
  """How far each arm's rollouts were from its learner (A → B): mean
  behaviour–proximal KL, largest ρ = π_prox/π_behav, and the share of
  tokens whose ρ exceeded the cap (TIS truncates them)."""
  return (
    f"behav–prox KL {_pair(_arm_mean, study, a, b, seeds, 'behav_prox_kl', '.1e')}"
    f", max ρ {_pair(_arm_max, study, a, b, seeds, 'max_prox_behav_ratio', '.3g')}"
    ", ρ > C share "
    f"{_pair(_arm_mean, study, a, b, seeds, 'tis_truncated_fraction', '.1e')}"
  )


def _visibility(study: dict, a: str, b: str, seeds) -> str:
  """UAQ's exposure: the share of INT8/FP8 codes a sync changes and the
  update-to-quant-error ratio (QuRL Fig. 9), A → B; '' if not logged."""
  keys = (
    ("quant/quantized_change_fraction", "codes changed / sync"),
    ("quant/update_to_quant_error", "update / quant error"),
  )
  parts = []
  for key, label in keys:
    means = []
    for arm in (a, b):
      vals = [run_quant_curves(study["runs"][arm][s])[key] for s in seeds]
      vals = [x for x in vals if x is not None]
      means.append(float(np.mean(vals)) if vals else None)
    if None not in means:
      parts.append(f"{label} {means[0]:.2e} → {means[1]:.2e}")
  return ", ".join(parts)


# π_behav = π_prox up to float rounding: the fp32 engine's cached decode and the
# trainer's full forward pass of the same weights differ only in rounding.
RHO_ONE_KL, RHO_ONE_TOL = 1e-9, 1e-4


def _arm_lag(study: dict, name: str, seeds) -> dict:
  keys = ("version_lag_mean", "version_lag_max", "behav_prox_kl")
  keys += ("max_prox_behav_ratio", "clip_fraction", "version_mixed_fraction")
  vals = {
    k: [
      x for s in seeds for _, x in gates.metric_rows(study["runs"][name][s], k)
    ]
    for k in keys
  }
  if not vals["version_lag_max"]:
    return {}
  mixed = vals["version_mixed_fraction"]
  return {
    "lag_mean": float(np.mean(vals["version_lag_mean"])),
    "lag_max": max(vals["version_lag_max"]),
    "kl": float(np.mean(vals["behav_prox_kl"] or [0.0])),
    "max_rho": max(vals["max_prox_behav_ratio"] or [1.0]),
    "clip": float(np.mean(vals["clip_fraction"] or [0.0])),
    "mixed": float(np.mean(mixed)) if mixed else None,
  }


def _lag_exposure(study: dict, a: str, b: str, seeds) -> str:
  """Staleness exposure of a claim whose arms ran off-policy: each arm's
  version lag, behav–prox distance, clipped share and (streaming) share of
  responses that spanned a weight swap, A → B; '' when neither ran stale."""
  configs = [
    gates.effective_config(study["runs"][n][s]) for n in (a, b) for s in seeds
  ]
  if all(c.get("run.async_mode", "off") == "off" for c in configs):
    return ""
  arms = [_arm_lag(study, n, seeds) for n in (a, b)]
  if not all(arms):
    return ""
  x, y = arms
  text = (
    f"version lag mean/max {x['lag_mean']:.2f}/{x['lag_max']:g} → "
    f"{y['lag_mean']:.2f}/{y['lag_max']:g}, behav–prox KL {x['kl']:.1e} → "
    f"{y['kl']:.1e}, max ρ {x['max_rho']:.3g} → {y['max_rho']:.3g}, clipped "
    f"tokens {x['clip']:.1e} → {y['clip']:.1e}"
  )
  if x["mixed"] is not None or y["mixed"] is not None:
    show = lambda v: "–" if v is None else f"{v:.1e}"  # noqa: E731
    text += f", mixed-version responses {show(x['mixed'])} → {show(y['mixed'])}"
  one_update = all(gates.updates_per_rollout(c) == 1 for c in configs)
  idle = [
    n
    for n, arm in zip((a, b), arms)
    if arm["lag_max"] == 0
    and arm["kl"] < RHO_ONE_KL
    and arm["max_rho"] < 1.0 + RHO_ONE_TOL
  ]
  if idle and one_update:
    text += (
      f"; `{'`, `'.join(idle)}` at lag 0: ρ = 1 to float precision and one "
      "update per rollout (R ≡ 1), so no correction can act there"
    )
  return text


def exposure(study: dict, row: dict, named) -> str:
  """The exposure beside a claim: of the mechanism its arms differ in."""
  a, b, seeds = row["a"], row["b"], row["seeds"]
  parts = []
  configs = [
    gates.effective_config(study["runs"][n][s]) for n in (a, b) for s in seeds
  ]
  corrections = {c.get("loss.correction") for c in configs}
  if tuple(named) == ("loss.correction",) and corrections == {"tis", "acr"}:
    acr = [
      gates.exposure(study["runs"][n][s])
      for n in (a, b)
      for s in seeds
      if gates.effective_config(study["runs"][n][s])["loss.correction"] == "acr"
    ]
    shares = [e["grad_share"] for e in acr if e["grad_share"] is not None]
    active = [e["acr_active"] for e in acr if e["acr_active"] is not None]
    parts.append(
      "ACR grad share "
      + (f"{np.mean(shares):.1e}" if shares else "not logged")
      + ", ACR-active "
      + (f"{np.mean(active):.1e}" if active else "not logged")
      + " of tokens"
    )
  if Q in named or any(
    c.get("rollout.quant") in gates.QUANTIZED for c in configs
  ):
    parts.append(quant_exposure(study, a, b, seeds))
  if U in named or LR in named:
    parts.append(_visibility(study, a, b, seeds))
  if set(named) & (set(LAG) | {"loss.correction"}):
    parts.append(_lag_exposure(study, a, b, seeds))
  return "; ".join(p for p in parts if p) or "–"
