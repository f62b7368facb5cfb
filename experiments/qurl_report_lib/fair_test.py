"""Questions 6 and 7 beside the claims table: every verdict with the
exposure of the mechanism it is about, the noise floor of the machine, and
the pre-registered calibration of Q6.

Q6's readout was fixed before the runs (experiments/configs/q6_acr_fair.json,
`_comment`): per format, ACR − TIS in
  (1) the slope over steps of `behav_prox_kl` (least squares over the run's
      steps 1..run.steps, `kl_slope`), one difference per seed;
  (2) held-out accuracy (the claims table);
each gated by exposure: ACR's mean `acr_grad_share` below
gates.EXPOSURE_GATE reads "not exercised at this scale", with the share.
Both are read with the page's rule (stats: a seed-level interval, one-sided
tests Holm-adjusted with every other test on the page); readout (1) had no
margin pre-registered, so it is tested as a decrease below 0. The
calibration the same comment fixed (first 30 steps of seed 0: fp32's
clip_fraction_high in [0.2%, 2%], every TIS arm's tis_truncated_fraction
in [1%, 3%]) is recomputed from the run files; a TIS arm outside its range
marks its format's verdicts "C uncalibrated".

Q7's exposure is UAQ's: the fraction of quantized codes a weight sync
changes (`quant/quantized_change_fraction`) and the update / quantization
error ratio (QuRL Fig. 9), arm by arm.
"""

from __future__ import annotations

import os

import numpy as np

from qurl_report_lib import gates
from qurl_report_lib import stats
from qurl_report_lib.claim_list import SLOPE_QUESTIONS, UNCALIBRATED
from qurl_report_lib.claims import gpu_floor, noise_cell, with_aa_sources
from qurl_report_lib.gates import (
  CALIBRATION_STEPS,
  FP32_CLIP_HIGH,
  TIS_TRUNCATED,
  calibration,
)
from qurl_report_lib.stats import CONFIDENCE, fmt, ls_slope
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
  """Readout (1) of B − A (module docstring), before the page's Holm
  adjustment: the per-seed slope differences, their seed-level interval
  and raw one-sided tests (kind "decrease"), or the gate's verdict when
  ACR could not act; None if no seed has both runs finished with a slope."""
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
  row = {
    "a": a,
    "b": b,
    "kind": "decrease",
    "seeds": seeds,
    "per_seed": dict(zip(seeds, per_seed)),
    "slope_a": float(np.mean(slopes_a)),
    "slope_b": float(np.mean(slopes_b)),
    "delta": float(np.mean(per_seed)),
    "low": None,
    "high": None,
    "method": None,
    "p_raw": None,
  }
  if len(seeds) >= 2:
    interval = stats.seed_interval(per_seed)
    row.update(
      low=interval["low"], high=interval["high"], method=interval["method"]
    )
  runs = [
    (d, gates.effective_config(d))
    for seed in seeds
    for d in (study["runs"][a][seed], study["runs"][b][seed])
  ]
  gated = gates.acr_gate(runs)
  if gated is not None:
    row["verdict"], row["why"] = gated
  elif len(seeds) >= stats.MIN_SEEDS:
    row["p_raw"] = stats.claim_tests(per_seed, "decrease")
  return row


def slope_results(studies: dict, claims: list[dict]) -> list[dict]:
  """Readout (1) of every format of a study with one (a `<fmt>_tis` vs
  `<fmt>_acr` claim of a question in SLOPE_QUESTIONS), with its study."""
  out = []
  for name, study in with_aa_sources(studies).items():
    for c in claims:
      a, b = c["a"], c["b"]
      if c["study"] != name or c["question"] not in SLOPE_QUESTIONS:
        continue
      if not (a.endswith("_tis") and b.endswith("_acr")):
        continue
      row = slope_readout(study, a, b)
      if row is not None:
        out.append({**row, "study": name, "question": c["question"]})
  return out


