"""The claims table: the claims each question makes (which configs of which
study, superiority or non-inferiority), and the verdict of each from the
paired bootstrap of final held-out accuracy."""

from __future__ import annotations

from qurl_report_lib.stats import (
  CONFIDENCE,
  MARGIN,
  MIN_SEEDS,
  N_BOOT,
  paired_bootstrap,
  verdict,
)
from qurl_report_lib.studies import final_scores

# (question, study, claim, A, B, kind): B − A of final held-out accuracy.
CLAIMS = (
  [
    (
      "1",
      "q1_instrument",
      "naive INT8 rollout degrades training",
      "int8_naive",
      "fp32",
      "superiority",
    ),
    (
      "1",
      "q1_instrument",
      "INT8 + TIS is no worse than fp32",
      "fp32",
      "int8_tis",
      "non_inferiority",
    ),
    (
      "1",
      "q1_instrument",
      "INT8 + ACR is no worse than fp32",
      "fp32",
      "int8_acr",
      "non_inferiority",
    ),
    (
      "1",
      "q1_smollm2",
      "naive INT8 rollout degrades training",
      "int8_naive",
      "fp32",
      "superiority",
    ),
    (
      "1",
      "q1_smollm2",
      "INT8 + TIS is no worse than fp32",
      "fp32",
      "int8_tis",
      "non_inferiority",
    ),
    (
      "1",
      "q1_smollm2",
      "INT8 + ACR is no worse than fp32",
      "fp32",
      "int8_acr",
      "non_inferiority",
    ),
    (
      "2",
      "q2_instrument",
      "ACR beats TIS where its bound binds",
      "int8_tis",
      "int8_acr",
      "superiority",
    ),
    (
      "2",
      "q2_smollm2",
      "ACR beats TIS where its bound binds",
      "int8_tis",
      "int8_acr",
      "superiority",
    ),
  ]
  + [
    (
      "3",
      study,
      f"UAQ s={s} beats ACR alone at lr {lr}",
      f"int8_acr_lr{lr}",
      f"int8_acr_uaq{s}_lr{lr}",
      "superiority",
    )
    for study in ("q3_uaq", "q3_instrument")
    for lr in ("1e-6", "1e-5")
    for s in ("1.5", "2", "3")
  ]
  + [
    (
      "4",
      "q4_long_horizon",
      "INT8 + TIS falls behind fp32 over 1,000 steps (collapse)",
      "int8_tis",
      "fp32",
      "superiority",
    ),
    (
      "4",
      "q4_long_horizon",
      "INT8 + ACR is no worse than fp32 over 1,000 steps",
      "fp32",
      "int8_acr",
      "non_inferiority",
    ),
    (
      "4",
      "q4_long_horizon",
      "ACR beats TIS over 1,000 steps",
      "int8_tis",
      "int8_acr",
      "superiority",
    ),
    (
      "5",
      "q5_fp8",
      "naive FP8 (emulated) rollout degrades training",
      "fp8_naive",
      "fp32",
      "superiority",
    ),
    (
      "5",
      "q5_fp8",
      "FP8 (emulated) + TIS is no worse than fp32",
      "fp32",
      "fp8_tis",
      "non_inferiority",
    ),
    (
      "5",
      "q5_fp8",
      "FP8 (emulated) + ACR beats TIS where its bound binds",
      "fp8_tis_q2",
      "fp8_acr_q2",
      "superiority",
    ),
  ]
)

# Question 5 at instrument scale: its arms carry the question they repeat
# (`_q1`: one update per rollout; `_q2`: 4 mini-batches x 2 epochs).
CLAIMS += [
  (
    "5",
    "q5_instrument",
    "naive FP8 (emulated) rollout degrades training",
    "fp8_naive_q1",
    "fp32_q1",
    "superiority",
  ),
  (
    "5",
    "q5_instrument",
    "FP8 (emulated) + TIS is no worse than fp32",
    "fp32_q1",
    "fp8_tis_q1",
    "non_inferiority",
  ),
  (
    "5",
    "q5_instrument",
    "FP8 (emulated) + ACR is no worse than fp32",
    "fp32_q1",
    "fp8_acr_q1",
    "non_inferiority",
  ),
  (
    "5",
    "q5_instrument",
    "FP8 (emulated) + ACR beats TIS where its bound binds",
    "fp8_tis_q2",
    "fp8_acr_q2",
    "superiority",
  ),
]
# Question 2 also asks whether the corrected INT8 runs keep up with fp32
# in the several-updates-per-rollout regime.
CLAIMS += [
  (
    "2",
    "q2_instrument",
    f"INT8 + {c.upper()} is no worse than fp32 (4 x 2 updates per rollout)",
    "fp32",
    f"int8_{c}",
    "non_inferiority",
  )
  for c in ("tis", "acr")
]
# The same claims on runs made on a GPU (study `<name>_gpu`): another machine
# and other seeds, so a separate study.
CLAIMS += [
  (q, f"{study}_gpu", f"{claim} (H100 runs)", a, b, kind)
  for q, study, claim, a, b, kind in CLAIMS
  if study in ("q2_instrument", "q4_long_horizon")
]
# Q4's 1,000-step runs cost ~25 CPU-minutes each: its seeds were split over
# two machines (`<name>_pooled`, `pool_studies`). Each seed's arms ran on one
# machine, so every paired difference is within a machine; the pooled claim
# treats the machine as part of the seed's draw, and the page says so.
CLAIMS += [
  (
    q,
    f"{study}_pooled",
    f"{claim} (seeds pooled over H100 and CPU)",
    a,
    b,
    kind,
  )
  for q, study, claim, a, b, kind in CLAIMS
  if study == "q4_long_horizon"
]

QUESTIONS = {
  "1": "Does naive INT8 rollout degrade training, and does decoupling fix it?",
  "2": "Does ACR beat TIS where its bound binds?",
  "3": "Does UAQ help where updates are rounded away?",
  "4": "Is there a long-horizon collapse (QuRL Fig. 3), and does ACR prevent it?",
  "5": "FP8 (emulated on CPU) for questions 1-2.",
}


def compare(study: dict, a: str, b: str) -> dict | None:
  """Paired bootstrap of final accuracy B − A over the seeds both finished
  (problems matched by uid); None if there is no such seed."""
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
  return {
    "seeds": seeds,
    "problems": len(rows_a[0]),
    "delta": delta,
    "low": low,
    "high": high,
  }


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
    "| Q | study | claim | A | B | seeds | problems/seed | B − A | "
    f"{int(CONFIDENCE * 100)}% CI | verdict | why |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  out = []
  for q, study_name, claim, a, b, kind in CLAIMS:
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
        f"| {q} | {study_name} | {claim} | `{a}` | `{b}` | 0 | – | "
        f"– | – | **not resolved at this scale** | {why} |"
      )
    else:
      v, why = verdict(
        result["low"], result["high"], kind, len(result["seeds"])
      )
      row = {
        **ids,
        "verdict": v,
        "why": why,
        **result,
      }
      lines.append(
        f"| {q} | {study_name} | {claim} | `{a}` | `{b}` | "
        f"{len(result['seeds'])} | {result['problems']} | "
        f"{result['delta']:+.3f} | [{result['low']:+.3f}, "
        f"{result['high']:+.3f}] | **{v}** | {why} |"
      )
    out.append(row)
  return lines, out
