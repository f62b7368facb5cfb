"""The claims table: the claims each question makes (which configs of which
study, superiority or non-inferiority), and the verdict of each from the
paired bootstrap of final held-out accuracy."""

from __future__ import annotations

import numpy as np

from qurl_report_lib import gates
from qurl_report_lib.claim_list import (
  AA_FROM,
  CLAIMS,
  LAG,
  LR,
  PREREGISTERED,
  U,
  UNCALIBRATED,
)
from qurl_report_lib.stats import (
  CONFIDENCE,
  MARGIN,
  MIN_SEEDS,
  N_BOOT,
  paired_bootstrap,
  verdict,
)
from qurl_report_lib.studies import final_scores, run_quant_curves


def compare(study: dict, a: str, b: str) -> dict | None:
  """Paired bootstrap of final accuracy B − A over the seeds both finished
  (problems matched by uid); None if there is no such seed. `per_seed`:
  each seed's mean B − A."""
  ra, rb = study["runs"].get(a, {}), study["runs"].get(b, {})
  rows_a, rows_b, seeds = [], [], []
  for seed in sorted(set(ra) & set(rb)):
    sa, sb = final_scores(ra[seed]), final_scores(rb[seed])
    if not sa or not sb:
      continue
    uids = sorted(set(sa) & set(sb))
    if rows_a and len(uids) != len(rows_a[0]):
      continue  # a different held-out size: not the same problems
    rows_a.append([sa[u] for u in uids])
    rows_b.append([sb[u] for u in uids])
    seeds.append(seed)
  if not seeds:
    return None
  delta, low, high = paired_bootstrap(rows_a, rows_b)
  per_seed = (np.asarray(rows_b, float) - np.asarray(rows_a, float)).mean(1)
  return {
    "seeds": seeds,
    "problems": len(rows_a[0]),
    "delta": delta,
    "low": low,
    "high": high,
    "per_seed": dict(zip(seeds, map(float, per_seed))),
  }


_AA_CACHE: dict[str, tuple[float, str] | None] = {}


def aa_floor(study: dict) -> tuple[float, str] | None:
  """(largest |B − A|, which pair) over the A/A pairs of the study's GPU
  seeds: arms that compute the same update (gates.same_update), so every
  difference between them is the machine's nondeterminism. A study with no
  such pair uses that of `study["aa_source"]` (AA_FROM), if set."""
  if study["dir"] not in _AA_CACHE:
    _AA_CACHE[study["dir"]] = _aa_floor(study)
  floor = _AA_CACHE[study["dir"]]
  source = study.get("aa_source")
  if floor is None and source is not None:
    name, other = source
    found = aa_floor(other)
    if found is not None:
      return found[0], f"{found[1]} of `{name}` (no A/A arm in this study)"
  return floor


def _aa_floor(study: dict) -> tuple[float, str] | None:
  names = list(study["runs"])
  found = []
  for i, x in enumerate(names):
    for y in names[i + 1 :]:
      result = compare(study, x, y)
      if result is None:
        continue
      for seed, d in result["per_seed"].items():
        if seed not in study["gpu_seeds"]:
          continue
        if gates.same_update(study["runs"][x][seed], study["runs"][y][seed]):
          found.append((abs(d), f"`{x}` vs `{y}`, seed {seed}"))
  return max(found) if found else None


def _lr_control(
  study: dict, a: str, b: str, seed: int, scale: float
) -> str | None:
  """An arm of the study that differs from A (UAQ off) only in a learning
  rate × s (within 10%; QuRL Table 4's control): what tells UAQ at scale s
  from the learning-rate change it amounts to under Adam."""
  run_a = study["runs"][a][seed]
  lr_a = gates.effective_config(run_a)["optim.learning_rate"]
  for name, by_seed in study["runs"].items():
    if name in (a, b) or seed not in by_seed:
      continue
    diff = gates.run_differences(run_a, by_seed[seed])
    if set(diff) == {"optim.learning_rate"}:
      ratio = diff["optim.learning_rate"][1] / lr_a
      if abs(ratio / scale - 1.0) <= 0.1:
        return name
  return None


def _uaq(study: dict, name: str, seeds) -> str:
  vals = sorted(
    {
      gates.effective_config(study["runs"][name][s])["rollout.uaq_scale"]
      for s in seeds
    }
  )
  return "/".join(f"{v:g}" for v in vals)


def _visibility(study: dict, a: str, b: str, seeds) -> str:
  """UAQ's exposure beside a claim about it or its learning-rate control:
  the share of INT8/FP8 codes a sync changes and the update-to-quant-error
  ratio (QuRL Fig. 9), arm A → arm B, means over seeds; '' if not logged."""
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
  return "; exposure (A → B): " + ", ".join(parts) if parts else ""


# π_behav = π_prox up to float rounding: the fp32 engine's cached decode and the
# trainer's full forward pass of the same weights differ only in rounding.
RHO_ONE_KL, RHO_ONE_TOL = 1e-9, 1e-4


