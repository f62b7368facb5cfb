"""Turns one or several runs' metrics.jsonl into one PNG of plots.

  python experiments/plot_run.py --runs=runs/a,runs/b --out=plots/ab.png

Panels: reward, held-out accuracy, clip fraction (low/high), behavior-proximal
KL, max ρ, normalized weight update vs quantization error (QuRL Fig. 9),
response length, seconds per phase.
"""

from __future__ import annotations

import os

from absl import flags

from rljax.train import cli
from rljax.train.plots import plot_runs

_RUNS = flags.DEFINE_list(
  "runs", None, "Run directories (each has metrics.jsonl)."
)
_OUT = flags.DEFINE_string(
  "out", None, "PNG path; default <first run>/plots.png"
)
_LABELS = flags.DEFINE_list("labels", None, "Legend labels, one per run.")
_SMOOTH = flags.DEFINE_integer(
  "smooth",
  1,
  "Moving-average window in steps (1 = none; a smoothed panel says so in "
  "its title).",
)


def main(argv):
  del argv
  if not _RUNS.value:
    raise cli.UsageError("--runs is required (comma-separated run directories)")
  out = _OUT.value or os.path.join(_RUNS.value[0], "plots.png")
  try:
    titles = plot_runs(_RUNS.value, out, _LABELS.value, _SMOOTH.value)
  except (FileNotFoundError, ValueError) as e:  # a run or label the user gave
    raise cli.UsageError(str(e)) from None
  print(f"wrote {out} ({len(titles)} panels: {', '.join(titles)})")


if __name__ == "__main__":
  cli.run(main)
