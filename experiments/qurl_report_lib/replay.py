"""The mechanism replay's analysis (experiments/qurl_replay.py) and its
section of docs/qurl_results.md: per metric, the mean ± std over frozen
batches of each correction and the paired ACR − TIS difference with a 95%
bootstrap interval over batches, the verdicts gated by ACR's exposure, and
the page's tables rendered from archived `replay.json` files (nothing typed
by hand)."""

from __future__ import annotations

import json
import os

import numpy as np

from qurl_report_lib import stats

CORRECTIONS = ("tis", "acr")
EXPOSURE = ("acr_grad_share", "acr_would_change_fraction")
METRICS = (
  "acr_grad_share",
  "acr_would_change_fraction",
  "acr_active_given_eligible",
  "clip_fraction_high",
  "dlogp_eligible",
  "dlogp_all",
  "kl_after",
)
# Below this mean gradient share ACR is not exercised (q6's readout rule).
EXPOSED_SHARE = 1e-3


def summarize(per_batch: list[dict]) -> dict:
  """Per metric: mean ± std over batches per correction, and the paired
  ACR − TIS difference with a 95% bootstrap interval over batches."""
  summary = {}
  for m in METRICS:
    pairs = [
      (b["tis"][m], b["acr"][m])
      for b in per_batch
      if b["tis"][m] is not None and b["acr"][m] is not None
    ]
    entry = {}
    for i, corr in enumerate(CORRECTIONS):
      mean, sd, n = stats.sample_mean_std([p[i] for p in pairs])
      entry[corr] = {"mean": mean, "std": sd, "n": n}
    d = [a - t for t, a in pairs]
    mean, sd, n = stats.sample_mean_std(d)
    low = high = mean
    if n > 1:
      t = np.asarray([[p[0] for p in pairs]])
      a = np.asarray([[p[1] for p in pairs]])
      mean, low, high = stats.paired_bootstrap(t, a)
    entry["acr_minus_tis"] = {
      "mean": mean,
      "std": sd,
      "low": low,
      "high": high,
      "n": n,
    }
    summary[m] = entry
  return summary


def verdicts(summary: dict) -> dict:
  """The mechanism's reading, gated by ACR's exposure."""
  share = summary["acr_grad_share"]["acr"]["mean"] or 0.0
  out = {"acr_grad_share": share, "exposed": share >= EXPOSED_SHARE}
  for m, what in (
    ("dlogp_eligible", "ACR raises log π on (ρ > C, A > 0) tokens"),
    ("kl_after", "ACR raises the re-quantized behaviour–proximal KL"),
  ):
    d = summary[m]["acr_minus_tis"]
    if not out["exposed"]:
      v = f"not exercised at this scale (ACR grad share {share:.2e})"
    elif d["n"] < 2:
      v = "not resolved (fewer than 2 batches)"
    elif d["low"] > 0:
      v = "supported (interval above 0)"
    elif d["high"] < 0:
      v = "reversed (interval below 0)"
    else:
      v = "not resolved (interval holds 0)"
    out[m] = {"claim": what, "verdict": v}
  return out


def table(result: dict) -> str:
  f = stats.fmt
  lines = [
    "| metric | TIS mean ± std | ACR mean ± std | ACR − TIS [95% CI] |",
    "|---|---|---|---|",
  ]
  for m, e in result["summary"].items():
    t, a, d = e["tis"], e["acr"], e["acr_minus_tis"]
    lines.append(
      f"| {m} | {f(t['mean'])} ± {f(t['std'])} | {f(a['mean'])} ± "
      f"{f(a['std'])} | {f(d['mean'])} [{f(d['low'])}, {f(d['high'])}] |"
    )
  pb = result["per_batch"]
  lines.append("")
  for key, what in (
    ("kl_rollout", "the rollouts' behav_prox_kl: engine vs θ"),
    ("kl_before", "at θ, computed as kl_after"),
  ):
    mean, sd, _ = stats.sample_mean_std([b[key] for b in pb])
    lines.append(f"{key} ({what}): {f(mean)} ± {f(sd)}")
  share = [b["n_eligible"] / max(b["n_valid"], 1) for b in pb]
  lines.append(
    f"eligible tokens (ρ > C, A > 0) / valid: {f(float(np.mean(share)))}"
  )
  v = result["verdict"]
  lines.append(
    f"exposure: ACR grad share {v['acr_grad_share']:.3e} "
    f"({'at or above' if v['exposed'] else 'below'} the {EXPOSED_SHARE:g} gate)"
  )
  for m in ("dlogp_eligible", "kl_after"):
    lines.append(f"{v[m]['claim']}: {v[m]['verdict']}")
  return "\n".join(lines)


def plot(result: dict, path: str) -> bool:
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  pts = [
    (
      b["acr"]["acr_grad_share"],
      b["acr"]["dlogp_eligible"] - b["tis"]["dlogp_eligible"],
    )
    for b in result["per_batch"]
    if b["acr"]["dlogp_eligible"] is not None
  ]
  fig, ax = plt.subplots(figsize=(5, 3.5))
  if pts:
    ax.scatter(*zip(*pts), s=18)
  ax.axhline(0.0, color="grey", lw=0.8)
  ax.set_xlabel("ACR gradient share (mean over K updates)")
  ax.set_ylabel("ACR − TIS: Δ log π on ρ > C, A > 0")
  c = result["config"]
  ax.set_title(f"{c['quant']}, C = {c['cap']:g}, K = {c['minibatches']}")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def page_section(paths) -> list[str]:
  """One block per archived replay.json: its setting, machine and time,
  the table, and the verdicts, all read from the file."""
  lines = [
    "Generated from the archived `replay.json` files of "
    "`experiments/qurl_replay.py` (docs/qurl/replay.md: what the replay "
    "does and what each metric means). Verdicts: below a mean ACR gradient "
    f"share of {EXPOSED_SHARE:g} every reading is not exercised; otherwise "
    "an ACR − TIS interval over batches above 0 is supported, below 0 "
    "reversed, else not resolved. One seed of one instrument: the size and "
    "sign of the mechanism, not a verdict on ACR's end effect. These "
    "readings are descriptive: their unit is the batch, not the seed, and "
    "they are not in the page's Holm family.",
    "",
  ]
  for path in paths:
    with open(path) as f:
      result = json.load(f)
    c, m = result["config"], result.get("machine", {})
    inst = result.get("instrument", {})
    start = (
      f"θ and Adam state of RL run `{os.path.basename(c['init_run_dir'])}`"
      if c.get("init_run_dir")
      else "SFT θ, fresh Adam"
    )
    lines += [
      f"### {c['quant'].upper()}, C = {c['cap']:g}, K = {c['minibatches']}, "
      f"{start} (`{os.path.relpath(path)}`)",
      "",
      f"{c['batches']} batches × {c['rows_per_batch']} samples, lr "
      f"{c['learning_rate']:g}, T {c['temperature']:g}; instrument: SFT "
      f"{inst.get('steps')} steps, held-out {stats.fmt(inst.get('accuracy'))}"
      f"; {m.get('cpu', m.get('backend', '?'))}, {m.get('cpus', '?')} cores"
      f"{', ' + result['date'] if result.get('date') else ''}; "
      f"{result['seconds']['total']:.0f} s.",
      "",
      table(result),
      "",
    ]
  return lines