def _arm_lag(study: dict, name: str, seeds) -> dict:
  """One arm's staleness exposure, over the seeds: the version lag (mean
  over steps of each step's mean, largest max), how far π_behav is from
  π_prox (mean behav–prox KL, largest ρ = π_prox/π_behav) and the share of
  tokens clipped (where naive's ratio against π_behav cuts the gradient)."""
  keys = ("version_lag_mean", "version_lag_max", "behav_prox_kl")
  keys += ("max_prox_behav_ratio", "clip_fraction")
  vals = {
    k: [
      x for s in seeds for _, x in gates.metric_rows(study["runs"][name][s], k)
    ]
    for k in keys
  }
  if not vals["version_lag_max"]:
    return {}
  return {
    "lag_mean": float(np.mean(vals["version_lag_mean"])),
    "lag_max": max(vals["version_lag_max"]),
    "kl": float(np.mean(vals["behav_prox_kl"] or [0.0])),
    "max_rho": max(vals["max_prox_behav_ratio"] or [1.0]),
    "clip": float(np.mean(vals["clip_fraction"] or [0.0])),
  }


def _lag_exposure(study: dict, a: str, b: str, seeds) -> str:
  """Staleness exposure beside a claim whose arms ran pipelined (issue 47):
  each arm's version lag and behav–prox distance, A → B; '' when neither
  arm ran stale or the runs did not log the lag. An arm at lag 0 with
  π_behav = π_prox (ρ ≡ 1) and one update per rollout (R ≡ 1) gives a
  correction nothing to act on: said so."""
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
    f"; exposure (A → B): version lag mean/max {x['lag_mean']:.2f}/"
    f"{x['lag_max']:g} → {y['lag_mean']:.2f}/{y['lag_max']:g}, behav–prox "
    f"KL {x['kl']:.1e} → {y['kl']:.1e}, max ρ {x['max_rho']:.3g} → "
    f"{y['max_rho']:.3g}, clipped tokens {x['clip']:.1e} → {y['clip']:.1e}"
  )
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


def gate_claim(
  study: dict, claim: str, a: str, b: str, named, result: dict, v: str, why: str
) -> tuple[str, str]:
  """The verdict after issue 44's gates (gates module docstring): refuses a
  confounded comparison; an ACR-vs-TIS claim must have been testable and
  exposed; a GPU comparison must exceed the machine's A/A floor."""
  runs = []
  for seed in result["seeds"]:
    ra, rb = study["runs"][a][seed], study["runs"][b][seed]
    gates.check_named(claim, a, b, ra, rb, named)
    runs += [(ra, gates.effective_config(ra)), (rb, gates.effective_config(rb))]
  corrections = {c.get("loss.correction") for _, c in runs}
  if tuple(named) == ("loss.correction",) and corrections == {"tis", "acr"}:
    gated = gates.acr_gate(runs)
    if gated is not None:
      return gated
    acr = [gates.exposure(d) for d, c in runs if c["loss.correction"] == "acr"]
    why += (
      "; ACR exposed: gradient share "
      f"{np.mean([e['grad_share'] for e in acr]):.1e} ≥ "
      f"{gates.EXPOSURE_GATE:g}, ACR-active "
      f"{np.mean([e['acr_active'] or 0.0 for e in acr]):.1e} of tokens"
    )
  elif corrections > {"acr"} and any(
    gates.updates_per_rollout(c) == 1 for _, c in runs
  ):
    why += "; ACR ≡ TIS in these runs (one update per rollout: R ≡ 1)"
  if U in named or LR in named:
    why += _visibility(study, a, b, result["seeds"])
  if set(named) & (set(LAG) | {"loss.correction"}):
    why += _lag_exposure(study, a, b, result["seeds"])
  if tuple(named) == ("rollout.uaq_scale",) and v == "supported":
    scale = gates.effective_config(study["runs"][b][result["seeds"][0]])[
      "rollout.uaq_scale"
    ]
    control = _lr_control(study, a, b, result["seeds"][0], scale)
    if control is None:
      return gates.NOT_ATTRIBUTABLE, (
        why + "; but under Adam a fold by s is a per-tensor learning rate "
        "(×s on q/k/v/gate/up, ×1/s on the norm gains: rljax/quant/uaq.py) "
        "and no arm at s = 1 with a larger learning rate tells the two apart"
      )
    # Credited to UAQ only if it also beats the control, the learning-rate
    # change it amounts to under Adam.
    against = compare(study, control, b)
    if against is not None:
      v_c, _ = verdict(
        against["low"], against["high"], "superiority", len(against["seeds"])
      )
      shown = (
        f"UAQ − `{control}` = {against['delta']:+.3f} "
        f"[{against['low']:+.3f}, {against['high']:+.3f}]"
      )
      if v_c != "supported":
        return gates.NOT_ATTRIBUTABLE, (
          f"{why}; but its learning-rate control gains as much ({shown}: {v_c})"
        )
      why += f"; beats its learning-rate control too ({shown})"
    else:
      why += f"; learning-rate control `{control}` has no finished seed"
  gpu = [s for s in result["seeds"] if s in study["gpu_seeds"]]
  if gpu and v in ("supported", "not supported"):
    floor = aa_floor(study)
    gap = abs(float(np.mean([result["per_seed"][s] for s in gpu])))
    if floor is None:
      return gates.NOT_ATTRIBUTABLE, (
        f"GPU seeds {gpu} and no A/A pair on that machine: its run-to-run "
        "nondeterminism is unmeasured"
      )
    if gap <= floor[0]:
      return gates.NOT_ATTRIBUTABLE, (
        f"the GPU seeds' gap {gap:.3f} (absolute B − A) is within the A/A floor "
        f"{floor[0]:.3f} ({floor[1]})"
      )
    why += (
      f"; the GPU seeds' gap {gap:.3f} (absolute B − A) exceeds the A/A "
      f"floor {floor[0]:.3f} ({floor[1]})"
    )
  return v, why


