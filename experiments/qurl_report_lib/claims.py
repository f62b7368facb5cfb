"""The claims table: each claim's paired readout difference (`compare`),
its tests (`evaluate`, before the page-wide Holm adjustment of family.py),
and its verdict after the adjustment and the gates (`finish`)."""

from __future__ import annotations

import re

import numpy as np

from qurl_report_lib import gates
from qurl_report_lib import stats
from qurl_report_lib.claim_list import (
  AA_FROM,
  CLAIMS,
  PREREGISTERED,
  U,
  UNCALIBRATED,
)
from qurl_report_lib.exposures import exposure
from qurl_report_lib.studies import readout_scores


def compare(
  study: dict, a: str, b: str, k: int = stats.READOUT_K
) -> dict | None:
  """The paired readout difference B − A over the seeds both arms finished
  (problems matched by uid; readout: the mean of each run's last k
  evaluations, `studies.readout_scores`); None if there is no such seed.

  Returns {seeds, problems, evals (evaluations averaged), readout (its
  label), per_seed {seed: B − A}, acc_a, acc_b, delta, method, low, high
  (the seed-level interval; None below 2 seeds), boot_low, boot_high (the
  bootstrap over seeds then problems)}."""
  ra, rb = study["runs"].get(a, {}), study["runs"].get(b, {})
  rows_a, rows_b, seeds, evals = [], [], [], []
  for seed in sorted(set(ra) & set(rb)):
    (sa, steps_a), (sb, steps_b) = (
      readout_scores(ra[seed], k),
      readout_scores(rb[seed], k),
    )
    if not sa or not sb:
      continue
    uids = sorted(set(sa) & set(sb))
    if rows_a and len(uids) != len(rows_a[0]):
      continue  # a different held-out size: not the same problems
    rows_a.append([sa[u] for u in uids])
    rows_b.append([sb[u] for u in uids])
    seeds.append(seed)
    evals.append(min(len(steps_a), len(steps_b)))
  if not seeds:
    return None
  arr_a, arr_b = np.asarray(rows_a, float), np.asarray(rows_b, float)
  per_seed = (arr_b - arr_a).mean(1)
  _, boot_low, boot_high = stats.paired_bootstrap(arr_a, arr_b)
  n_evals, problems = min(evals), len(rows_a[0])
  out = {
    "seeds": seeds,
    "problems": problems,
    "evals": n_evals,
    "readout": (
      f"final eval × {problems}"
      if n_evals == 1
      else f"mean of last {n_evals} evals × {problems}"
    ),
    "per_seed": dict(zip(seeds, map(float, per_seed))),
    "acc_a": float(arr_a.mean()),
    "acc_b": float(arr_b.mean()),
    "delta": float(per_seed.mean()),
    "method": None,
    "low": None,
    "high": None,
    "boot_low": boot_low,
    "boot_high": boot_high,
  }
  if len(seeds) >= 2:
    interval = stats.seed_interval(per_seed)
    out.update(
      method=interval["method"], low=interval["low"], high=interval["high"]
    )
  return out


_FLOOR_CACHE: dict[str, tuple | None] = {}


def gpu_floor(study: dict) -> tuple[float, str, bool] | None:
  """(largest |B − A|, which pair, bit-identical) over the pairs of the
  study's GPU seeds that compute the same update (gates.same_update): the
  machine's run-to-run nondeterminism. bit-identical: every such pair gave
  the same held-out records (deterministic ops), which measures no floor. A
  study without such a pair uses that of `study["aa_source"]` (AA_FROM)."""
  if study["dir"] not in _FLOOR_CACHE:
    _FLOOR_CACHE[study["dir"]] = _gpu_floor(study)
  floor = _FLOOR_CACHE[study["dir"]]
  source = study.get("aa_source")
  if floor is None and source is not None:
    name, other = source
    found = gpu_floor(other)
    if found is not None:
      return found[0], f"{found[1]} of `{name}`", found[2]
  return floor


