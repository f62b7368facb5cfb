"""Questions 6 and 7 beside the claims table (issue 44): every verdict with
the exposure of the mechanism it is about, the A/A floor of the machine, and
the pre-registered calibration of Q6.

Q6's readout was fixed before the runs (experiments/configs/q6_acr_fair.json,
`_comment`): per format, ACR − TIS in
  (1) the slope over steps of `behav_prox_kl` (least squares over the run's
      steps 1..run.steps, `kl_slope`), averaged over seeds, with a bootstrap
      interval resampling seeds (`stats.seed_bootstrap`);
  (2) final held-out accuracy (the claims table: `stats.paired_bootstrap`
      and `stats.verdict`);
each gated by exposure: ACR's mean `acr_grad_share` below
gates.EXPOSURE_GATE reads "not exercised at this scale", with the share.
Readout (1) had no margin pre-registered, so its verdict takes none
(`stats.decrease_verdict`). The calibration the same comment fixed (first
30 steps of seed 0: fp32's clip_fraction_high in [0.2%, 2%], every TIS arm's
tis_truncated_fraction in [1%, 3%]) is recomputed from the run files; a TIS
arm outside its range marks its format's verdicts "C uncalibrated".

Q7's exposure is UAQ's: the fraction of quantized codes a weight sync
changes (`quant/quantized_change_fraction`) and the update / quantization
error ratio (QuRL Fig. 9), arm by arm.
"""

from __future__ import annotations

import os

import numpy as np

from qurl_report_lib import gates
from qurl_report_lib.claim_list import UNCALIBRATED
from qurl_report_lib.claims import aa_floor, with_aa_sources
from qurl_report_lib.gates import (
  CALIBRATION_STEPS,
  FP32_CLIP_HIGH,
  TIS_TRUNCATED,
  calibration,
)
from qurl_report_lib.stats import (
  CONFIDENCE,
  decrease_verdict,
  fmt,
  ls_slope,
  seed_bootstrap,
)
from qurl_report_lib.studies import read_json

KL_KEY = "behav_prox_kl"


_rows = gates.metric_rows


def kl_slope(run_dir: str) -> float | None:
  """Least-squares slope over steps of the run's behav_prox_kl, over steps
  1..run.steps (None with fewer than two logged steps)."""
  last = gates.effective_config(run_dir).get("run.steps")
  pts = _rows(run_dir, KL_KEY, int(last) if last else None)
  if len({s for s, _ in pts}) < 2:
    return None
  steps, values = zip(*pts)
  return ls_slope(steps, values)


def _pairs(study: dict, a: str, b: str) -> list[int]:
  ra, rb = study["runs"].get(a, {}), study["runs"].get(b, {})
  return sorted(
    s
    for s in set(ra) & set(rb)
    if os.path.exists(os.path.join(ra[s], "summary.json"))
    and os.path.exists(os.path.join(rb[s], "summary.json"))
  )


def slope_aa_floor(study: dict) -> tuple[float, str] | None:
  """(largest |slope difference|, which pair) over the A/A pairs of the
  study's GPU seeds (gates.same_update), else those of its aa_source."""
  found = []
  names = list(study["runs"])
  for i, x in enumerate(names):
    for y in names[i + 1 :]:
      for seed in _pairs(study, x, y):
        if seed not in study["gpu_seeds"]:
          continue
        rx, ry = study["runs"][x][seed], study["runs"][y][seed]
        if gates.same_update(rx, ry):
          sx, sy = kl_slope(rx), kl_slope(ry)
          if sx is not None and sy is not None:
            found.append((abs(sy - sx), f"`{x}` vs `{y}`, seed {seed}"))
  if found:
    return max(found)
  source = study.get("aa_source")
  if source is not None:
    other = slope_aa_floor(source[1])
    if other is not None:
      return other[0], f"{other[1]} of `{source[0]}`"
  return None


