"""Plots of one or several runs' metrics.jsonl (library side of
experiments/plot_run.py).

One figure, one panel per quantity: reward, held-out accuracy, clip fraction,
behavior-vs-proximal KL and max ρ, normalized weight update vs quantization
error (QuRL Fig. 9), response length and the time per phase. Runs are
overlaid; a panel is left out when no run logged its metric.
"""

from __future__ import annotations

import os
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rljax.train.metrics import has_metrics, read_metrics  # noqa: E402

# (title, [(metric key, line style)], log scale). A style is a matplotlib
# linestyle (name or dash tuple); the keys of one panel never share one.
PANELS = [
  ("reward (mean)", [("reward_mean", "-")], False),
  ("held-out accuracy", [("eval_accuracy", "-")], False),
  (
    "clip fraction",
    [("clip_fraction_low", "--"), ("clip_fraction_high", "-")],
    False,
  ),
  ("behavior-proximal KL", [("behav_prox_kl", "-")], False),
  ("max ρ = π_prox/π_behav", [("max_prox_behav_ratio", "-")], True),
  (
    "weight update vs quant. error",
    [
      ("quant/normalized_kernel_update", "-"),
      ("quant/normalized_quant_error", "--"),
    ],
    True,
  ),
  ("response length", [("response_length_mean", "-")], False),
  (
    "seconds per phase",
    [
      ("time_rollout", "-"),
      ("time_reward", ":"),
      ("time_logprobs", "-."),
      ("time_update", "--"),
      ("time_sync", (0, (6, 2, 1, 2, 1, 2))),  # dash-dot-dot
    ],
    False,
  ),
]
# The y axis of each panel.
Y_LABELS = {
  "reward (mean)": "mean reward",
  "held-out accuracy": "accuracy",
  "clip fraction": "fraction of tokens",
  "behavior-proximal KL": "KL (k3), nats/token",
  "max ρ = π_prox/π_behav": "max ratio",
  "weight update vs quant. error": "relative norm",
  "response length": "tokens",
  "seconds per phase": "seconds",
}
# One marker per run, so runs whose lines coincide stay visible (with the
# small step offset below).
MARKERS = ("o", "s", "^", "v", "D", "x", "P", "*")


def moving_average(values: Sequence[float], window: int) -> list[float]:
  """The trailing mean over `window` points (fewer at the start)."""
  if window <= 1:
    return list(values)
  out, acc = [], []
  for v in values:
    acc.append(v)
    if len(acc) > window:
      acc.pop(0)
    out.append(sum(acc) / len(acc))
  return out


def plot_runs(
  run_dirs: Sequence[str],
  out_path: str,
  labels: Sequence[str] | None = None,
  smooth: int = 1,
) -> list[str]:
  """Writes the figure; returns the titles of the panels drawn."""
  runs = []
  for d in run_dirs:
    if not has_metrics(d):
      raise FileNotFoundError(
        f"run directory {d!r} has no metrics.jsonl (nor metrics.jsonl.gz)"
      )
    runs.append(read_metrics(d))
  labels = (
    list(labels)
    if labels
    else [os.path.basename(os.path.normpath(d)) for d in run_dirs]
  )
  if len(labels) != len(runs):
    raise ValueError(f"--labels has {len(labels)} entries for {len(runs)} runs")
  drawn = [
    p
    for p in PANELS
    if any(any(k in r for r in rows for k, _ in p[1]) for rows in runs)
  ]
  if not drawn:
    raise ValueError(f"no known metric in {list(run_dirs)}")
  ncol = 2 if len(drawn) > 1 else 1
  nrow = (len(drawn) + ncol - 1) // ncol
  fig, axes = plt.subplots(
    nrow,
    ncol,
    figsize=(9.5 * ncol, 3.2 * nrow),
    squeeze=False,
    layout="constrained",  # room for the legends outside the axes
  )
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  # Runs that logged the same numbers would hide each other: each run is
  # shifted by a small fraction of a step and has its own marker.
  offsets = [
    0.0 if len(runs) == 1 else 0.15 * (i / (len(runs) - 1) - 0.5)
    for i in range(len(runs))
  ]
  for ax, (title, keys, log) in zip(axes.flat, drawn):
    if title == "seconds per phase" and len(runs) > 2:
      keys = [k for k in keys if k[0] in ("time_rollout", "time_update")]
    smoothed = False
    for i, (rows, label) in enumerate(zip(runs, labels)):
      for key, style in keys:
        pts = [
          (r["step"], r[key])
          for r in rows
          if isinstance(r.get(key), (int, float))
        ]
        if not pts:
          continue
        xs, ys = zip(*pts)
        if log:
          ys = [max(y, 1e-12) for y in ys]
        name = label if len(keys) == 1 else f"{label}: {key}"
        # Evaluations are a few sparse points: a moving average would blend
        # them into values that were never measured.
        window = 1 if key.startswith("eval_") else smooth
        smoothed |= window > 1 and len(ys) > 1
        ax.plot(
          [x + offsets[i] for x in xs],
          moving_average(ys, window),
          linestyle=style,
          marker=MARKERS[i % len(MARKERS)],
          markersize=3.5,
          markevery=max(1, len(xs) // 20),
          color=colors[i % len(colors)],
          label=name,
        )
    # Said on the panel, since the table's numbers are not smoothed.
    ax.set_title(
      title + (f" (moving average, {smooth} steps)" if smoothed else "")
    )
    ax.set_xlabel("step")
    ax.set_ylabel(Y_LABELS.get(title, ""))
    if log:
      ax.set_yscale("log")
    ax.grid(alpha=0.3)
    # Outside the axes: a legend never covers the data.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  for ax in list(axes.flat)[len(drawn) :]:
    ax.axis("off")
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  fig.savefig(out_path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return [p[0] for p in drawn]