def _gpu_floor(study: dict) -> tuple[float, str, bool] | None:
  names = list(study["runs"])
  found = []
  for i, x in enumerate(names):
    for y in names[i + 1 :]:
      result = compare(study, x, y, k=1)
      if result is None:
        continue
      for seed, d in result["per_seed"].items():
        if seed not in study["gpu_seeds"]:
          continue
        if gates.same_update(study["runs"][x][seed], study["runs"][y][seed]):
          found.append((abs(d), f"`{x}` vs `{y}`, seed {seed}"))
  if not found:
    return None
  gap, pair = max(found)
  return gap, pair, gap == 0.0


def aa_noise(study: dict) -> dict | None:
  """The study's perturbed A/A spread (stats.aa_spread) from its pairs of
  arms that differ in their data order alone (gates.perturbed_twins):
  {"spread", "largest", "pair", "seeds"}; None without such a pair."""
  names = list(study["runs"])
  for i, x in enumerate(names):
    for y in names[i + 1 :]:
      common = sorted(set(study["runs"][x]) & set(study["runs"][y]))
      if not common or not all(
        gates.perturbed_twins(study["runs"][x][s], study["runs"][y][s])
        for s in common
      ):
        continue
      twin, aa = sorted(
        (x, y), key=lambda n: gates.data_order(study["runs"][n][common[0]])
      )
      result = compare(study, twin, aa)
      if result is None:
        continue
      d = list(result["per_seed"].values())
      return {
        "spread": stats.aa_spread(d),
        "largest": float(np.max(np.abs(d))),
        "pair": (twin, aa),
        "seeds": len(d),
      }
  return None


def noise_cell(study: dict) -> str:
  """What the claims table prints as a study's noise floor."""
  noise = aa_noise(study)
  if noise is not None:
    twin, aa = noise["pair"]
    return (
      f"{noise['spread']:.3f} (`{aa}` − `{twin}`, RMS over "
      f"{noise['seeds']} seeds; largest {noise['largest']:.3f})"
    )
  floor = gpu_floor(study) if study["gpu_seeds"] else None
  if floor is not None and not floor[2]:
    return f"GPU run-to-run {floor[0]:.3f} ({floor[1]}; one pair)"
  if floor is not None:
    return "no noise floor measured (its A/A pair is bit-identical)"
  return "no noise floor measured"


def _lr_control(study: dict, a: str, b: str, seed: int, scale: float):
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


def label(claim: str, configs: list[dict]) -> str:
  """The claim's text, with an ACR arm trained at one update per rollout
  named for what it computed: TIS (R ≡ 1, so ACR is TIS for every C)."""
  one_update = configs and all(
    gates.updates_per_rollout(c) == 1 for c in configs
  )
  if not one_update or "acr" not in {c.get("loss.correction") for c in configs}:
    return claim
  if "tis" in {c.get("loss.correction") for c in configs}:
    return claim  # ACR vs TIS itself: "not tested", said by the verdict
  return (
    re.sub(r"\bACR\b", "TIS", claim)
    + " [its `acr` arm: at one update per rollout ACR is TIS]"
  )


def evaluate(studies: dict[str, dict]) -> list[dict]:
  """Every claim of CLAIMS with its readout difference and, where the rule
  tests it, its two raw one-sided p-values (`p_raw`); a claim that the
  gates decide without a test (ACR not testable or not exposed) carries its
  verdict already."""
  studies = with_aa_sources(studies)
  rows = []
  for q, study_name, claim, a, b, kind, named in CLAIMS:
    study = studies.get(study_name)
    result = compare(study, a, b) if study else None
    row = {
      "question": q,
      "study": study_name,
      "claim": claim,
      "a": a,
      "b": b,
      "kind": kind,
      "named": list(named),
      "p_raw": None,
    }
    rows.append(row)
    if result is None:
      row["verdict"] = stats.NOT_RESOLVED
      row["why"] = (
        "no runs of this study are archived"
        if study is None
        else "no seed finished by both configs"
      )
      continue
    row.update(result)
    runs = []
    for seed in result["seeds"]:
      ra, rb = study["runs"][a][seed], study["runs"][b][seed]
      gates.check_named(claim, a, b, ra, rb, named)
      runs += [
        (ra, gates.effective_config(ra)),
        (rb, gates.effective_config(rb)),
      ]
    configs = [c for _, c in runs]
    row["claim"] = label(claim, configs)
    row["uaq"] = (
      f"{_uaq(study, a, row['seeds'])} / {_uaq(study, b, row['seeds'])}"
    )
    row["updates_per_rollout"] = sorted(
      {gates.updates_per_rollout(c) for c in configs}
    )
    row["exposure"] = exposure(study, row, named)
    row["noise"] = noise_cell(study)
    corrections = {c.get("loss.correction") for c in configs}
    if tuple(named) == ("loss.correction",) and corrections == {"tis", "acr"}:
      gated = gates.acr_gate(runs)
      if gated is not None:
        row["verdict"], row["why"] = gated
        continue
    if len(result["seeds"]) >= stats.MIN_SEEDS:
      row["p_raw"] = stats.claim_tests(list(result["per_seed"].values()), kind)
  return rows