def slope_readout(study: dict, a: str, b: str) -> dict | None:
  """Readout (1) of B − A (module docstring), gated; None if no seed has
  both runs finished with a slope."""
  seeds, per_seed, slopes_a, slopes_b = [], [], [], []
  for seed in _pairs(study, a, b):
    sa = kl_slope(study["runs"][a][seed])
    sb = kl_slope(study["runs"][b][seed])
    if sa is None or sb is None:
      continue
    seeds.append(seed)
    slopes_a.append(sa)
    slopes_b.append(sb)
    per_seed.append(sb - sa)
  if not seeds:
    return None
  delta, low, high = seed_bootstrap(per_seed)
  v, why = decrease_verdict(low, high, len(seeds))
  runs = [
    (d, gates.effective_config(d))
    for seed in seeds
    for d in (study["runs"][a][seed], study["runs"][b][seed])
  ]
  gated = gates.acr_gate(runs)
  if gated is not None:
    v, why = gated
  gpu = [s for s in seeds if s in study["gpu_seeds"]]
  if gated is None and gpu and v in ("supported", "not supported"):
    floor = slope_aa_floor(study)
    gap = abs(float(np.mean([d for s, d in zip(seeds, per_seed) if s in gpu])))
    if floor is None:
      v, why = (
        gates.NOT_ATTRIBUTABLE,
        (
          f"GPU seeds {gpu} and no A/A pair on that machine: its run-to-run "
          "nondeterminism is unmeasured"
        ),
      )
    elif gap <= floor[0]:
      v, why = (
        gates.NOT_ATTRIBUTABLE,
        (
          f"the gap {gap:.1e} (absolute B − A) is within the A/A floor "
          f"{floor[0]:.1e} "
          f"({floor[1]})"
        ),
      )
    else:
      why += (
        f"; the gap {gap:.1e} (absolute B − A) exceeds the A/A floor "
        f"{floor[0]:.1e} ({floor[1]})"
      )
  return {
    "seeds": seeds,
    "slope_a": float(np.mean(slopes_a)),
    "slope_b": float(np.mean(slopes_b)),
    "delta": delta,
    "low": low,
    "high": high,
    "verdict": v,
    "why": why,
  }


def _exposure_cells(study: dict, name: str, seeds) -> tuple[str, str]:
  exp = [gates.exposure(study["runs"][name][s]) for s in seeds]
  share = [e["grad_share"] for e in exp if e["grad_share"] is not None]
  active = [e["acr_active"] for e in exp if e["acr_active"] is not None]
  return (
    fmt(float(np.mean(share))) if share else "not logged",
    fmt(float(np.mean(active))) if active else "not logged",
  )


def _mean_metric(study: dict, name: str, seeds, key: str):
  vals = [v for s in seeds for _, v in _rows(study["runs"][name][s], key)]
  return float(np.mean(vals)) if vals else None


def _instrument_line(study: dict) -> list[str]:
  dirs = study["dir"].split("+")
  rec = read_json(os.path.join(dirs[0], "instrument.json"), None)
  if not rec:
    return []
  return [
    f"Instrument of this study (its `instrument.json`): SFT "
    f"{rec.get('steps')} steps, held-out accuracy {fmt(rec.get('accuracy'))}"
    " — trained on the study's machine, not the archived "
    "`docs/qurl/runs/instrument.json`.",
    "",
  ]


def _floor_line(study: dict) -> str:
  acc = aa_floor(study)
  slope = slope_aa_floor(study)
  if not study["gpu_seeds"]:
    return "Machine: CPU (bit-reproducible); no A/A floor is needed."
  return (
    "A/A floor (arms computing the same update on this machine): final "
    "held-out accuracy, absolute B − A: "
    + (f"{acc[0]:.3f} ({acc[1]})" if acc else "**unmeasured**")
    + "; KL slope, absolute B − A: "
    + (f"{slope[0]:.1e} ({slope[1]})" if slope else "**unmeasured**")
    + "."
  )


