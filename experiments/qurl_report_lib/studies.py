"""A study's run files on disk: loading a study directory, pooling studies
of disjoint seeds, archiving the small files, and per-run summaries of
`metrics.jsonl` and the held-out records."""

from __future__ import annotations

import functools
import gzip
import json
import os
import re

import numpy as np

from rljax.train.metrics import has_metrics, read_metrics


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


def is_gpu(machine: str) -> bool:
  """True if a study's `machine` line names an accelerator (whose runs are
  not bit-reproducible, unlike the CPU's)."""
  # Whole words: "output" holds "tpu".
  return bool(
    re.search(r"\b(nvidia|gpu|h100|h200|tpu|cuda)\b", machine.lower())
  )


def read_json(path, default=None):
  if not os.path.exists(path):
    return default
  with open(path) as f:
    return json.load(f)


def load_study(study_dir: str) -> dict:
  """{setup, progress, cpu_s, runs: {name: {seed: run_dir}}, status} of a
  study directory, from what is on disk."""
  setup = read_json(os.path.join(study_dir, "ablation.json"), {})
  names = [r["name"] for r in setup.get("runs", [])]
  runs: dict[str, dict[int, str]] = {n: {} for n in names}
  status: dict[str, str] = {}
  paths: dict[str, str] = {}
  for entry in (
    sorted(os.listdir(study_dir)) if os.path.isdir(study_dir) else []
  ):
    run_dir = os.path.join(study_dir, entry)
    if not has_metrics(run_dir):
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
  seeds = {s for by_seed in runs.values() for s in by_seed}
  return {
    "dir": study_dir,
    "gpu_seeds": seeds if is_gpu(setup.get("machine", "")) else set(),
    "setup": setup,
    "runs": runs,
    "status": status,
    "paths": paths,
    "progress": read_json(os.path.join(study_dir, "progress.json"), {}),
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
    # The seeds the part planned (its ablation.json) and those on disk.
    part_seeds = sorted(
      {s for by_seed in part["runs"].values() for s in by_seed}
      | {int(s) for s in part["setup"].get("seeds", [])}
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
    "gpu_seeds": set().union(*(p["gpu_seeds"] for p in parts)),
    "setup": setup,
    "runs": runs,
    "status": status,
    "paths": paths,
    "progress": {},
    "cpu_s": sum(p["cpu_s"] for p in parts),
    "wall_s": sum(p["wall_s"] for p in parts),
    "cpu_by_dir": cpu_by_dir,
  }


@functools.lru_cache(maxsize=None)
def _readout(run_dir: str, k: int) -> tuple[tuple, tuple]:
  scores, steps = _readout_scores(run_dir, k)
  return tuple(sorted(scores.items())), tuple(steps)


def readout_scores(run_dir: str, k: int) -> tuple[dict[str, float], list[int]]:
  """`_readout_scores`, cached: every claim on a run reads the same files."""
  scores, steps = _readout(run_dir, k)
  return dict(scores), list(steps)


def _readout_scores(run_dir: str, k: int) -> tuple[dict[str, float], list[int]]:
  """({problem uid: mean of `correct` over the run's last k held-out
  evaluations}, their steps) of a finished run; ({}, []) if it is not
  finished or kept no records. A run that kept fewer than k evaluations
  (the archived runs kept only the final one) uses those it has: the
  steps say which."""
  if not os.path.exists(os.path.join(run_dir, "summary.json")):
    return {}, []
  from rljax.study import read_eval_records

  recs = read_eval_records(run_dir)
  steps = [s for s in sorted(recs) if s > 0][-k:]
  if not steps:
    return {}, []
  per_step = [{r["uid"]: float(r["correct"]) for r in recs[s]} for s in steps]
  uids = set.intersection(*(set(p) for p in per_step))
  scores = {u: float(np.mean([p[u] for p in per_step])) for u in uids}
  return scores, steps


def final_scores(run_dir: str) -> dict[str, float] | None:
  """{problem uid: correct} of a finished run's last held-out records."""
  scores, _ = readout_scores(run_dir, 1)
  return scores or None


def train_rows(run_dir: str) -> list[dict]:
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
    "acr_grad_share": mean("acr_grad_share", train),
    "changed_codes": mean("quant/quantized_change_fraction", train),
    "update_to_error": mean("quant/update_to_quant_error", train),
    "version_lag": mean("version_lag_mean", train),
    "version_mixed": mean("version_mixed_fraction", train),
    "s_per_step": mean("time_step", train),
  }


