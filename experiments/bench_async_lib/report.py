"""bench_async.py's printout (machine, engine placement, one table row per
mode, the lag distributions, the ratios beside their targets) and its plot
(wall per step and idle fractions by mode)."""

from __future__ import annotations

import numpy as np


def fmt(x, spec: str) -> str:
  return "n/a" if x is None else format(x, spec)


def report(result: dict) -> list[str]:
  """The printout: machine, where the engine runs, one row per mode, the
  lag distributions and the ratios beside their targets."""
  m = result["machine"]
  lines = [
    f"machine: {m['cpu_model']}, {m['cores']} cores, flags "
    f"{' '.join(m['cpu_flags']) or 'none'}; {m['backend']} "
    f"({m['device']}); jax {m['jax']}; huge pages {m['host_huge_pages']}",
    f"engine placement: {result['engine_placement']}",
    f"model {result['settings']['model']}, {result['settings']['steps']} "
    f"steps per mode, first {result['settings']['warmup_steps']} left out; "
    f"batching {result['settings']['batching']}, streaming k="
    f"{result['settings']['max_staleness']}",
    "",
    "| mode | wall/step mean s | median s | steps/h | trainer idle | "
    "engine idle | lag mean | lag max | lag>=1 | lag>=4 | untrained tok |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for mode, s in result["modes"].items():
    lines.append(
      f"| {mode} | {fmt(s['wall_per_step_mean_s'], '.3f')} | "
      f"{fmt(s['wall_per_step_median_s'], '.3f')} | "
      f"{fmt(s['steps_per_hour'], '.0f')} | "
      f"{fmt(s['trainer_idle_fraction'], '.2f')} | "
      f"{fmt(s['engine_idle_fraction'], '.2f')} | "
      f"{s['version_lag_mean']:.2f} | {s['version_lag_max']} | "
      f"{s['version_lag_ge1']:.2f} | {s['version_lag_ge4']:.2f} | "
      f"{s['untrained_tokens']} |"
    )
  lines.append("")
  for mode, s in result["modes"].items():
    dist = ", ".join(f"{k}: {n}" for k, n in s["version_lag_tokens"].items())
    lines.append(
      f"{mode}: lag -> tokens {{{dist}}}; idle from {s['idle_source']}; "
      f"untrained: {s['untrained_tokens_queued']} queued at the end, "
      f"{s['untrained_tokens_masked']} masked out"
    )
  if result["ratios"]:
    lines.append("")
  for r in result["ratios"]:
    lines.append(
      f"steps/hour {r['ratio']}: {r['value']:.2f}x (target >= "
      f"{r['target']}x: {'met' if r['met'] else 'missed'})"
    )
  return lines


def plot(result: dict, path: str) -> None:
  """Wall per step by mode (mean bar, per-step dots) and idle fractions."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  modes = list(result["modes"])
  warm = result["settings"]["warmup_steps"]
  x = np.arange(len(modes))
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  means = [result["modes"][m]["wall_per_step_mean_s"] or 0.0 for m in modes]
  ax1.bar(x, means, color="tab:blue", alpha=0.6, label="mean")
  for i, m in enumerate(modes):
    walls = result["modes"][m]["wall_per_step_s"][warm:]
    ax1.plot([i] * len(walls), walls, "k.", ms=3)
  ax1.set_xticks(x, modes, rotation=15)
  ax1.set_ylabel("wall per step (s)")
  ax1.set_title("wall per step (dots: steps)")
  width = 0.38
  for j, (key, label) in enumerate(
    (("trainer_idle_fraction", "trainer"), ("engine_idle_fraction", "engine"))
  ):
    vals = [result["modes"][m][key] for m in modes]
    pos = x + (j - 0.5) * width
    ax2.bar(pos, [v or 0.0 for v in vals], width, label=label)
    for p, v in zip(pos, vals):
      if v is None:
        ax2.text(p, 0.01, "n/a", ha="center", fontsize=8)
  ax2.set_xticks(x, modes, rotation=15)
  ax2.set_ylim(0, 1)
  ax2.set_ylabel("idle fraction of step time")
  ax2.set_title("idle fractions")
  ax2.legend(fontsize=8)
  m = result["machine"]
  fig.suptitle(
    f"{result['settings']['model']} on {m['cpu_model']} ({m['cores']} cores)",
    fontsize=9,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