def _q6_block(name: str, study: dict, rows: list[dict]) -> list[str]:
  cal = calibration(study)
  lines = [f"### Q6 readout: `{name}`", ""]
  lines += _instrument_line(study)
  pre = (
    f"Calibration (pre-registered; first {CALIBRATION_STEPS} steps of "
    "the first seed): "
  )
  if cal["fp32"] is None:
    pre += "no fp32 arm in this study; "
  else:
    v, ok = cal["fp32"]
    pre += (
      f"fp32 clip_fraction_high {fmt(v)} (range {FP32_CLIP_HIGH[0]:g}–"
      f"{FP32_CLIP_HIGH[1]:g}: {'OK' if ok else 'FAILED'}); "
    )
  pre += "; ".join(
    f"`{arm}` (C = {cap:g}) truncates {fmt(v)} of tokens (range "
    f"{TIS_TRUNCATED[0]:g}–{TIS_TRUNCATED[1]:g}: {'OK' if ok else 'FAILED'})"
    for arm, (v, ok, cap) in cal["tis"].items()
  )
  lines += [pre + ".", "", _floor_line(study), ""]
  lines += [
    "| format | readout | A | B | seeds | slope A | slope B | B − A | "
    f"{int(CONFIDENCE * 100)}% CI | verdict | why | ACR grad share | "
    "ACR-active | TIS-truncated (A, all steps) |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for row in rows:
    a, b = row["a"], row["b"]
    if not (a.endswith("_tis") and b.endswith("_acr")):
      continue
    fmt_name = a.rpartition("_")[0]
    # The claims table marks its own rows (claim_list.PREREGISTERED).
    note = gates.calibration_note(study, a)
    mark = UNCALIBRATED if note else ""
    readout = slope_readout(study, a, b)
    seeds = row.get("seeds") or (readout or {}).get("seeds") or []
    share, active = _exposure_cells(study, b, seeds) if seeds else ("–", "–")
    truncated = fmt(_mean_metric(study, a, seeds, "tis_truncated_fraction"))
    tail = f" | {share} | {active} | {truncated} |"
    if readout is not None:
      lines.append(
        f"| {fmt_name} | KL slope /step | `{a}` | `{b}` | "
        f"{len(readout['seeds'])} | {readout['slope_a']:.2e} | "
        f"{readout['slope_b']:.2e} | {readout['delta']:+.2e} | "
        f"[{readout['low']:+.2e}, {readout['high']:+.2e}] | "
        f"**{readout['verdict']}{mark}** | {readout['why']}"
        + (f"; C uncalibrated: {note}" if note else "")
        + tail
      )
    if row.get("delta") is not None:
      lines.append(
        f"| {fmt_name} | final held-out | `{a}` | `{b}` | "
        f"{len(row['seeds'])} | – | – | {row['delta']:+.3f} | "
        f"[{row['low']:+.3f}, {row['high']:+.3f}] | "
        f"**{row['verdict']}** | {row['why']}" + tail
      )
  return lines + [""]


def _q7_block(name: str, study: dict, rows: list[dict]) -> list[str]:
  lines = [f"### Q7 readout: `{name}`", ""]
  lines += _instrument_line(study)
  lines += [_floor_line(study), ""]
  lines += [
    "| claim | A | B | seeds | B − A | "
    f"{int(CONFIDENCE * 100)}% CI | verdict | UAQ s A/B | "
    "codes changed / sync A/B | update / quant error A/B | "
    "held-out before → final A/B |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for row in rows:
    a, b, seeds = row["a"], row["b"], row.get("seeds") or []
    if not seeds:
      lines.append(
        f"| {row['claim']} | `{a}` | `{b}` | 0 | – | – | "
        f"**{row['verdict']}** | – | – | – | – |"
      )
      continue

    def pair(key, a=a, b=b, seeds=seeds):
      return " / ".join(fmt(_mean_metric(study, n, seeds, key)) for n in (a, b))

    def held(n, seeds=seeds):
      evals = [
        [
          float(r["eval_accuracy"])
          for r in _eval_rows(study["runs"][n][s])
          if "eval_accuracy" in r
        ]
        for s in seeds
      ]
      first = np.mean([e[0] for e in evals if e])
      last = np.mean([e[-1] for e in evals if e])
      return f"{first:.3f} → {last:.3f}"

    lines.append(
      f"| {row['claim']} | `{a}` | `{b}` | {len(seeds)} | "
      f"{row['delta']:+.3f} | [{row['low']:+.3f}, {row['high']:+.3f}] | "
      f"**{row['verdict']}** ({row['why']}) | {row['uaq']} | "
      f"{pair('quant/quantized_change_fraction')} | "
      f"{pair('quant/update_to_quant_error')} | {held(a)} / {held(b)} |"
    )
  return lines + [""]


def _eval_rows(run_dir: str) -> list[dict]:
  from rljax.train.metrics import read_metrics

  return [r for r in read_metrics(run_dir) if "eval_accuracy" in r]


def fair_test_section(studies: dict, claims: list[dict]) -> list[str]:
  """Q6's and Q7's readouts, one block per study that has claims of theirs
  (claims: the rows of claims.claims_section)."""
  lines = []
  for name, study in with_aa_sources(studies).items():
    rows = [c for c in claims if c["study"] == name]
    questions = {c["question"] for c in rows}
    if "6" in questions:
      lines += _q6_block(name, study, [c for c in rows if c["question"] == "6"])
    if "7" in questions:
      lines += _q7_block(name, study, [c for c in rows if c["question"] == "7"])
  return lines