def finish_slope(row: dict, studies: dict) -> None:
  """The slope readout's verdict from its Holm-adjusted p (`row["p"]`),
  then the GPU floor (a bit-identical A/A pair measures none)."""
  if "verdict" in row:
    return
  study = with_aa_sources(studies)[row["study"]]
  p = row.get("p") or {}
  v, why = stats.verdict_from_tests(
    p.get("for"), p.get("against"), "decrease", len(row["seeds"])
  )
  gpu = [s for s in row["seeds"] if s in study["gpu_seeds"]]
  if gpu and v in (stats.SUPPORTED, stats.NOT_SUPPORTED):
    floor = slope_aa_floor(study)
    gap = abs(float(np.mean([row["per_seed"][s] for s in gpu])))
    if floor is None:
      v, why = (
        gates.NOT_ATTRIBUTABLE,
        (
          f"GPU seeds {gpu} and no A/A pair on that machine: its run-to-run "
          "nondeterminism is unmeasured"
        ),
      )
    elif floor[0] == 0.0:
      why += (
        f"; no noise floor measured: the A/A pair ({floor[1]}) is "
        "bit-identical under deterministic ops"
      )
    elif gap <= floor[0]:
      v, why = (
        gates.NOT_ATTRIBUTABLE,
        (
          f"the gap {gap:.1e} (absolute B − A) is within the GPU run-to-run "
          f"floor {floor[0]:.1e} ({floor[1]})"
        ),
      )
    else:
      why += (
        f"; the gap {gap:.1e} (absolute B − A) exceeds the GPU run-to-run "
        f"floor {floor[0]:.1e} ({floor[1]})"
      )
  note = gates.calibration_note(study, row["a"])
  if note:
    v, why = v + UNCALIBRATED, f"{why}; C uncalibrated: {note}"
  row["verdict"], row["why"] = v, why


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
  if not study["gpu_seeds"]:
    return "Machine: CPU (bit-reproducible)."
  acc = gpu_floor(study)
  slope = slope_aa_floor(study)
  if acc is not None and acc[2] and slope is not None and slope[0] == 0.0:
    return (
      "No noise floor measured: the A/A pair of this machine "
      f"({acc[1]}) is bit-identical under deterministic ops, which says "
      "nothing about how far two harmlessly perturbed runs drift apart."
    )
  return (
    "GPU run-to-run floor (arms computing the same update on this "
    "machine): held-out accuracy, absolute B − A: "
    + (f"{acc[0]:.3f} ({acc[1]})" if acc else "**unmeasured**")
    + "; KL slope, absolute B − A: "
    + (f"{slope[0]:.1e} ({slope[1]})" if slope else "**unmeasured**")
    + "."
  )


def _ci(row: dict, spec: str) -> str:
  if row.get("low") is None:
    return "–"
  return f"[{row['low']:{spec}}, {row['high']:{spec}}] ({row['method']})"


def _holm(row: dict) -> str:
  p = row.get("p")
  return f"{p['for']:.2g} / {p['against']:.2g}" if p else "–"


# Exposure over time (Q9): per window of steps, the mean of each metric over
# the arm's seeds and steps (`ratio_mean` as its range over steps: the step
# mean of R inside the clip; max ρ as the largest).
_OVER_TIME = (
  ("behav_prox_kl", "behav–prox KL"),
  ("max_prox_behav_ratio", "max ρ"),
  ("tis_truncated_fraction", "ρ > C share"),
  ("acr_eligible_fraction", "eligible (ρ > C, A > 0)"),
  ("acr_grad_share", "ACR grad share"),
  ("acr_active_fraction", "ACR-active"),
  ("clip_fraction_high", "clip high"),
  ("ratio_mean", "R (step mean) range"),
)


def exposure_over_time(study: dict, arms, windows: int = 4) -> list[str]:
  """A table of each arm's exposure in `windows` equal windows of steps."""
  lines = [
    "| arm | steps | " + " | ".join(t for _, t in _OVER_TIME) + " |",
    "|---|---|" + "---|" * len(_OVER_TIME),
  ]
  for arm in arms:
    by_seed = study["runs"].get(arm, {})
    last = max(
      (s for d in by_seed.values() for s, _ in _rows(d, "behav_prox_kl")),
      default=0,
    )
    if not last:
      continue
    edges = np.linspace(0, last, windows + 1).round().astype(int)
    for lo, hi in zip(edges[:-1], edges[1:]):
      cells = []
      for key, _ in _OVER_TIME:
        vals = [
          v for d in by_seed.values() for s, v in _rows(d, key) if lo < s <= hi
        ]
        if not vals:
          cells.append("–")
        elif key == "ratio_mean":
          cells.append(f"{min(vals):.4f}–{max(vals):.4f}")
        elif key.startswith("max_"):
          cells.append(fmt(max(vals)))
        else:
          cells.append(fmt(float(np.mean(vals))))
      lines.append(f"| `{arm}` | {lo + 1}–{hi} | " + " | ".join(cells) + " |")
  return lines


def regime_check(study: dict, arm: str = "fp32") -> str:
  """Q9's registered check that fp32 kept improving: its readout (the
  mean of its last 4 evaluations) against its mean held-out accuracy at
  steps 400-500 of the run's 1,000, over the seeds that finished."""
  runs = study["runs"].get(arm, {})
  late, mid = [], []
  for run in runs.values():
    if not os.path.exists(os.path.join(run, "summary.json")):
      continue
    evals = [(r["step"], r["eval_accuracy"]) for r in _eval_rows(run)]
    middle = [a for s, a in evals if 400 <= s <= 500]
    last = [a for s, a in evals if s > 0][-stats.READOUT_K :]
    if middle and last:
      mid.append(float(np.mean(middle)))
      late.append(float(np.mean(last)))
  if not late:
    return f"Regime check (registered): no `{arm}` seed has finished."
  verdict = (
    "kept improving"
    if np.mean(late) > np.mean(mid)
    else "did not keep improving: the learning rate left the registered regime"
  )
  return (
    f"Regime check (registered): `{arm}` readout {np.mean(late):.3f} "
    f"against {np.mean(mid):.3f} at steps 400–500 ({len(late)} seeds): "
    f"{verdict}."
  )


