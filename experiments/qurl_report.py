"""Writes docs/qurl_results.md from archived run files.

Every number in the page comes from files written by the runs: each study's
run directories (`metrics.jsonl`, `config.json`, `summary.json`, the
per-problem held-out records `eval_step<k>.jsonl` of rljax/study.py,
`progress.json`, `cpu_log.jsonl`; experiments/ablate.py and
experiments/long_horizon.py) and the rows of experiments/bench_rollout.py
`--out`. Hand-written prose comes from --reading and refers to the tables
rather than repeating numbers.

  python experiments/qurl_report.py \
      --studies=q1_instrument:runs/q1_instrument,q4_long_horizon:runs/q4 \
      --out=docs/qurl_results.md

copies what it reads into --archive (docs/qurl/runs/<study>/), and
regenerates from there with --studies=NAME:docs/qurl/runs/NAME --archive=''.

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

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

from absl import app, flags
import numpy as np

from rljax.train import config as config_lib

from rljax.train.metrics import read_metrics

_STUDIES = flags.DEFINE_list(
  "studies",
  [],
  "NAME:DIR of each study (an ablate.py / long_horizon.py "
  "--out_dir, or its archive); NAME:DIR+DIR+... pools studies of the same "
  "configs run with disjoint seeds (e.g. on two machines) into one.",
)
_ABLATION = flags.DEFINE_string(
  "ablation_dir",
  "docs/qurl/runs/qurl_cpu_12step",
  "The earlier one-seed 12-step SmolLM2 ablation, tabled as it was "
  "('' = leave out).",
)
_BENCH = flags.DEFINE_string(
  "bench", "", "JSON rows of bench_rollout.py --out."
)
_BENCH_CMD = flags.DEFINE_string(
  "bench_command", "", "The command that produced --bench."
)
_ABLATE_CMD = flags.DEFINE_string(
  "ablate_command", "", "The command that produced --ablation_dir."
)
_READING = flags.DEFINE_string(
  "reading", "", "Markdown inserted as the reading."
)
_REFERENCE = flags.DEFINE_string(
  "reference", "fp32", "Run name every Δ is measured against."
)
_FIGURES = flags.DEFINE_list(
  "figures",
  [
    "corrections:fp32,int8_naive,int8_ignore_behavior,int8_tis,int8_acr_uaq1",
    "uaq:fp32,int8_acr_uaq1,int8_acr_uaq1.5,int8_acr_uaq2",
    "fp8:fp32,fp8_tis,fp8_acr,int8_tis,int8_acr_uaq1",
  ],
  "NAME:run,run,... one figure per entry (runs missing from the ablation "
  "are left out).",
)
_OUT = flags.DEFINE_string("out", "docs/qurl_results.md", "Markdown page.")
_INSTRUMENT = flags.DEFINE_string(
  "instrument_record",
  "",
  "instrument.json of the pre-trained instrument "
  "(experiments/long_horizon.py --instrument_dir).",
)
_BASE_RATES = flags.DEFINE_list(
  "base_rates",
  [],
  "JSON files of experiments/base_rate.py --out: the "
  "untrained model's held-out accuracy per task difficulty.",
)
_SMOOTH = flags.DEFINE_integer(
  "smooth", 1, "Moving-average window of the study figures."
)
_ARCHIVE = flags.DEFINE_string(
  "archive",
  "docs/qurl/runs",
  "Copy each study's small files (metrics, configs, summaries, per-problem "
  "held-out records; no checkpoints) to <archive>/<study>, and build the "
  "page from there ('' = read the studies where they are).",
)

_HERE = os.path.dirname(os.path.abspath(__file__))

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


def _fmt(v, digits=3) -> str:
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


def _mean_std(values) -> tuple[float | None, float | None]:
  vals = [v for v in values if v is not None]
  if not vals:
    return None, None
  return float(np.mean(vals)), float(np.std(vals))


def run_quant_curves(run_dir: str) -> dict:
  """Means over steps of the QuRL Fig. 9 quantities for one run."""
  train = [r for r in read_metrics(run_dir) if "reward_mean" in r]
  out = {}
  for key in (
    "quant/normalized_weight_update",
    "quant/normalized_quant_error",
    "quant/update_to_quant_error",
    "quant/quantized_change_fraction",
  ):
    vals = [r[key] for r in train if isinstance(r.get(key), (int, float))]
    out[key] = float(np.mean(vals)) if vals else None
  return out


def ablation_section(
  ablation_dir: str, rows: list[dict], reference: str
) -> tuple[list[str], dict]:
  setup_path = os.path.join(ablation_dir, "ablation.json")
  setup = json.load(open(setup_path)) if os.path.exists(setup_path) else {}
  names = list(dict.fromkeys(r["name"] for r in rows))
  by_name = {n: [r for r in rows if r["name"] == n] for n in names}
  ref = by_name.get(reference, [])
  ref_final, _ = _mean_std(r["eval_final"] for r in ref)
  ref_last, _ = _mean_std(r["reward_last_q"] for r in ref)
  runs = {r["name"]: r for r in setup.get("runs", [])}
  lines = []
  # Nested, or flat from an older ablation.json (config.LEGACY_KEYS).
  base = config_lib.flatten(setup.get("base", {}))
  if base:
    keys = [
      "model.name",
      "task.name",
      "task.difficulty",
      "algorithm",
      "rollout.prompts_per_step",
      "rollout.group_size",
      "rollout.max_new_tokens",
      "rollout.temperature",
      "optim.learning_rate",
      "update.minibatches",
      "run.steps",
      "task.eval_size",
      "run.eval_every",
      "loss.eps_low",
      "loss.eps_high",
      "loss.tis_cap",
    ]
    lines.append(
      "Shared settings (from `ablation.json`): "
      + ", ".join(f"`{k}={base[k]}`" for k in keys if k in base)
      + "."
    )
    lines.append("")
  seeds = sorted({r["seed"] for r in rows})
  lines.append(
    f"Seeds: {', '.join(map(str, seeds))}. Values are the mean over "
    "seeds (± std when there is more than one). Held-out accuracy "
    "is greedy, on problems the training never sees, evaluated with "
    "full-precision weights. Δ columns are against "
    f"`{reference}`."
  )
  lines.append("")
  head = [
    "run",
    "rollout",
    "correction",
    "UAQ s",
    "acc. before",
    "acc. final",
    "Δ final",
    "acc. best",
    "reward first ¼",
    "reward last ¼",
    "Δ reward last ¼",
    "behav–prox KL",
    "max ρ",
    "clip low",
    "clip high",
    "TIS-truncated",
    "rollout tok/s",
    "s/step",
  ]
  lines.append("| " + " | ".join(head) + " |")
  lines.append("|" + "---|" * len(head))
  summary = {}
  for name in names:
    rs = by_name[name]
    cfg = config_lib.flatten(runs.get(name, {}))
    final, final_sd = _mean_std(r["eval_final"] for r in rs)
    last, last_sd = _mean_std(r["reward_last_q"] for r in rs)

    def cell(key, rs=rs):
      m, s = _mean_std(r.get(key) for r in rs)
      return _fmt(m) + (
        f" ± {_fmt(s)}" if len(rs) > 1 and s is not None else ""
      )

    d_final = (final - ref_final) if None not in (final, ref_final) else None
    d_last = (last - ref_last) if None not in (last, ref_last) else None
    summary[name] = {
      "final": final,
      "delta_final": d_final,
      "delta_reward_last_q": d_last,
    }
    lines.append(
      "| "
      + " | ".join(
        [
          f"`{name}`",
          str(cfg.get("rollout.quant", base.get("rollout.quant", "?"))),
          str(cfg.get("loss.correction", base.get("loss.correction", "?"))),
          _fmt(
            float(
              cfg.get("rollout.uaq_scale", base.get("rollout.uaq_scale", 1))
            ),
            1,
          ),
          cell("eval_before"),
          _fmt(final) + (f" ± {_fmt(final_sd)}" if len(rs) > 1 else ""),
          _fmt(d_final) if name != reference else "0",
          cell("eval_best"),
          cell("reward_first_q"),
          _fmt(last) + (f" ± {_fmt(last_sd)}" if len(rs) > 1 else ""),
          _fmt(d_last) if name != reference else "0",
          cell("behav_prox_kl"),
          cell("max_rho"),
          cell("clip_low"),
          cell("clip_high"),
          cell("tis_truncated"),
          cell("rollout_tok_s"),
          cell("s_per_step"),
        ]
      )
      + " |"
    )
  lines += [
    "",
    "Weight update vs quantization error (QuRL Fig. 9; means over "
    "steps of the `quant/*` metrics; the error is measured on the "
    "weights the engine actually received):",
    "",
  ]
  lines.append(
    "| run | ‖Δθ‖²/‖θ‖² per step (Eq. 13) | ‖Q(θ)−θ‖²/‖θ‖² "
    "(Eq. 14) | update / error (× s² under UAQ) | "
    "quantized values changed per sync |"
  )
  lines.append("|---|---|---|---|---|")
  for name in names:
    curves = [
      run_quant_curves(os.path.join(ablation_dir, f"{name}_s{r['seed']}"))
      for r in by_name[name]
    ]

    def avg(key, curves=curves):
      return _mean_std(c[key] for c in curves)[0]

    lines.append(
      f"| `{name}` | {_fmt(avg('quant/normalized_weight_update'))} | "
      f"{_fmt(avg('quant/normalized_quant_error'))} | "
      f"{_fmt(avg('quant/update_to_quant_error'))} | "
      f"{_fmt(avg('quant/quantized_change_fraction'))} |"
    )
  return lines, summary


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


def _read_json(path, default=None):
  if not os.path.exists(path):
    return default
  with open(path) as f:
    return json.load(f)


def load_study(study_dir: str) -> dict:
  """{setup, progress, cpu_s, runs: {name: {seed: run_dir}}, status} of a
  study directory, from what is on disk."""
  setup = _read_json(os.path.join(study_dir, "ablation.json"), {})
  names = [r["name"] for r in setup.get("runs", [])]
  runs: dict[str, dict[int, str]] = {n: {} for n in names}
  status: dict[str, str] = {}
  paths: dict[str, str] = {}
  for entry in (
    sorted(os.listdir(study_dir)) if os.path.isdir(study_dir) else []
  ):
    run_dir = os.path.join(study_dir, entry)
    if not os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
      continue
    name, _, seed = entry.rpartition("_s")
    if not seed.isdigit():
      continue
    runs.setdefault(name, {})[int(seed)] = run_dir
    done = os.path.exists(os.path.join(run_dir, "summary.json"))
    status[entry] = "done" if done else "partial"
    paths[entry] = run_dir
  cpu_log = os.path.join(study_dir, "cpu_log.jsonl")
  cpu = []
  if os.path.exists(cpu_log):
    with open(cpu_log) as f:
      cpu = [json.loads(line) for line in f if line.strip()]
  cpu_s = sum(c.get("cpu_s", 0.0) for c in cpu)
  return {
    "dir": study_dir,
    "setup": setup,
    "runs": runs,
    "status": status,
    "paths": paths,
    "progress": _read_json(os.path.join(study_dir, "progress.json"), {}),
    "cpu_s": cpu_s,
    "wall_s": sum(c.get("wall_s", 0.0) for c in cpu),
    # CPU seconds per study directory, so that a page listing a directory
    # both on its own and inside a pooled study counts it once.
    "cpu_by_dir": {os.path.abspath(study_dir): cpu_s},
  }


def pool_studies(parts: list[dict]) -> dict:
  """One study from several studies of the same configs whose seeds are
  disjoint, e.g. seed 0 run on a GPU and seeds 1-2 on a CPU.

  A paired claim compares configs within a seed, so every seed must have
  all of its runs in one part (one machine): a (config, seed) found in two
  parts is an error, and so is a part whose configs differ from the first
  part's. The pooled setup is the first part's, with the seeds of all parts
  and a `machine` line naming which seeds ran where.
  """
  if not parts:
    raise ValueError("pool_studies: no studies to pool")
  names = [r["name"] for r in parts[0]["setup"].get("runs", [])]
  runs: dict[str, dict[int, str]] = {n: {} for n in names}
  status, paths, cpu_by_dir, machines, seeds = {}, {}, {}, [], []
  for part in parts:
    part_names = [r["name"] for r in part["setup"].get("runs", [])]
    if sorted(part_names) != sorted(names):
      raise ValueError(
        f"pool_studies: {part['dir']} runs configs {sorted(part_names)}; "
        f"expected those of {parts[0]['dir']}: {sorted(names)}"
      )
    part_seeds = sorted(
      {s for by_seed in part["runs"].values() for s in by_seed}
    )
    for name, by_seed in part["runs"].items():
      for seed, run_dir in by_seed.items():
        if seed in runs.setdefault(name, {}):
          raise ValueError(
            f"pool_studies: {name} seed {seed} is in both "
            f"{os.path.dirname(runs[name][seed])} and {part['dir']}; "
            "pooled studies need disjoint seeds"
          )
        runs[name][seed] = run_dir
    status.update(part["status"])
    paths.update(part["paths"])
    cpu_by_dir.update(part["cpu_by_dir"])
    seeds += part_seeds
    machine = part["setup"].get("machine", "").split(",")[0] or "CPU"
    machines.append(
      f"seed{'s' if len(part_seeds) != 1 else ''} "
      f"{', '.join(map(str, part_seeds))}: {machine}"
    )
  setup = dict(parts[0]["setup"])
  setup["seeds"] = sorted(set(seeds))
  setup["machine"] = "pooled (" + "; ".join(machines) + ")"
  return {
    "dir": "+".join(p["dir"] for p in parts),
    "setup": setup,
    "runs": runs,
    "status": status,
    "paths": paths,
    "progress": {},
    "cpu_s": sum(p["cpu_s"] for p in parts),
    "wall_s": sum(p["wall_s"] for p in parts),
    "cpu_by_dir": cpu_by_dir,
  }


def final_scores(run_dir: str) -> dict[str, int] | None:
  """{problem uid: correct} of a finished run's last held-out records."""
  if not os.path.exists(os.path.join(run_dir, "summary.json")):
    return None
  from rljax.study import read_eval_records

  recs = read_eval_records(run_dir)
  if not recs:
    return None
  last = recs[max(recs)]
  return {r["uid"]: int(r["correct"]) for r in last}


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
    if result is None:
      why = (
        "no runs of this study are archived"
        if study is None
        else "no seed finished by both configs"
      )
      row = {
        "question": q,
        "study": study_name,
        "claim": claim,
        "a": a,
        "b": b,
        "verdict": "not resolved at this scale",
        "why": why,
      }
      lines.append(
        f"| {q} | {study_name} | {claim} | `{a}` | `{b}` | 0 | – | "
        f"– | – | **not resolved at this scale** | {why} |"
      )
    else:
      v, why = verdict(
        result["low"], result["high"], kind, len(result["seeds"])
      )
      row = {
        "question": q,
        "study": study_name,
        "claim": claim,
        "a": a,
        "b": b,
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


def _train_rows(run_dir: str) -> list[dict]:
  return [r for r in read_metrics(run_dir) if "loss" in r]


def run_summary(run_dir: str) -> dict:
  rows = read_metrics(run_dir)
  train = [r for r in rows if "loss" in r]
  evals = [r for r in rows if "eval_accuracy" in r]
  q = max(1, len(train) // 4)

  def mean(key, part):
    vals = [r[key] for r in part if isinstance(r.get(key), (int, float))]
    return float(np.mean(vals)) if vals else None

  return {
    "steps": len(train),
    "eval_before": evals[0]["eval_accuracy"] if evals else None,
    "eval_final": evals[-1]["eval_accuracy"] if evals else None,
    "reward_last_q": mean("reward_mean", train[-q:]),
    "behav_prox_kl": mean("behav_prox_kl", train),
    "max_rho": max(
      (r.get("max_prox_behav_ratio", 0.0) for r in train), default=None
    ),
    "clip_high": mean("clip_fraction_high", train),
    "tis_truncated": mean("tis_truncated_fraction", train),
    "acr_active": mean("acr_active_fraction", train),
    "changed_codes": mean("quant/quantized_change_fraction", train),
    "update_to_error": mean("quant/update_to_quant_error", train),
    "s_per_step": mean("time_step", train),
  }


def study_table(study: dict) -> list[str]:
  keys = [
    ("eval_before", "acc. before"),
    ("eval_final", "acc. final"),
    ("reward_last_q", "reward last ¼"),
    ("behav_prox_kl", "behav–prox KL"),
    ("max_rho", "max ρ"),
    ("clip_high", "clip high"),
    ("tis_truncated", "ρ > C"),
    ("acr_active", "ACR-active"),
    ("changed_codes", "codes changed / sync"),
    ("update_to_error", "update / quant error"),
    ("s_per_step", "s/step"),
  ]
  lines = [
    "| config | seeds done | steps | " + " | ".join(k[1] for k in keys) + " |",
    "|" + "---|" * (3 + len(keys)),
  ]
  for name, seeds in study["runs"].items():
    done = [
      d
      for d in seeds.values()
      if os.path.exists(os.path.join(d, "summary.json"))
    ]
    if not done:
      partial = [f"{len(_train_rows(d))}" for d in seeds.values()]
      reached = f"{'/'.join(partial)} (partial)" if partial else "not started"
      lines.append(
        f"| `{name}` | 0 | {reached} | " + " | ".join("–" for _ in keys) + " |"
      )
      continue
    sums = [run_summary(d) for d in done]
    cells = []
    for key, _ in keys:
      m, sd, n = sample_mean_std(r[key] for r in sums)
      cells.append(_fmt(m) + (f" ± {_fmt(sd)}" if sd is not None else ""))
    lines.append(
      f"| `{name}` | {len(done)} | {sums[0]['steps']} | "
      + " | ".join(cells)
      + " |"
    )
  return lines


_PANELS = [
  ("reward_mean", "train reward"),
  ("eval_accuracy", "held-out accuracy"),
  ("behav_prox_kl", "behavior–proximal KL"),
  ("max_prox_behav_ratio", "max ρ"),
  ("acr_active_fraction", "ACR-active fraction"),
  ("quant/quantized_change_fraction", "changed-code fraction per sync"),
]


def study_figure(study: dict, png: str, smooth: int = 1) -> bool:
  """One panel per metric: per config the mean over its seeds (line) over
  the steps all of them reached, and the min–max band over seeds (shaded);
  unfinished runs are labelled partial. False if nothing to draw."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  series, partial = {}, {}
  for name, seeds in study["runs"].items():
    # Partial runs are drawn too (a long horizon cut by the session is still
    # a measured curve), and labelled so.
    per_seed = [read_metrics(d) for d in seeds.values()]
    if per_seed:
      series[name] = per_seed
      partial[name] = not all(
        os.path.exists(os.path.join(d, "summary.json")) for d in seeds.values()
      )
  panels = [
    (k, t)
    for k, t in _PANELS
    if any(
      isinstance(r.get(k), (int, float))
      for runs in series.values()
      for rows in runs
      for r in rows
    )
  ]
  if not panels:
    return False
  ncol = min(3, len(panels))
  nrow = -(-len(panels) // ncol)
  fig, axes = plt.subplots(
    nrow, ncol, figsize=(5.5 * ncol, 3.2 * nrow), squeeze=False
  )
  for ax, (key, title) in zip(axes.flat, panels):
    for name, runs in series.items():
      curves = []
      for rows in runs:
        pts = {
          r["step"]: r[key]
          for r in rows
          if isinstance(r.get(key), (int, float))
        }
        curves.append(pts)
      steps = (
        sorted(set.intersection(*[set(c) for c in curves])) if curves else []
      )
      if not steps:
        continue
      ys = np.array([[c[s] for s in steps] for c in curves])
      if smooth > 1 and len(steps) > smooth:
        kernel = np.ones(smooth) / smooth
        ys = np.array([np.convolve(y, kernel, mode="valid") for y in ys])
        steps = steps[smooth - 1 :]
      label = f"{name} ({len(curves)} seed{'s' if len(curves) > 1 else ''}"
      label += ", partial)" if partial[name] else ")"
      (line,) = ax.plot(steps, ys.mean(0), label=label)
      if len(curves) > 1:
        ax.fill_between(
          steps, ys.min(0), ys.max(0), alpha=0.2, color=line.get_color()
        )
    ax.set_title(title)
    ax.set_xlabel("step")
    if key in ("max_prox_behav_ratio", "behav_prox_kl"):
      ax.set_yscale("log")
  for ax in list(axes.flat)[len(panels) :]:
    ax.axis("off")
  axes.flat[0].legend(fontsize=7)
  fig.tight_layout()
  os.makedirs(os.path.dirname(png), exist_ok=True)
  fig.savefig(png, dpi=90)
  plt.close(fig)
  return True


def status_section(studies: dict[str, dict]) -> list[str]:
  lines = [
    "| study | scale | runs done | partial (steps so far) | not started | "
    "CPU s logged | wall s logged |",
    "|---|---|---|---|---|---|---|",
  ]
  for name, st in studies.items():
    setup = st["setup"]
    base = setup.get("base", {})
    planned = len(setup.get("runs", [])) * len(setup.get("seeds", []) or [0])
    done = sum(v == "done" for v in st["status"].values())
    partial = [
      f"{e} ({len(_train_rows(st['paths'][e]))})"
      for e, v in st["status"].items()
      if v == "partial"
    ]
    model = str(config_lib.lookup(base, "model.name", "?"))
    if model.startswith("instrument:"):
      model = "instrument (~1M params, from scratch)"

    # Bases are nested sections or legacy flat keys: read both the same way.
    def get(key, base=base):
      return config_lib.lookup(base, key, "?")

    scale = (
      f"{model}, {get('task.difficulty')}, "
      f"{get('run.steps')} steps × {get('rollout.prompts_per_step')}"
      f"×{get('rollout.group_size')}, {get('task.eval_size')} held-out"
    )
    machine = st["setup"].get("machine", "")
    if machine.startswith("pooled"):
      scale += f"; {machine}"
    elif machine:
      scale += f"; {machine.split(',')[0]}"
    lines.append(
      f"| {name} | {scale} | {done}/{planned} | "
      f"{', '.join(partial) or '–'} | {planned - done - len(partial)} | "
      f"{st['cpu_s']:.0f} | {st['wall_s']:.0f} |"
    )
  return lines


def archive_study(study_dir: str, dest: str) -> None:
  """Copies a study's small files (no checkpoints) into `dest`."""
  import shutil

  if os.path.abspath(study_dir) == os.path.abspath(dest):
    return
  os.makedirs(dest, exist_ok=True)
  for name in (
    "ablation.json",
    "table.json",
    "table.md",
    "progress.json",
    "cpu_log.jsonl",
  ):
    if os.path.exists(os.path.join(study_dir, name)):
      shutil.copy(os.path.join(study_dir, name), os.path.join(dest, name))
  for entry in sorted(os.listdir(study_dir)):
    run = os.path.join(study_dir, entry)
    if not os.path.isfile(os.path.join(run, "metrics.jsonl")):
      continue
    os.makedirs(os.path.join(dest, entry), exist_ok=True)
    for name in os.listdir(run):
      if name in ("metrics.jsonl", "config.json", "summary.json") or (
        name.startswith("eval_step") and name.endswith(".jsonl")
      ):
        shutil.copy(os.path.join(run, name), os.path.join(dest, entry, name))


def figures_section(
  ablation_dir: str, rows: list[dict], out_path: str, figure_specs: list[str]
) -> list[str]:
  fig_dir = os.path.join(os.path.dirname(out_path), "figures", "qurl")
  os.makedirs(fig_dir, exist_ok=True)
  lines = []
  for spec in figure_specs:
    fig_name, names = spec.split(":", 1)
    runs, labels = [], []
    for name in names.split(","):
      for r in rows:
        if r["name"] == name:
          runs.append(os.path.join(ablation_dir, f"{name}_s{r['seed']}"))
          labels.append(f"{name} s{r['seed']}")
    if not runs:
      continue
    png = os.path.join(fig_dir, f"{fig_name}.png")
    cmd = [
      sys.executable,
      os.path.join(_HERE, "plot_run.py"),
      f"--runs={','.join(runs)}",
      f"--labels={','.join(labels)}",
      f"--out={png}",
      "--smooth=3",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rel = os.path.relpath(png, os.path.dirname(out_path))
    shown = shlex.join(["python", "experiments/plot_run.py"] + cmd[2:])
    lines += [
      f"### {fig_name}",
      "",
      f"![{fig_name}]({rel})",
      "",
      f"`{shown}`",
      "",
    ]
  return lines


def bench_section(bench_path: str) -> list[str]:
  with open(bench_path) as f:
    rows = json.load(f)
  if not rows:
    return ["(the benchmark wrote no rows)"]
  r0 = rows[0]
  lines = [
    f"Shape: {r0['prompts']} prompts × {r0['samples']} samples × "
    f"{r0['new_tokens']} new tokens (no stop tokens, temperature 1).",
    "",
    "| engine | weights | tokens/s | × bf16 (same engine) | "
    "× f32 (JAX) | weight sync s | sync MB | KL to f32 |",
    "|---|---|---|---|---|---|---|---|",
  ]
  f32 = next(
    (r for r in rows if r["engine"] == "jax" and r["quant"] == "f32"), None
  )
  for r in rows:
    bf16 = next(
      (b for b in rows if b["engine"] == r["engine"] and b["quant"] == "bf16"),
      None,
    )
    x_bf16 = r["tokens_per_s"] / bf16["tokens_per_s"] if bf16 else None
    x_f32 = r["tokens_per_s"] / f32["tokens_per_s"] if f32 else None
    kl = r["kl_exact"] if r.get("kl_exact") is not None else r["kl_k1"]
    kind = "exact" if r.get("kl_exact") is not None else "k1"
    quant = r["quant"] + (
      " (emulated)" if r["quant"] == "fp8" and r["engine"] == "jax" else ""
    )
    lines.append(
      f"| {r['engine']} | {quant} | {_fmt(r['tokens_per_s'])} | "
      f"{_fmt(x_bf16, 2)} | {_fmt(x_f32, 2)} | {_fmt(r['sync_s'])} | "
      f"{_fmt(r['sync_bytes'] / 2**20)} | {_fmt(kl)} ({kind}) |"
    )
  return lines


def machine_lines() -> list[str]:
  cpu = platform.processor() or "unknown"
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  import jax

  return [
    f"- CPU: {cpu}, {os.cpu_count()} cores visible; JAX "
    f"{jax.__version__} on `{jax.default_backend()}`; Python "
    f"{platform.python_version()}.",
    f"- Page generated {datetime.date.today().isoformat()} by "
    "`experiments/qurl_report.py`.",
  ]


def main(argv):
  del argv
  out = _OUT.value
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  archive = _ARCHIVE.value
  studies = {}
  for spec in _STUDIES.value:
    name, _, joined = spec.partition(":")
    paths = joined.split("+") if joined else []
    if not paths or not all(os.path.isdir(p) for p in paths):
      raise app.UsageError(
        f"--studies entry {spec!r}: expected NAME:DIR or NAME:DIR+DIR+... "
        "(a pooled study) with existing DIRs"
      )
    if archive:
      # A pooled study's parts are archived as studies of their own names.
      dests = [
        os.path.join(
          archive, name if len(paths) == 1 else os.path.basename(p.rstrip("/"))
        )
        for p in paths
      ]
      for path, dest in zip(paths, dests):
        archive_study(path, dest)
      paths = dests
    parts = [load_study(p) for p in paths]
    studies[name] = parts[0] if len(parts) == 1 else pool_studies(parts)
  instrument_record = None
  if _INSTRUMENT.value and os.path.exists(_INSTRUMENT.value):
    instrument_record = _read_json(_INSTRUMENT.value)
    if archive:
      import shutil

      dest = os.path.join(archive, "instrument.json")
      if os.path.abspath(dest) != os.path.abspath(_INSTRUMENT.value):
        shutil.copy(_INSTRUMENT.value, dest)
  bench = _BENCH.value
  if bench and archive:
    import shutil

    dest = os.path.join(
      os.path.dirname(archive.rstrip("/")), "bench_rollout.json"
    )
    if os.path.abspath(dest) != os.path.abspath(bench):
      shutil.copy(bench, dest)
  lines = (
    [
      "# QuRL on rljax: quantized rollout, ACR and UAQ",
      "",
      "Generated by `experiments/qurl_report.py` from the archived run "
      "files; no number on this page is typed by hand.",
      "",
      "## Machine",
      "",
    ]
    + machine_lines()
    + [""]
  )
  lines += [
    "## Command",
    "",
    "```bash",
    shlex.join(["python", "experiments/qurl_report.py"] + sys.argv[1:]),
    "```",
    "",
  ]
  # Per directory: a pooled study shares its parts' directories.
  total_cpu = sum(
    {
      d: c for st in studies.values() for d, c in st["cpu_by_dir"].items()
    }.values()
  )
  lines += [
    "## Where the study stands",
    "",
    "Each study is a config under `experiments/configs/`, run "
    "resumably by `experiments/ablate.py` (SmolLM2) or "
    "`experiments/long_horizon.py` (the instrument, "
    "docs/long_horizon.md); rerunning its command continues it. CPU "
    "seconds are those the runs' processes logged "
    "(`cpu_log.jsonl`; a run killed mid-way logs nothing for its lost "
    f"part). Total logged: {total_cpu:,.0f} CPU s.",
    "",
  ]
  lines += status_section(studies) + [""]
  if instrument_record:
    hist = instrument_record.get("history", [])
    lines += [
      "The instrument: a Llama-architecture decoder of "
      f"{instrument_record.get('parameters', 0):,} parameters "
      f"(shape `{json.dumps(instrument_record.get('shape'))}`), "
      "pre-trained from random weights by SFT on "
      f"`{instrument_record['sft']['difficulty']}` arithmetic for "
      f"{instrument_record.get('steps')} steps "
      f"({instrument_record.get('sft_seconds', 0):.0f} s) to held-out "
      f"greedy accuracy {_fmt(instrument_record.get('accuracy'))} "
      f"(SFT history: "
      + ", ".join(f"{h['step']}: {h['accuracy']:.3f}" for h in hist)
      + ").",
      "",
    ]
  rates = []
  for path in _BASE_RATES.value:
    rates += _read_json(path, [])
  if rates:
    lines += [
      "### Base rates (choosing a task with headroom)",
      "",
      "Greedy held-out accuracy of the untrained model "
      "(`experiments/base_rate.py`, the trainer's evaluation path); "
      "the issue asks for a start between 15% and 40%.",
      "",
      "| model | difficulty | problems | max new tokens | accuracy | wall s |",
      "|---|---|---|---|---|---|",
    ]
    for r in rates:
      lines.append(
        f"| {r['model']} | `{r['difficulty']}` | {r['problems']} | "
        f"{r['max_new_tokens']} | {_fmt(r['accuracy'])} | "
        f"{_fmt(r['wall_s'])} |"
      )
    lines.append("")
  claim_lines, claims = claims_section(studies)
  lines += ["## Verdicts", ""]
  for q, text in QUESTIONS.items():
    lines.append(f"- **Q{q}.** {text}")
  lines += [""] + claim_lines + [""]
  if _READING.value:
    with open(_READING.value) as f:
      lines += ["## Reading", "", f.read().strip(), ""]
  fig_dir = os.path.join(os.path.dirname(out), "figures", "qurl")
  for name, st in studies.items():
    lines += [f"## Study `{name}`", ""]
    comment = ""
    if st["setup"].get("base"):
      base = st["setup"]["base"]
      lines.append(
        "Shared settings: "
        + ", ".join(f"`{k}={v}`" for k, v in base.items())
        + "."
      )
      lines.append("")
    lines += [
      "Mean ± sample std over the finished seeds; per-step means "
      "over each run's steps; ACR-active = fraction of tokens whose "
      "outcome ACR's enlarged bound changed against plain TIS.",
      "",
    ]
    lines += study_table(st) + [""]
    png = os.path.join(fig_dir, f"{name}.png")
    if study_figure(st, png, smooth=_SMOOTH.value):
      rel = os.path.relpath(png, os.path.dirname(out))
      lines += [
        f"![{name}]({rel})",
        "",
        "Lines: mean over seeds (over the steps every seed reached; "
        "runs the session did not finish are labelled partial); "
        "bands: min–max over seeds.",
        "",
      ]
    del comment
  if _ABLATION.value and os.path.isdir(_ABLATION.value):
    with open(os.path.join(_ABLATION.value, "table.json")) as f:
      rows = json.load(f)
    table, _ = ablation_section(_ABLATION.value, rows, _REFERENCE.value)
    lines += [
      "## Earlier study: one seed, 12 steps (SmolLM2, easy arithmetic)",
      "",
      "Kept as it was measured (before this page had seeds or "
      "intervals); see docs/qurl_reading.md for its reading.",
      "",
    ]
    lines += table + [""]
    lines += figures_section(_ABLATION.value, rows, out, _FIGURES.value)
  if bench:
    lines += ["## Rollout speed", ""] + bench_section(bench) + [""]
  if archive:
    lines += [
      "## Data",
      "",
      f"The files this page is built from are under `{archive}`; "
      "regenerate it from them with `--studies=NAME:"
      f"{archive}/NAME,... --archive=''`.",
      "",
    ]
  with open(out, "w") as f:
    f.write("\n".join(lines).rstrip() + "\n")
  with open(os.path.splitext(out)[0] + ".json", "w") as f:
    json.dump({"claims": claims, "cpu_s": total_cpu}, f, indent=1)
  print(f"wrote {out}")


if __name__ == "__main__":
  app.run(main)