def driver_summary(study_dir: str) -> tuple[str, dict] | None:
  """(path, contents) of the JSON summary experiments/gpu/qurl_study.py
  wrote beside the study (`{"jobs": {"<study>/<run>": ...}, "machine": ...}`,
  in the study's parent or grandparent), or None."""
  study = os.path.basename(os.path.abspath(study_dir))
  parent = os.path.dirname(os.path.abspath(study_dir))
  for folder in (parent, os.path.dirname(parent)):
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
      path = os.path.join(folder, name)
      if not name.endswith(".json") or not os.path.isfile(path):
        continue
      try:
        data = read_json(path, {})
      except ValueError:
        continue
      jobs = data.get("jobs") if isinstance(data, dict) else None
      if isinstance(jobs, dict) and any(
        k.startswith(f"{study}/") for k in jobs
      ):
        return path, data
  return None


def archive_study(study_dir: str, dest: str) -> None:
  """Copies a study's small files (no checkpoints, no plots) into `dest`.

  A study merged by experiments/gpu/qurl_study.py keeps the first job's
  `ablation.json` (one seed, no machine): the archived copy gets the seeds
  found on disk and the driver summary's `machine` line (what makes its
  seeds GPU seeds, `load_study`), and the summary and the instrument's
  record beside it are archived as `driver.json` and `instrument.json`.
  """
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
  found = driver_summary(study_dir)
  if found is not None:
    path, data = found
    with open(os.path.join(dest, "driver.json"), "w") as f:
      json.dump(data, f, indent=1)
    record = os.path.join(os.path.dirname(path), "instrument.json")
    if os.path.exists(record):
      shutil.copy(record, os.path.join(dest, "instrument.json"))
    setup = read_json(os.path.join(dest, "ablation.json"), {})
    if not setup.get("machine") and data.get("machine"):
      setup["machine"] = (
        f"{data['machine']} (experiments/gpu/qurl_study.py, whose "
        "docstring lists the XLA flags)"
      )
    seeds = sorted(
      {
        int(e.rpartition("_s")[2])
        for e in os.listdir(study_dir)
        if e.rpartition("_s")[2].isdigit()
        and has_metrics(os.path.join(study_dir, e))
      }
    )
    if seeds:
      setup["seeds"] = seeds
    with open(os.path.join(dest, "ablation.json"), "w") as f:
      json.dump(setup, f, indent=1)
  for entry in sorted(os.listdir(study_dir)):
    run = os.path.join(study_dir, entry)
    if not has_metrics(run):
      continue
    os.makedirs(os.path.join(dest, entry), exist_ok=True)
    for name in os.listdir(run):
      if name == "metrics.jsonl":
        # Stored compressed (~10x): read_metrics reads either form. A run
        # still training may be mid-line: only whole lines are archived.
        with open(os.path.join(run, name), "rb") as src:
          data = src.read()
        with gzip.open(os.path.join(dest, entry, name + ".gz"), "wb") as out:
          out.write(data[: data.rfind(b"\n") + 1])
      elif name.startswith("eval_step") and name.endswith(".jsonl"):
        # Per-problem records, compressed too (rljax.study reads both).
        with open(os.path.join(run, name), "rb") as src:
          with gzip.open(os.path.join(dest, entry, name + ".gz"), "wb") as out:
            shutil.copyfileobj(src, out)
      elif name in ("metrics.jsonl.gz", "config.json", "summary.json") or (
        name.startswith("eval_step") and name.endswith(".jsonl.gz")
      ):
        shutil.copy(os.path.join(run, name), os.path.join(dest, entry, name))
