"""The --workloads rows of bench_rollout.py as a Markdown table, the ratios
the rollout targets name, and the occupancy/KV plot.

Ratios take each configuration's median useful tokens/s over the repeats:
  JAX / vLLM        per workload and format, the best JAX continuous row
                    (over slot counts and page sizes) against the vLLM row
                    (targets: >= 1.5 on the long tail, >= 1.2 on the real
                    workloads);
  long tail / fixed per format and slot count, the JAX engine's own rates
                    (target: >= 0.8);
  continuous / static per workload, format and configuration;
  peak KV           each continuous row's reserved KV against static's.
"""

from __future__ import annotations

import statistics

TARGETS = {"longtail": 1.5, "real": 1.2, "math500": 1.2}


def _median(
  rows: list[dict], key: tuple, field: str = "useful_tokens_per_s"
) -> float | None:
  values = [
    r[field]
    for r in rows
    if (r["workload"], r["engine"], r.get("batching"), r["quant"]) == key
    and r.get(field) is not None
  ]
  return statistics.median(values) if values else None


def format_rows(rows: list[dict]) -> list[str]:
  """A Markdown table of the rows, then the ratios (module doc)."""
  lines = [
    "| workload | rep | engine | batching | quant | useful tok/s | "
    "tok/CPU-s | occupancy | KV peak MiB | KV held MiB | KV written MiB | "
    "compiles | compile s | mean len | at limit | s | load |",
    "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    "---:|---:|---:|",
  ]
  fmt = lambda v, f: "–" if v is None else format(v, f)
  mib = lambda r, k: None if r.get(k) is None else r[k] / 2**20
  for r in rows:
    lines.append(
      f"| {r['workload']} | {r.get('repeat', 0)} | {r['engine']} | "
      f"{r.get('batching', '–')} | {r['quant']} | "
      f"{r['useful_tokens_per_s']:.1f} | "
      f"{fmt(r.get('tokens_per_cpu_s'), '.1f')} | "
      f"{fmt(r.get('occupancy'), '.2f')} | "
      f"{fmt(mib(r, 'kv_bytes_peak'), '.1f')} | "
      f"{fmt(mib(r, 'kv_bytes_held_peak'), '.1f')} | "
      f"{fmt(mib(r, 'kv_bytes_written_peak'), '.1f')} | "
      f"{fmt(r.get('num_compiles'), 'd')} | {fmt(r.get('compile_s'), '.0f')} "
      f"| {r['mean_length']:.0f} | {fmt(r.get('at_limit'), '.2f')} | "
      f"{r['seconds']:.1f} | {fmt(r.get('load_before'), '.1f')} |"
    )
  return lines + [""] + [f"- {line}" for line in ratios(rows)]


def ratios(rows: list[dict]) -> list[str]:
  out = []
  configs = sorted(
    {
      (r["workload"], r["quant"], r.get("batching"))
      for r in rows
      if r["engine"] == "jax"
    }
  )
  for q in sorted({r["quant"] for r in rows}):
    for w in sorted({r["workload"] for r in rows}):
      vllm = _median(rows, (w, "vllm", None, q))
      static = _median(rows, (w, "jax", "static", q))
      static_row = next(
        (r for r in rows if (r["workload"], r.get("batching"), r["quant"])
         == (w, "static", q)),
        None,
      )  # fmt: skip
      best = None
      for cw, cq, b in configs:
        if (cw, cq) != (w, q) or not b.startswith("continuous"):
          continue
        tps = _median(rows, (w, "jax", b, q))
        if best is None or tps > best[1]:
          best = (b, tps)
        if static:
          out.append(f"{w} {q}: {b} / static = {tps / static:.2f}x")
        row = next(
          r for r in rows
          if (r["workload"], r.get("batching"), r["quant"]) == (w, b, q)
        )  # fmt: skip
        if static_row and row.get("kv_bytes_peak"):
          out.append(
            f"{w} {q}: peak KV {b} / static = "
            f"{row['kv_bytes_peak'] / static_row['kv_bytes_peak']:.2f}"
          )
        if w == "longtail":
          fixed = _median(rows, ("fixed", "jax", b, q))
          if fixed:
            out.append(
              f"longtail {q}: {b} / fixed {b} = {tps / fixed:.2f} "
              "(target >= 0.8)"
            )
      if best and vllm:
        target = TARGETS.get(w)
        out.append(
          f"{w} {q}: JAX {best[0]} / vLLM = {best[1] / vllm:.2f}x"
          + (f" (target >= {target})" if target else "")
        )
        field = "tokens_per_cpu_s"
        mine = _median(rows, (w, "jax", best[0], q), field)
        theirs = _median(rows, (w, "vllm", None, q), field)
        if mine and theirs:
          out.append(
            f"{w} {q}: per CPU-second, JAX {best[0]} / vLLM = "
            f"{mine / theirs:.2f}x"
          )
  return out


def plot_occupancy(rows: list[dict], path: str, title: str) -> None:
  """Per continuous JAX row (first repeat), over the rollout: the live
  share of the decode bucket (left) and the KV bytes the pages in use hold
  (right; thin: what the pool reserves). One colour per workload and
  format, one line style per slot count."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, (ax, kv_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
  drawn = [r for r in rows if r.get("timeline") and not r.get("repeat")]
  kinds = sorted({(r["workload"], r["quant"]) for r in drawn})
  colour = {k: plt.cm.tab10(i % 10) for i, k in enumerate(kinds)}
  styles = sorted({r["batching"] for r in drawn})
  for r in drawn:
    style = dict(
      color=colour[(r["workload"], r["quant"])],
      linestyle=("-", "--", ":", "-.")[styles.index(r["batching"]) % 4],
    )
    t, occ = zip(*r["timeline"])
    ax.plot(
      t, occ, label=f"{r['workload']} {r['batching']} {r['quant']}", **style
    )
    if r.get("kv_timeline"):
      t, held, reserved = zip(*r["kv_timeline"])
      kv_ax.plot(t, [b / 2**20 for b in held], **style)
      kv_ax.plot(t, [b / 2**20 for b in reserved], linewidth=0.6, **style)
  ax.set_xlabel("seconds into the rollout")
  ax.set_ylabel("live rows / rows of the decode bucket (per chunk)")
  ax.set_ylim(0, 1.05)
  ax.set_title(title, fontsize=8)
  ax.legend(fontsize=6, ncol=2)
  kv_ax.set_xlabel("seconds into the rollout")
  kv_ax.set_ylabel("KV MiB held (thin: pool reserved)")
  kv_ax.set_ylim(bottom=0)
  kv_ax.set_title("KV cache: pages held and pool", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