def _q6_block(
  name: str, study: dict, rows: list[dict], slopes: list[dict], q: str = "6"
) -> list[str]:
  lines = [f"### Q{q} readout: `{name}`", ""]
  lines += _instrument_line(study)
  if q != "6":
    caps = sorted(
      {
        f"`{n}` C = {gates.effective_config(d).get('loss.tis_cap'):g}"
        for n, by_seed in study["runs"].items()
        for d in by_seed.values()
        if gates.effective_config(d).get("loss.correction") in ("tis", "acr")
      }
    )
    lines += [
      f"C fixed by the registered calibration before the study ran: "
      f"{', '.join(caps) or '–'}. Noise floor: {noise_cell(study)}. "
      + regime_check(study),
      "",
    ]
    lines += _rows_table(name, study, rows, slopes)
    lines += [
      "",
      f"Exposure over time ({', '.join(f'`{n}`' for n in study['runs'])}):",
      "",
    ]
    lines += exposure_over_time(study, list(study["runs"]))
    return lines + [""]
  cal = calibration(study)
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
  return lines + _rows_table(name, study, rows, slopes) + [""]


def _rows_table(
  name: str, study: dict, rows: list[dict], slopes: list[dict]
) -> list[str]:
  lines = [
    "| format | readout | A | B | seeds | slope A | slope B | B − A | "
    f"{int(CONFIDENCE * 100)}% CI (seeds) | Holm p for / against | verdict "
    "| why | ACR grad share | ACR-active | TIS-truncated (A, all steps) |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for row in rows:
    a, b = row["a"], row["b"]
    if not (a.endswith("_tis") and b.endswith("_acr")):
      continue
    fmt_name = a.rpartition("_")[0]
    readout = next(
      (r for r in slopes if (r["study"], r["a"], r["b"]) == (name, a, b)), None
    )
    seeds = row.get("seeds") or (readout or {}).get("seeds") or []
    share, active = _exposure_cells(study, b, seeds) if seeds else ("–", "–")
    truncated = fmt(_mean_metric(study, a, seeds, "tis_truncated_fraction"))
    tail = f" | {share} | {active} | {truncated} |"
    if readout is not None:
      lines.append(
        f"| {fmt_name} | KL slope /step | `{a}` | `{b}` | "
        f"{len(readout['seeds'])} | {readout['slope_a']:.2e} | "
        f"{readout['slope_b']:.2e} | {readout['delta']:+.2e} | "
        f"{_ci(readout, '+.2e')} | {_holm(readout)} | "
        f"**{readout['verdict']}** | {readout['why']}" + tail
      )
    if row.get("delta") is not None:
      lines.append(
        f"| {fmt_name} | held-out ({row['readout']}) | `{a}` | `{b}` | "
        f"{len(row['seeds'])} | – | – | {row['delta']:+.3f} | "
        f"{_ci(row, '+.3f')} | {_holm(row)} | **{row['verdict']}** | "
        f"{row['why']}" + tail
      )
  return lines


def _q7_block(name: str, study: dict, rows: list[dict]) -> list[str]:
  lines = [f"### Q7 readout: `{name}`", ""]
  lines += _instrument_line(study)
  lines += [_floor_line(study), ""]
  lines += [
    "| claim | A | B | seeds | B − A | "
    f"{int(CONFIDENCE * 100)}% CI (seeds) | verdict | UAQ s A/B | "
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
      f"{row['delta']:+.3f} | {_ci(row, '+.3f')} | "
      f"**{row['verdict']}** ({row['why']}) | {row['uaq']} | "
      f"{pair('quant/quantized_change_fraction')} | "
      f"{pair('quant/update_to_quant_error')} | {held(a)} / {held(b)} |"
    )
  return lines + [""]


def _eval_rows(run_dir: str) -> list[dict]:
  from rljax.train.metrics import read_metrics

  return [r for r in read_metrics(run_dir) if "eval_accuracy" in r]


def fair_test_section(
  studies: dict, claims: list[dict], slopes: list[dict]
) -> list[str]:
  """Q6's and Q7's readouts, one block per study that has claims of theirs
  (claims, slopes: the finished rows of family.page)."""
  lines = []
  for name, study in with_aa_sources(studies).items():
    rows = [c for c in claims if c["study"] == name]
    questions = {c["question"] for c in rows}
    if "6" in questions:
      q6 = [c for c in rows if c["question"] == "6"]
      lines += _q6_block(name, study, q6, slopes)
    if "9" in questions:
      q9 = [c for c in rows if c["question"] == "9"]
      lines += _q6_block(name, study, q9, slopes, q="9")
    if "7" in questions:
      lines += _q7_block(name, study, [c for c in rows if c["question"] == "7"])
  return lines