def with_aa_sources(studies: dict[str, dict]) -> dict[str, dict]:
  """The studies, each one of AA_FROM (when its source is there too) as a
  copy with `aa_source` = (source name, source study) for `aa_floor`."""
  out = dict(studies)
  for name, source in AA_FROM.items():
    if name in studies and source in studies:
      out[name] = {**studies[name], "aa_source": (source, studies[source])}
  return out


def claims_section(studies: dict[str, dict]) -> tuple[list[str], list[dict]]:
  lines = [
    f"Rule: {int(CONFIDENCE * 100)}% paired bootstrap interval of B − A "
    f"(final held-out accuracy; resampling seeds, then problems; "
    f"{N_BOOT:,} draws, fixed RNG). Superiority claims: supported if the "
    f"interval is above 0, not supported if it lies below +{MARGIN:g}; "
    f"non-inferiority claims: supported if it lies above −{MARGIN:g}, "
    f"not supported if below −{MARGIN:g}; otherwise, or with fewer than "
    f"{MIN_SEEDS} paired seeds, not resolved at this scale.",
    "",
    "Gates, read from each run's `config.json` and `metrics.jsonl` "
    "(`experiments/qurl_report_lib/gates.py`): two arms may differ only in "
    "the fields the claim names (else the page is not built); a claim "
    f"that ACR beats TIS is **{gates.NOT_TESTED}** when the runs had "
    "`update.ppo_epochs × update.minibatches == 1`, **not exercised** "
    f"when ACR's gradient share is below {gates.EXPOSURE_GATE:g}, and "
    "**not attributable** when the runs did not log it; a verdict from GPU "
    "runs is **not attributable** unless the gap exceeds the A/A floor "
    "(two arms computing the same update) of that machine. UAQ A/B: the "
    "scale each arm's trainer applied.",
    "",
    "| Q | study | claim | A | B | UAQ A/B | updates/rollout | seeds | "
    f"problems/seed | B − A | {int(CONFIDENCE * 100)}% CI | verdict | why |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  out = []
  studies = with_aa_sources(studies)
  for q, study_name, claim, a, b, kind, named in CLAIMS:
    study = studies.get(study_name)
    result = compare(study, a, b) if study else None
    ids = {"question": q, "study": study_name, "claim": claim, "a": a, "b": b}
    if result is None:
      why = (
        "no runs of this study are archived"
        if study is None
        else "no seed finished by both configs"
      )
      row = {**ids, "verdict": "not resolved at this scale", "why": why}
      lines.append(
        f"| {q} | {study_name} | {claim} | `{a}` | `{b}` | – | – | 0 | – | "
        f"– | – | **not resolved at this scale** | {why} |"
      )
    else:
      v, why = verdict(
        result["low"], result["high"], kind, len(result["seeds"])
      )
      v, why = gate_claim(study, claim, a, b, named, result, v, why)
      note = (
        gates.calibration_note(study, a, b)
        if study_name in PREREGISTERED
        else None
      )
      if note:
        v, why = v + UNCALIBRATED, f"{why}; C uncalibrated: {note}"
      seeds = result["seeds"]
      uaq = f"{_uaq(study, a, seeds)} / {_uaq(study, b, seeds)}"
      updates = sorted(
        {
          gates.updates_per_rollout(gates.effective_config(study["runs"][n][s]))
          for n in (a, b)
          for s in seeds
        }
      )
      row = {
        **ids,
        "verdict": v,
        "why": why,
        "uaq": uaq,
        "updates_per_rollout": updates,
        **{k: x for k, x in result.items() if k != "per_seed"},
      }
      lines.append(
        f"| {q} | {study_name} | {claim} | `{a}` | `{b}` | {uaq} | "
        f"{'/'.join(map(str, updates))} | "
        f"{len(result['seeds'])} | {result['problems']} | "
        f"{result['delta']:+.3f} | [{result['low']:+.3f}, "
        f"{result['high']:+.3f}] | **{v}** | {why} |"
      )
    out.append(row)
  return lines, out