def finish(row: dict, studies: dict[str, dict], by_key: dict) -> None:
  """Sets the verdict of an evaluated claim from its Holm-adjusted p-values
  (`row["p"]`), then the gates: a UAQ gain needs to beat its learning-rate
  control, a GPU comparison its machine's floor, and a superiority claim
  inside its study's A/A spread reads "within noise"."""
  if "verdict" in row:
    return
  study = with_aa_sources(studies)[row["study"]]
  p = row.get("p") or {}
  v, why = stats.verdict_from_tests(
    p.get("for"), p.get("against"), row["kind"], len(row["seeds"])
  )
  a, b, seeds = row["a"], row["b"], row["seeds"]
  if tuple(row["named"]) == (U,) and v == stats.SUPPORTED:
    scale = gates.effective_config(study["runs"][b][seeds[0]])[
      "rollout.uaq_scale"
    ]
    control = _lr_control(study, a, b, seeds[0], scale)
    if control is None:
      v, why = (
        gates.NOT_ATTRIBUTABLE,
        (
          f"{why}; but under Adam a fold by s is a per-tensor learning rate "
          "(×s on q/k/v/gate/up, ×1/s on the norm gains: rljax/quant/uaq.py) "
          "and no arm at s = 1 with a larger learning rate tells the two apart"
        ),
      )
    else:
      against = by_key.get((row["study"], control, b))
      if against is not None and "p" in against:
        finish(against, studies, by_key)
        control_verdict = against["verdict"]
      else:
        # Not a claim on the page: its own two tests, unadjusted (the
        # control can only take a credit away).
        against = compare(study, control, b)
        p_c = stats.claim_tests(
          list(against["per_seed"].values()), "superiority"
        )
        control_verdict = (
          stats.verdict_from_tests(
            p_c["for"], p_c["against"], "superiority", len(against["seeds"])
          )[0]
          + " (unadjusted)"
        )
      shown = f"UAQ − `{control}` = {against['delta']:+.3f}"
      if not control_verdict.startswith(stats.SUPPORTED):
        v, why = (
          gates.NOT_ATTRIBUTABLE,
          (
            f"{why}; but its learning-rate control gains as much ({shown}: "
            f"{control_verdict})"
          ),
        )
      else:
        why += f"; beats its learning-rate control too ({shown})"
  gpu = [s for s in seeds if s in study["gpu_seeds"]]
  if gpu and v in (stats.SUPPORTED, stats.NOT_SUPPORTED):
    floor = gpu_floor(study)
    gap = abs(float(np.mean([row["per_seed"][s] for s in gpu])))
    if floor is None:
      v, why = (
        gates.NOT_ATTRIBUTABLE,
        (
          f"GPU seeds {gpu} and no A/A pair on that machine: its run-to-run "
          "nondeterminism is unmeasured"
        ),
      )
    elif floor[2]:
      why += (
        f"; no noise floor measured: the GPU's A/A pair ({floor[1]}) is "
        "bit-identical under deterministic ops"
      )
    elif gap <= floor[0]:
      v, why = (
        gates.NOT_ATTRIBUTABLE,
        (
          f"the GPU seeds' gap {gap:.3f} (absolute B − A) is within the GPU "
          f"run-to-run floor {floor[0]:.3f} ({floor[1]})"
        ),
      )
    else:
      why += (
        f"; the GPU seeds' gap {gap:.3f} (absolute B − A) exceeds the GPU "
        f"run-to-run floor {floor[0]:.3f} ({floor[1]})"
      )
  noise = aa_noise(study)
  if (
    noise is not None
    and v in (stats.SUPPORTED, stats.NOT_SUPPORTED)
    and stats.within_noise(row["delta"], noise["spread"], row["kind"])
  ):
    why = (
      f"{why}, but |B − A| = {abs(row['delta']):.3f} is inside the A/A "
      f"spread {noise['spread']:.3f}"
    )
    v = stats.WITHIN_NOISE
  if row["study"] in PREREGISTERED:
    note = gates.calibration_note(study, a, b)
    if note:
      v, why = v + UNCALIBRATED, f"{why}; C uncalibrated: {note}"
  row["verdict"], row["why"] = v, why


