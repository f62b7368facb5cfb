"""The page's sections other than the claims, and its figures: the earlier
ablation's table, each study's table and figure, where the studies stand,
the ablation's figures, rollout speed, and the machine."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

import numpy as np

from rljax.train import config as config_lib
from rljax.train.metrics import read_metrics

from qurl_report_lib import gates
from qurl_report_lib.claim_list import REGISTERED
from qurl_report_lib.stats import fmt, mean_std, sample_mean_std
from qurl_report_lib.studies import run_quant_curves, run_summary, train_rows

# experiments/, where plot_run.py is.
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ablation_section(
  ablation_dir: str, rows: list[dict], reference: str
) -> tuple[list[str], dict]:
  setup_path = os.path.join(ablation_dir, "ablation.json")
  setup = json.load(open(setup_path)) if os.path.exists(setup_path) else {}
  names = list(dict.fromkeys(r["name"] for r in rows))
  by_name = {n: [r for r in rows if r["name"] == n] for n in names}
  ref = by_name.get(reference, [])
  ref_final, _ = mean_std(r["eval_final"] for r in ref)
  ref_last, _ = mean_std(r["reward_last_q"] for r in ref)
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
    final, final_sd = mean_std(r["eval_final"] for r in rs)
    last, last_sd = mean_std(r["reward_last_q"] for r in rs)

    def cell(key, rs=rs):
      m, s = mean_std(r.get(key) for r in rs)
      return fmt(m) + (f" ± {fmt(s)}" if len(rs) > 1 and s is not None else "")

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
          fmt(
            float(
              cfg.get("rollout.uaq_scale", base.get("rollout.uaq_scale", 1))
            ),
            1,
          ),
          cell("eval_before"),
          fmt(final) + (f" ± {fmt(final_sd)}" if len(rs) > 1 else ""),
          fmt(d_final) if name != reference else "0",
          cell("eval_best"),
          cell("reward_first_q"),
          fmt(last) + (f" ± {fmt(last_sd)}" if len(rs) > 1 else ""),
          fmt(d_last) if name != reference else "0",
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
      return mean_std(c[key] for c in curves)[0]

    lines.append(
      f"| `{name}` | {fmt(avg('quant/normalized_weight_update'))} | "
      f"{fmt(avg('quant/normalized_quant_error'))} | "
      f"{fmt(avg('quant/update_to_quant_error'))} | "
      f"{fmt(avg('quant/quantized_change_fraction'))} |"
    )
  return lines, summary


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
    ("acr_grad_share", "ACR grad share"),
    ("changed_codes", "codes changed / sync"),
    ("update_to_error", "update / quant error"),
    ("version_lag", "version lag"),
    ("version_mixed", "mixed-version responses"),
    ("s_per_step", "s/step"),
  ]
  lines = [
    "| config | UAQ s | updates/rollout | seeds done | steps | "
    + " | ".join(k[1] for k in keys)
    + " |",
    "|" + "---|" * (5 + len(keys)),
  ]
  for name, seeds in study["runs"].items():
    # What the trainer applied (gates.effective_config), not the name.
    cfgs = [gates.effective_config(d) for d in seeds.values()]
    uaq = "/".join(sorted({f"{c['rollout.uaq_scale']:g}" for c in cfgs})) or "–"
    updates = (
      "/".join(sorted({str(gates.updates_per_rollout(c)) for c in cfgs})) or "–"
    )
    done = [
      d
      for d in seeds.values()
      if os.path.exists(os.path.join(d, "summary.json"))
    ]
    if not done:
      partial = [f"{len(train_rows(d))}" for d in seeds.values()]
      reached = f"{'/'.join(partial)} (partial)" if partial else "not started"
      lines.append(
        f"| `{name}` | {uaq} | {updates} | 0 | {reached} | "
        + " | ".join("–" for _ in keys)
        + " |"
      )
      continue
    sums = [run_summary(d) for d in done]
    cells = []
    for key, _ in keys:
      m, sd, n = sample_mean_std(r[key] for r in sums)
      cells.append(fmt(m) + (f" ± {fmt(sd)}" if sd is not None else ""))
    lines.append(
      f"| `{name}` | {uaq} | {updates} | {len(done)} | {sums[0]['steps']} | "
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
  ("acr_grad_share", "ACR gradient share"),
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
    "| study | scale | registered | runs done | partial (steps so far) | "
    "not started | CPU s logged | wall s logged |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for name, st in studies.items():
    setup = st["setup"]
    base = setup.get("base", {})
    planned = len(setup.get("runs", [])) * len(setup.get("seeds", []) or [0])
    done = sum(v == "done" for v in st["status"].values())
    partial = [
      f"{e} ({len(train_rows(st['paths'][e]))})"
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
      f"| {name} | {scale} | {REGISTERED.get(name, '–')} | {done}/{planned} | "
      f"{', '.join(partial) or '–'} | {planned - done - len(partial)} | "
      f"{st['cpu_s']:.0f} | {st['wall_s']:.0f} |"
    )
  return lines


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
      f"| {r['engine']} | {quant} | {fmt(r['tokens_per_s'])} | "
      f"{fmt(x_bf16, 2)} | {fmt(x_f32, 2)} | {fmt(r['sync_s'])} | "
      f"{fmt(r['sync_bytes'] / 2**20)} | {fmt(kl)} ({kind}) |"
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
