"""bench_rollout.py's tables, ratios and plot: a Markdown report that names
the machine that measured the rows, one table per shape with every ratio
against its target, and tokens/s against batch per engine x format."""

from __future__ import annotations

import os

from bench_rollout_lib.rows import find as _find


def ratios(rows: list[dict]) -> list[tuple[str, float, str]]:
  """(what, value, target) for every ratio these rows allow: JAX over vLLM
  at the same precision, each engine's INT8 over its best float format,
  and each row's weight-sync time."""
  out = []
  for jq, vq in (("bf16", "bf16"), ("int8", "int8"), ("int8h", "int8")):
    j, v = _find(rows, "jax", jq), _find(rows, "vllm", vq)
    if j and v:
      out.append(
        (
          f"JAX {jq} / vLLM {vq} tok/s",
          j["tokens_per_s"] / v["tokens_per_s"],
          ">= 1 (stretch 2)",
        )
      )
      if j.get("tokens_per_cpu_s") and v.get("tokens_per_cpu_s"):
        out.append(
          (
            f"JAX {jq} / vLLM {vq} tok per CPU-s",
            j["tokens_per_cpu_s"] / v["tokens_per_cpu_s"],
            "(load-independent view of the same ratio)",
          )
        )
  for engine in ("jax", "vllm"):
    full = [
      r for r in (_find(rows, engine, "f32"), _find(rows, engine, "bf16")) if r
    ]
    if not full:
      continue
    best = max(full, key=lambda r: r["tokens_per_s"])
    for q in ("int8", "int8h"):
      r = _find(rows, engine, q)
      if r:
        out.append(
          (
            f"{engine} {q} / best of f32,bf16 ({best['quant']}) tok/s",
            r["tokens_per_s"] / best["tokens_per_s"],
            f">= 1.5 at batch >= 64 (KL {r['kl_to_full_precision']:.2e})",
          )
        )
  for r in rows:
    out.append(
      (f"{r['engine']} {r['quant']} weight sync s", r["sync_s"], "< 0.5")
    )
  return out


def format_table(rows: list[dict]) -> list[str]:
  """Markdown table of one shape's rows."""
  lines = [
    "| engine | quant | P x N x T | tok/s | tok/CPU-s | x f32 | sync s |"
    " sync MB | sync phases | KL to f32 | KL k1 | load |",
    "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
  ]
  f32 = _find(rows, "jax", "f32")
  for r in rows:
    vs = r["tokens_per_s"] / f32["tokens_per_s"] if f32 else float("nan")
    phases = " ".join(
      f"{k[:-2]}={v:.2f}"
      for k, v in r.get("sync_phases", {}).items()
      if k != "seconds"
    )
    lines.append(
      f"| {r['engine']} | {r['quant']} | {r['prompts']}x{r['samples']}x"
      f"{r['new_tokens']} | {r['tokens_per_s']:.1f} | "
      f"{r.get('tokens_per_cpu_s', float('nan')):.1f} | {vs:.2f} | "
      f"{r['sync_s']:.3f} | {r['sync_bytes'] / 2**20:.1f} | {phases} | "
      f"{r['kl_to_full_precision']:.2e} | {r['kl_k1']:.2e} | "
      f"{r.get('load', float('nan')):.1f} |"
    )
  return lines


def report(machine: dict, by_shape: dict[str, list[dict]]) -> list[str]:
  """The whole Markdown report: machine, one table + ratios per shape."""
  flags_ = " ".join(
    f"{k}={'yes' if v else 'no'}" for k, v in machine["cpu_flags"].items()
  )
  lines = [
    f"Machine: {machine['cpu_model']}, {machine['cores']} cores, "
    f"{flags_}; backend {machine['backend']} ({machine['device']}); "
    f"jax {machine['jax']}, jaxlib {machine['jaxlib']}, vLLM "
    f"{machine['vllm']}, torch {machine['torch']}; huge pages "
    f"{machine.get('host_huge_pages', 'not recorded')}.",
    "",
  ]
  if not machine["gpu"]:
    lines += ["No GPU in this run: CPU numbers only.", ""]
    if "int8_dot_beats_bf16" in machine:  # absent from older JSON
      lines += [
        "Dot units (`rljax.quant.cpu`): fast bf16 dot "
        f"{'yes' if machine['fast_bf16_dot'] else 'no'}, int8 dot faster "
        f"than bf16 {'yes' if machine['int8_dot_beats_bf16'] else 'no'}.",
        "",
      ]
    if machine.get("onednn_int8_saturates"):
      lines += [
        "**vLLM INT8 rows ran a saturating kernel**: without VNNI/AMX-INT8 "
        "vLLM-CPU's oneDNN int8 GEMM overflows int16 for codes |w| > 63 "
        "(`CpuInfo.onednn_int8_saturates`); their speed is real, their "
        "KL is not that of the W8A8 model.",
        "",
      ]
  for shape, rows in by_shape.items():
    lines += [f"### {shape} (prompts x samples x new tokens)", ""]
    lines += format_table(rows) + [""]
    for what, value, target in ratios(rows):
      lines.append(f"- {what}: **{value:.2f}** (target {target})")
    lines.append("")
  return lines


def plot_title(machine: dict) -> str:
  """The machine that measured the rows (a GPU's name, else the CPU model):
  a plot redrawn --from_json keeps the title of the run it comes from."""
  where = machine["device"] if machine.get("gpu") else machine["cpu_model"]
  return f"Rollout throughput, {where}"


def plot(machine: dict, by_shape: dict[str, list[dict]], path: str) -> None:
  """tokens/s vs batch (prompts x samples), one line per engine x quant."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  series: dict[str, list[tuple[int, float, int]]] = {}
  for rows in by_shape.values():
    for r in rows:
      series.setdefault(f"{r['engine']} {r['quant']}", []).append(
        (r["prompts"] * r["samples"], r["tokens_per_s"], r["new_tokens"])
      )
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, points in sorted(series.items()):
    points.sort()
    ax.plot(
      [p[0] for p in points],
      [p[1] for p in points],
      "o--" if name.startswith("vllm") else "o-",
      label=name,
    )
  ax.set_xscale("log", base=2)
  lengths = sorted({p[2] for pts in series.values() for p in pts})
  ax.set_xlabel(
    "batch (prompts x samples); new tokens T = "
    + ", ".join(str(t) for t in lengths)
  )
  ax.set_ylabel("generated tokens / s")
  ax.set_title(plot_title(machine))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  print(f"wrote {path}")
