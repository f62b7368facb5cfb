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
The pieces are in experiments/qurl_report_lib/ (its __init__ lists them);
the statistics and the verdict rule are described in its stats.py.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qurl_report_lib import family  # noqa: E402
from qurl_report_lib import gates  # noqa: E402
from qurl_report_lib import replay as replay_lib  # noqa: E402
from qurl_report_lib.claim_list import DEVIATIONS, QUESTIONS  # noqa: E402
from qurl_report_lib.claims import json_row, render  # noqa: E402
from qurl_report_lib.fair_test import fair_test_section  # noqa: E402
from qurl_report_lib.sections import (  # noqa: E402
  ablation_section,
  bench_section,
  figures_section,
  machine_lines,
  status_section,
  study_figure,
  study_table,
)
from qurl_report_lib.stats import fmt, rule_lines  # noqa: E402
from qurl_report_lib.studies import (  # noqa: E402
  archive_study,
  load_study,
  pool_studies,
  read_json,
)

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
_REPLAYS = flags.DEFINE_list(
  "replays",
  [],
  "replay.json files of experiments/qurl_replay.py (archived under "
  "docs/qurl/replay/), rendered as the mechanism replay section.",
)
_ARCHIVE = flags.DEFINE_string(
  "archive",
  "docs/qurl/runs",
  "Copy each study's small files (metrics, configs, summaries, per-problem "
  "held-out records; no checkpoints) to <archive>/<study>, and build the "
  "page from there ('' = read the studies where they are).",
)


_CALIBRATE = flags.DEFINE_string(
  "calibrate",
  "",
  "A calibration study's out_dir (q9_acr_long_calibration.json): print "
  "each cap's TIS truncation and the C the registered rule picks, and exit.",
)


def main(argv):
  del argv
  if _CALIBRATE.value:
    caps = gates.calibration_caps(load_study(_CALIBRATE.value))
    for cap, v in sorted(caps.items()):
      print(f"C = {cap:g}: tis_truncated_fraction {v:.4f}")
    print(f"picked C = {gates.pick_cap(caps):g}")
    return
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
    instrument_record = read_json(_INSTRUMENT.value)
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
  lines += ["## Verdict rules", ""] + rule_lines() + [""]
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
      f"greedy accuracy {fmt(instrument_record.get('accuracy'))} "
      f"(SFT history: "
      + ", ".join(f"{h['step']}: {h['accuracy']:.3f}" for h in hist)
      + ").",
      "",
    ]
  rates = []
  for path in _BASE_RATES.value:
    rates += read_json(path, [])
  if rates:
    lines += [
      "### Base rates (choosing a task with headroom)",
      "",
      "Greedy held-out accuracy of the untrained model "
      "(`experiments/base_rate.py`, the trainer's evaluation path); "
      "a start between 15% and 40% leaves RL room to learn.",
      "",
      "| model | difficulty | problems | max new tokens | accuracy | wall s |",
      "|---|---|---|---|---|---|",
    ]
    for r in rates:
      lines.append(
        f"| {r['model']} | `{r['difficulty']}` | {r['problems']} | "
        f"{r['max_new_tokens']} | {fmt(r['accuracy'])} | "
        f"{fmt(r['wall_s'])} |"
      )
    lines.append("")
  result = family.page(studies)
  claims = result["claims"]
  lines += ["## Verdicts", ""]
  for q, text in QUESTIONS.items():
    lines.append(f"- **Q{q}.** {text}")
  lines += [""] + render(claims, result["tests"]) + [""]
  lines += ["## Deviations from the registered plans", ""]
  lines += [f"- {d}" for d in DEVIATIONS] + [""]
  fair = fair_test_section(studies, claims, result["slopes"])
  if fair:
    lines += [
      "## Questions 6, 7 and 9: each verdict beside its exposure",
      "",
      "Q6's and Q9's readouts were fixed before their runs "
      "(`experiments/configs/q6_acr_fair.json`, `_comment`; "
      "docs/qurl/prereg_q9_acr_long.md): per format, ACR − TIS in the "
      "least-squares slope over steps of `behav_prox_kl` (one difference "
      "per seed, tested as a decrease below 0: no margin was registered) "
      "and in the held-out readout, both under the rules above. ACR can "
      "act only with several updates per rollout; its exposure is printed "
      "beside each verdict. Q7's exposure is UAQ's: the share of quantized "
      "codes a sync changes and the update / quantization-error ratio.",
      "",
    ] + fair
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
      "outcome ACR's enlarged bound changed against plain TIS. UAQ s: "
      "the scale the trainer applied; updates/rollout: "
      "`update.ppo_epochs × update.minibatches` (1: R ≡ 1, so ACR is "
      "TIS); ACR grad share: `acr_grad_share` (rljax/core/exposure.py), "
      "– for runs made before it was logged.",
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
        "runs not finished yet are labelled partial); "
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
  if _REPLAYS.value:
    lines += ["## Mechanism replay (ACR against TIS on frozen batches)", ""]
    lines += replay_lib.page_section(_REPLAYS.value) + [""]
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
    json.dump(
      {
        "claims": [json_row(c) for c in claims],
        "slopes": [json_row(r) for r in result["slopes"]],
        "tests": result["tests"],
        "cpu_s": total_cpu,
      },
      f,
      indent=1,
    )
  print(f"wrote {out}")


if __name__ == "__main__":
  app.run(main)
