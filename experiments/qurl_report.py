"""Writes docs/qurl_results.md from an ablation directory and a rollout benchmark.

Every number in the page comes from files written by the runs: the
ablation's `table.json` and each run's `metrics.jsonl` (experiments/ablate.py),
and the rows of experiments/bench_rollout.py `--out`. The figures are drawn by
experiments/plot_run.py (run as a subprocess, so the page shows exactly what
a user gets from that script). Hand-written prose comes from --reading and
refers to the tables rather than repeating numbers.

  python experiments/qurl_report.py --ablation_dir=runs/qurl_cpu \
      --bench=runs/bench_rollout.json --reading=docs/qurl_reading.md \
      --out=docs/qurl_results.md
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

from rljax.train.metrics import read_metrics

_ABLATION = flags.DEFINE_string("ablation_dir", "runs/qurl_cpu",
                                "out_dir of experiments/ablate.py.")
_BENCH = flags.DEFINE_string("bench", "", "JSON rows of bench_rollout.py --out.")
_BENCH_CMD = flags.DEFINE_string("bench_command", "",
                                 "The command that produced --bench.")
_ABLATE_CMD = flags.DEFINE_string("ablate_command", "",
                                  "The command that produced --ablation_dir.")
_READING = flags.DEFINE_string("reading", "", "Markdown inserted as the reading.")
_REFERENCE = flags.DEFINE_string("reference", "fp32",
                                 "Run name every Δ is measured against.")
_FIGURES = flags.DEFINE_list(
    "figures",
    ["corrections:fp32,int8_naive,int8_ignore_behavior,int8_tis,int8_acr_uaq1",
     "uaq:fp32,int8_acr_uaq1,int8_acr_uaq1.5,int8_acr_uaq2",
     "fp8:fp32,fp8_tis,fp8_acr,int8_tis,int8_acr_uaq1"],
    "NAME:run,run,... one figure per entry (runs missing from the ablation "
    "are left out).")
_OUT = flags.DEFINE_string("out", "docs/qurl_results.md", "Markdown page.")
_ARCHIVE = flags.DEFINE_string(
    "archive", "docs/qurl/runs",
    "Copy the ablation's tables and every run's metrics/config/summary here "
    "(small files), so the page can be regenerated without the runs "
    "('' = no copy).")

_HERE = os.path.dirname(os.path.abspath(__file__))


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
  for key in ("quant/normalized_weight_update", "quant/normalized_quant_error",
              "quant/update_to_quant_error", "quant/quantized_change_fraction"):
    vals = [r[key] for r in train if isinstance(r.get(key), (int, float))]
    out[key] = float(np.mean(vals)) if vals else None
  return out


def ablation_section(ablation_dir: str, rows: list[dict],
                     reference: str) -> tuple[list[str], dict]:
  setup_path = os.path.join(ablation_dir, "ablation.json")
  setup = json.load(open(setup_path)) if os.path.exists(setup_path) else {}
  names = list(dict.fromkeys(r["name"] for r in rows))
  by_name = {n: [r for r in rows if r["name"] == n] for n in names}
  ref = by_name.get(reference, [])
  ref_final, _ = _mean_std(r["eval_final"] for r in ref)
  ref_last, _ = _mean_std(r["reward_last_q"] for r in ref)
  runs = {r["name"]: r for r in setup.get("runs", [])}
  lines = []
  base = setup.get("base", {})
  if base:
    keys = ["model", "task", "task_difficulty", "algorithm", "prompts_per_step",
            "group_size", "max_new_tokens", "temperature", "learning_rate",
            "minibatches", "steps", "eval_size", "eval_every", "eps_low",
            "eps_high", "tis_cap"]
    lines.append("Shared settings (from `ablation.json`): " + ", ".join(
        f"`{k}={base[k]}`" for k in keys if k in base) + ".")
    lines.append("")
  seeds = sorted({r["seed"] for r in rows})
  lines.append(f"Seeds: {', '.join(map(str, seeds))}. Values are the mean over "
               "seeds (± std when there is more than one). Held-out accuracy "
               "is greedy, on problems the training never sees, evaluated with "
               "full-precision weights. Δ columns are against "
               f"`{reference}`.")
  lines.append("")
  head = ["run", "rollout", "correction", "UAQ s", "acc. before", "acc. final",
          "Δ final", "acc. best", "reward first ¼", "reward last ¼",
          "Δ reward last ¼", "behav–prox KL", "max ρ", "clip low",
          "clip high", "TIS-truncated", "rollout tok/s", "s/step"]
  lines.append("| " + " | ".join(head) + " |")
  lines.append("|" + "---|" * len(head))
  summary = {}
  for name in names:
    rs = by_name[name]
    cfg = runs.get(name, {})
    final, final_sd = _mean_std(r["eval_final"] for r in rs)
    last, last_sd = _mean_std(r["reward_last_q"] for r in rs)

    def cell(key, rs=rs):
      m, s = _mean_std(r.get(key) for r in rs)
      return _fmt(m) + (f" ± {_fmt(s)}" if len(rs) > 1 and s is not None else "")
    d_final = (final - ref_final) if None not in (final, ref_final) else None
    d_last = (last - ref_last) if None not in (last, ref_last) else None
    summary[name] = {"final": final, "delta_final": d_final,
                     "delta_reward_last_q": d_last}
    lines.append("| " + " | ".join([
        f"`{name}`", str(cfg.get("rollout_quant", base.get("rollout_quant", "?"))),
        str(cfg.get("correction", base.get("correction", "?"))),
        _fmt(float(cfg.get("uaq_scale", base.get("uaq_scale", 1.0))), 1),
        cell("eval_before"),
        _fmt(final) + (f" ± {_fmt(final_sd)}" if len(rs) > 1 else ""),
        _fmt(d_final) if name != reference else "0",
        cell("eval_best"), cell("reward_first_q"),
        _fmt(last) + (f" ± {_fmt(last_sd)}" if len(rs) > 1 else ""),
        _fmt(d_last) if name != reference else "0",
        cell("behav_prox_kl"), cell("max_rho"), cell("clip_low"),
        cell("clip_high"), cell("tis_truncated"), cell("rollout_tok_s"),
        cell("s_per_step")]) + " |")
  lines += ["", "Weight update vs quantization error (QuRL Fig. 9; means over "
            "steps of the `quant/*` metrics; the error is measured on the "
            "weights the engine actually received):", ""]
  lines.append("| run | ‖Δθ‖²/‖θ‖² per step (Eq. 13) | ‖Q(θ)−θ‖²/‖θ‖² "
               "(Eq. 14) | update / error (× s² under UAQ) | "
               "quantized values changed per sync |")
  lines.append("|---|---|---|---|---|")
  for name in names:
    curves = [run_quant_curves(os.path.join(ablation_dir, f"{name}_s{r['seed']}"))
              for r in by_name[name]]
    def avg(key, curves=curves):
      return _mean_std(c[key] for c in curves)[0]
    lines.append(f"| `{name}` | {_fmt(avg('quant/normalized_weight_update'))} | "
                 f"{_fmt(avg('quant/normalized_quant_error'))} | "
                 f"{_fmt(avg('quant/update_to_quant_error'))} | "
                 f"{_fmt(avg('quant/quantized_change_fraction'))} |")
  return lines, summary


def figures_section(ablation_dir: str, rows: list[dict], out_path: str,
                    figure_specs: list[str]) -> list[str]:
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
    cmd = [sys.executable, os.path.join(_HERE, "plot_run.py"),
           f"--runs={','.join(runs)}", f"--labels={','.join(labels)}",
           f"--out={png}", "--smooth=3"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rel = os.path.relpath(png, os.path.dirname(out_path))
    shown = shlex.join(["python", "experiments/plot_run.py"] + cmd[2:])
    lines += [f"### {fig_name}", "", f"![{fig_name}]({rel})", "",
              f"`{shown}`", ""]
  return lines


def bench_section(bench_path: str) -> list[str]:
  with open(bench_path) as f:
    rows = json.load(f)
  if not rows:
    return ["(the benchmark wrote no rows)"]
  r0 = rows[0]
  lines = [f"Shape: {r0['prompts']} prompts × {r0['samples']} samples × "
           f"{r0['new_tokens']} new tokens (no stop tokens, temperature 1).",
           "", "| engine | weights | tokens/s | × bf16 (same engine) | "
           "× f32 (JAX) | weight sync s | sync MB | KL to f32 |",
           "|---|---|---|---|---|---|---|---|"]
  f32 = next((r for r in rows if r["engine"] == "jax" and r["quant"] == "f32"),
             None)
  for r in rows:
    bf16 = next((b for b in rows if b["engine"] == r["engine"]
                 and b["quant"] == "bf16"), None)
    x_bf16 = r["tokens_per_s"] / bf16["tokens_per_s"] if bf16 else None
    x_f32 = r["tokens_per_s"] / f32["tokens_per_s"] if f32 else None
    kl = r["kl_exact"] if r.get("kl_exact") is not None else r["kl_k1"]
    kind = "exact" if r.get("kl_exact") is not None else "k1"
    quant = r["quant"] + (" (emulated)" if r["quant"] == "fp8"
                          and r["engine"] == "jax" else "")
    lines.append(f"| {r['engine']} | {quant} | {_fmt(r['tokens_per_s'])} | "
                 f"{_fmt(x_bf16, 2)} | {_fmt(x_f32, 2)} | {_fmt(r['sync_s'])} | "
                 f"{_fmt(r['sync_bytes'] / 2**20)} | {_fmt(kl)} ({kind}) |")
  return lines


def archive_runs(ablation_dir: str, dest: str, bench: str) -> None:
  """Copies what the page is built from (no checkpoints) into `dest`."""
  import shutil
  os.makedirs(dest, exist_ok=True)
  for name in ("table.json", "table.md", "ablation.json"):
    src = os.path.join(ablation_dir, name)
    if os.path.exists(src):
      shutil.copy(src, os.path.join(dest, name))
  for entry in sorted(os.listdir(ablation_dir)):
    run = os.path.join(ablation_dir, entry)
    if not os.path.isfile(os.path.join(run, "metrics.jsonl")):
      continue
    os.makedirs(os.path.join(dest, entry), exist_ok=True)
    for name in ("metrics.jsonl", "config.json", "summary.json"):
      if os.path.exists(os.path.join(run, name)):
        shutil.copy(os.path.join(run, name), os.path.join(dest, entry, name))
  if bench:
    shutil.copy(bench, os.path.join(dest, "bench_rollout.json"))


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
  return [f"- CPU: {cpu}, {os.cpu_count()} cores visible; JAX "
          f"{jax.__version__} on `{jax.default_backend()}`; Python "
          f"{platform.python_version()}.",
          f"- Page generated {datetime.date.today().isoformat()} by "
          "`experiments/qurl_report.py`."]


def main(argv):
  del argv
  out = _OUT.value
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(os.path.join(_ABLATION.value, "table.json")) as f:
    rows = json.load(f)
  table, summary = ablation_section(_ABLATION.value, rows, _REFERENCE.value)
  lines = ["# QuRL on rljax: quantized rollout, ACR and UAQ",
           "",
           "Generated by `experiments/qurl_report.py` from the run files; "
           "no number on this page is typed by hand.", "",
           "## Machine", ""] + machine_lines() + [""]
  lines += ["## Commands", "", "```bash"]
  if _ABLATE_CMD.value:
    lines.append(_ABLATE_CMD.value)
  if _BENCH_CMD.value:
    lines.append(_BENCH_CMD.value)
  lines.append(shlex.join(["python", "experiments/qurl_report.py"]
                          + sys.argv[1:]))
  lines += ["```", "", "## Ablation", ""] + table + [""]
  if _READING.value:
    with open(_READING.value) as f:
      lines += ["## Reading", "", f.read().strip(), ""]
  lines += ["## Figures", "",
            "Panels: reward, held-out accuracy, clip fractions, "
            "behavior–proximal KL, max ρ, weight update vs quantization error "
            "(QuRL Fig. 9), response length, seconds per phase.", ""]
  lines += figures_section(_ABLATION.value, rows, out, _FIGURES.value)
  if _BENCH.value:
    lines += ["## Rollout speed", ""] + bench_section(_BENCH.value) + [""]
  if _ARCHIVE.value and (os.path.abspath(_ARCHIVE.value)
                         != os.path.abspath(_ABLATION.value)):
    archive_runs(_ABLATION.value, _ARCHIVE.value, _BENCH.value)
    lines += ["## Data", "",
              f"The files this page is built from are copied to "
              f"`{_ARCHIVE.value}`; regenerate the page from them with "
              f"`python experiments/qurl_report.py --ablation_dir="
              f"{_ARCHIVE.value} --bench={_ARCHIVE.value}/bench_rollout.json "
              f"--archive=''`.", ""]
  with open(out, "w") as f:
    f.write("\n".join(lines).rstrip() + "\n")
  with open(os.path.splitext(out)[0] + ".json", "w") as f:
    json.dump(summary, f, indent=1)
  print(f"wrote {out}")


if __name__ == "__main__":
  app.run(main)