def with_aa_sources(studies: dict[str, dict]) -> dict[str, dict]:
  """The studies, each one of AA_FROM (when its source is there too) as a
  copy with `aa_source` = (source name, source study) for `gpu_floor`."""
  out = dict(studies)
  for name, source in AA_FROM.items():
    if (
      name in studies and source in studies and "aa_source" not in studies[name]
    ):
      out[name] = {**studies[name], "aa_source": (source, studies[source])}
  return out


def _ci(row: dict) -> str:
  if row.get("low") is None:
    return "–"
  return f"[{row['low']:+.3f}, {row['high']:+.3f}] ({row['method']})"


def _holm(row: dict) -> str:
  p = row.get("p")
  if not p:
    return "–"
  return f"{p['for']:.2g} / {p['against']:.2g}"


def render(rows: list[dict], tests: int) -> list[str]:
  """The claims table (rules: stats.rule_lines, printed once above it)."""
  lines = [
    f"{len(rows)} claims; {tests} one-sided tests in the Holm family (the "
    "claims below and the KL-slope readouts of Q6). Holm p: the adjusted p "
    "of the test for the claim / against it. Exposure: the mechanism each "
    "claim is about, arm A → arm B.",
    "",
    "| Q | study | claim | A | B | UAQ A/B | updates/rollout | seeds | "
    "readout (problems) | B − A | 95% CI (seeds) | bootstrap seeds × problems "
    "| Holm p for / against | A/A spread | verdict | why | exposure (A → B) |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    if r.get("delta") is None:
      lines.append(
        f"| {r['question']} | {r['study']} | {r['claim']} | `{r['a']}` | "
        f"`{r['b']}` | – | – | 0 | – | – | – | – | – | – | "
        f"**{r['verdict']}** | {r['why']} | – |"
      )
      continue
    lines.append(
      f"| {r['question']} | {r['study']} | {r['claim']} | `{r['a']}` | "
      f"`{r['b']}` | {r['uaq']} | "
      f"{'/'.join(map(str, r['updates_per_rollout']))} | {len(r['seeds'])} | "
      f"{r['readout']} | {r['delta']:+.3f} | {_ci(r)} | "
      f"[{r['boot_low']:+.3f}, {r['boot_high']:+.3f}] | {_holm(r)} | "
      f"{r['noise']} | **{r['verdict']}** | {r['why']} | {r['exposure']} |"
    )
  return lines


def json_row(row: dict) -> dict:
  """The row as docs/qurl_results.json keeps it."""
  keep = (
    "question study claim a b kind verdict why uaq updates_per_rollout seeds "
    "problems evals readout delta method low high boot_low boot_high p p_raw "
    "noise exposure"
  ).split()
  out = {k: row[k] for k in keep if k in row}
  if "per_seed" in row:
    out["per_seed"] = {str(s): d for s, d in row["per_seed"].items()}
  return out
