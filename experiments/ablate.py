"""Runs a grid of training configurations and writes one table.

  python experiments/ablate.py \
      --grid="rollout.quant=none,int8;loss.correction=tis,acr" \
      --seeds=0,1 --run.steps=20 --out_dir=runs/ablate

or with a checked-in config: a JSON list of {"name": ..., section: {field:
value}} runs, or {"base": {...}, "seeds": [...], "runs": [...]} where "base"
holds the settings every run shares and "seeds" is the default for --seeds.
Fields are nested by section ({"loss": {"eps_high": 0.28}}) or dotted
("loss.eps_high": 0.28), as the flags name them; files written with the
older flat keys ("eps_high") are still read (`config.LEGACY_KEYS`). Every run
resolves through `rljax.train.config.resolve`, lowest first: TrainConfig
defaults, the algorithm's preset, this script's defaults, "base", typed
flags, the grid cell or run entry. A run that sets `algorithm` gets that
preset (a cell algorithm=dapo trains DAPO, not GRPO with a DAPO label), and
`ablation.json` and each run's `config.json` record the resolved config:

  python experiments/ablate.py --configs=experiments/configs/qurl_cpu.json \
      --out_dir=runs/qurl_cpu

Resumable, so a study can run in parts: every run gets its own directory
`<out_dir>/<name>_s<seed>`; rerunning the same command skips the finished
runs (those with `summary.json`), resumes a killed run from its last
checkpoint (the trainer's `resume`; steps after that checkpoint are redone),
and starts the rest. Runs go seed-major by default (every config for seed 0,
then seed 1, ...), so an interrupted study holds complete paired seeds;
`--order=run` keeps the seeds of one config together. `--only=name,...`,
`--max_runs=N` and `--stop_after_s=S` run a part and stop cleanly between
runs. Seeds are a grid axis: `--seeds=0,1,2` or a file's "seeds" key.

The table (`<out_dir>/table.md` and `table.json`) is rebuilt from what is on
disk after every run, including runs finished by earlier invocations and
partial ones (status column). Per run: held-out accuracy before / final /
best, mean reward over the first and last quarter, behavior-proximal KL,
max ρ, clip fractions, the ACR-active fraction, rollout tokens/s and seconds
per step (medians over the steps after the first, which compiles: `_warm`);
and per config, the mean ± std over finished seeds. `plots.png` draws every
finished run unsmoothed, each with its own marker and a small step offset
so that identical runs stay visible. A grid cell's directory name has no
'=' or '.' (`rollout_quant-int8_loss_eps_high-0p28_s0`).
`<out_dir>/progress.json` says how far the study got, and
`<out_dir>/cpu_log.jsonl` records the process CPU seconds of each run this
script trained (a run killed mid-way logs nothing for its lost part) and
its memory: between runs the script drops what the finished run left
(compiled programs, freed heap; `rljax.study.release_memory`).

A run whose `model.name` is `instrument:<dir>` trains the small from-scratch
decoder of experiments/long_horizon.py (`rljax.instrument`) instead of a
pretrained model; everything else is the same.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import resource
import time

from absl import flags
import numpy as np

from rljax import hostmem
from rljax import distributed  # --coordinator_address, ... (multi-host)
from rljax.train import cli
from rljax.train import config as config_lib
from rljax.train import flags as train_flags
from rljax.train import preflight
from rljax.train.config import TrainConfig
from rljax.train.metrics import read_metrics

train_flags.define_train_flags(
  {
    "algorithm": "grpo",
    "task.name": "arithmetic",
    "task.difficulty": "easy",
    "rollout.quant": "int8",
    "run.steps": 20,
    "task.eval_size": 64,
    "run.checkpoint_every": 5,
    "run.export_hf": False,
    "run.run_dir": "runs/ablate",
  }
)
_GRID = flags.DEFINE_string(
  "grid",
  "",
  "Semicolon-separated FIELD=v1,v2 axes over dotted fields "
  "(loss.eps_high=0.2,0.28); the cross product runs.",
)
_CONFIGS = flags.DEFINE_string(
  "configs",
  "",
  "JSON file: a list of {name, section: {field: value}, ...} runs.",
)
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds, each run once per seed.")
_OUT_DIR = flags.DEFINE_string(
  "out_dir", "runs/ablate", "Where runs and the table go."
)
_ORDER = flags.DEFINE_enum(
  "order",
  "seed",
  ["seed", "run"],
  "seed: every config for one seed before the next seed (an interrupted "
  "study holds complete paired seeds); run: the seeds of a config together.",
)
_ONLY = flags.DEFINE_list(
  "only", [], "Run only these run names (all are still tabled from disk)."
)
_MAX_RUNS = flags.DEFINE_integer(
  "max_runs", 0, "Train at most this many runs in this invocation (0 = all)."
)
_KEEP_COMPILED = flags.DEFINE_bool(
  "keep_compiled",
  False,
  "Keep the compiled programs of a finished run for the next (no "
  "recompiling: a 4-run tiny grid 31 -> 4 CPU-s per later run) at the "
  "cost of memory that grows run after run; off: each run starts from "
  "what one run alone holds.",
)
_STOP_AFTER_S = flags.DEFINE_float(
  "stop_after_s",
  0.0,
  "Start no new run after this many seconds (0 = no "
  "limit); a run already started finishes.",
)


def _parse_value(name: str, text: str):
  """A grid value typed like the dotted field `name`."""
  hint = config_lib.field_type(name)
  if hint is bool:
    if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
      raise cli.UsageError(f"--grid {name}={text!r}: expected true/false")
    return text.lower() in ("1", "true", "yes")
  try:
    if hint is int:
      return int(text)
    if hint is float or hint == (float | None):
      return None if text == "None" else float(text)
  except ValueError:
    kind = "an integer" if hint is int else "a number"
    raise cli.UsageError(f"--grid {name}={text!r}: expected {kind}") from None
  return text


def grid_runs(grid: str) -> list[dict]:
  """'a.x=1,2;b.y=z' -> [{'name': 'a.x=1_b.y=z', 'a.x': 1, 'b.y': 'z'}, ...]
  (an older flat field name is read as its dotted field)."""
  if not grid:
    return []
  fields = set(config_lib.field_names())
  axes = []
  for part in grid.split(";"):
    if "=" not in part:
      raise cli.UsageError(f"--grid axis {part!r} is not FIELD=v1,v2")
    label, values = part.split("=", 1)
    label = label.strip()
    name = config_lib.legacy_name(label)
    if name not in fields:
      raise cli.UsageError(
        f"--grid field {label!r} is not a TrainConfig field; expected a "
        "dotted field such as loss.eps_high"
      )
    axes.append(
      [(label, name, _parse_value(name, v.strip())) for v in values.split(",")]
    )
  runs = []
  for combo in itertools.product(*axes):
    run = {name: value for _, name, value in combo}
    run["name"] = "_".join(f"{label}={v}" for label, _, v in combo)
    runs.append(run)
  return runs


def load_config_file(path: str) -> tuple[dict, list[dict], list | None]:
  """Reads a --configs file: (shared settings, runs, seeds or None)."""
  if not os.path.isfile(path):
    raise cli.UsageError(f"--configs={path!r}: no such file")
  with open(path, encoding="utf-8") as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as e:
      raise cli.UsageError(f"--configs={path!r}: not JSON ({e})") from None
  if isinstance(data, list):
    data = {"runs": data}
  if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
    raise cli.UsageError(
      f"{path}: expected a list of runs or an object with a "
      f"'runs' list; got {type(data).__name__}"
    )
  fields = set(config_lib.field_names())
  shared = data.get("base", {})
  for where, entry in [("base", shared)] + [
    (f"runs[{i}]", r) for i, r in enumerate(data["runs"])
  ]:
    settings = {k: v for k, v in entry.items() if k != "name"}
    if "name" in entry and where == "base":
      settings["name"] = entry["name"]
    for key in config_lib.flatten(settings, source=f"{path} {where}"):
      if key not in fields:
        raise cli.UsageError(
          f"{path}: {where} has {key!r}, which is not a TrainConfig field; "
          'expected a section ({"loss": {"eps_high": ...}}) or a '
          'dotted field ("loss.eps_high")'
        )
  for i, r in enumerate(data["runs"]):
    if not r.get("name"):
      raise cli.UsageError(f"{path}: runs[{i}] has no 'name'")
  return shared, data["runs"], data.get("seeds")


def dir_name(name: str) -> str:
  """A run name as a directory name: no '=', '.' or path characters
  ('rollout.quant=int8_loss.eps_high=0.28' -> 'rollout_quant-int8_loss_
  eps_high-0p28'), so shells, globs and tools that split on dots read it."""
  text = re.sub(r"(?<=\d)\.(?=\d)", "p", name)
  text = text.replace("=", "-")
  return re.sub(r"[^A-Za-z0-9_+-]", "_", text)


def run_dir_for(out_dir: str, name: str, seed) -> str:
  """`<out_dir>/<name>_s<seed>`, a grid cell's name (the one kind with '=')
  through `dir_name`. A --configs run keeps its name as written: archived
  studies and experiments/qurl_report.py find its runs by it. A grid
  directory an older rljax made under the raw name is kept (its run
  resumes there)."""
  legacy = os.path.join(out_dir, f"{name}_s{seed}")
  if "=" not in name or os.path.isdir(legacy):
    return legacy
  return os.path.join(out_dir, f"{dir_name(name)}_s{seed}")


def plan_runs(
  runs: list[dict], shared: dict, seeds: list, out_dir: str, order: str = "run"
) -> list[tuple[dict, str, TrainConfig]]:
  """(run, seed, resolved config) of every run, all validated up front.

  One resolution for every run (`config.resolve`): preset ← script defaults
  ← the file's shared settings ← typed flags ← the run (grid cell or file
  entry) ← seed and directory. A run that changes the algorithm gets that
  algorithm's preset, not the settings of the base's algorithm.
  """
  if order not in ("run", "seed"):
    raise cli.UsageError(f"order={order!r}: expected 'run' or 'seed'")
  pairs = (
    [(run, seed) for run in runs for seed in seeds]
    if order == "run"
    else [(run, seed) for seed in seeds for run in runs]
  )
  plan = []
  for run, seed in pairs:
    cell = {k: v for k, v in run.items() if k != "name"}
    run_dir = run_dir_for(out_dir, run["name"], seed)
    cfg = train_flags.config_from_flags(
      shared,
      cell,
      {"run.seed": int(seed), "run.run_dir": run_dir, "run.resume": True},
    )
    plan.append((run, seed, cfg))
  dirs = [cfg.run.run_dir for _, _, cfg in plan]
  clash = sorted({d for d in dirs if dirs.count(d) > 1})
  if clash:
    raise cli.UsageError(
      f"runs share a directory {clash}: give the runs distinct names"
    )
  return plan


def latest_checkpoint(run_dir: str) -> int | None:
  """The newest checkpoint step directory of a run (None if none)."""
  ckpt = os.path.join(run_dir, "checkpoints")
  if not os.path.isdir(ckpt):
    return None
  steps = [int(d) for d in os.listdir(ckpt) if d.isdigit()]
  return max(steps) if steps else None


def run_status(run_dir: str) -> str:
  """done (summary.json written), partial (some metrics), or pending."""
  if os.path.exists(os.path.join(run_dir, "summary.json")):
    return "done"
  if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
    return "partial"
  return "pending"


def collect(plan) -> list[dict]:
  """The table rows of every planned run with metrics on disk."""
  results = []
  for run, seed, cfg in plan:
    status = run_status(cfg.run.run_dir)
    if status == "pending":
      continue
    results.append(
      {
        "name": run["name"],
        "seed": int(seed),
        "status": status,
        "target_steps": cfg.run.steps,
        "run_dir": cfg.run.run_dir,
        **summarize(cfg.run.run_dir),
      }
    )
  return results


def run_one(cfg: TrainConfig) -> dict:
  """Trains one run to cfg.run.steps (resuming) and writes its summary.json and
  per-problem held-out records (`rljax.study`, for paired statistics)."""
  if cfg.model.name.startswith("instrument:"):
    from rljax import instrument

    return instrument.run_experiment(cfg, cfg.model.name.split(":", 1)[1])
  from rljax import study

  return study.run(cfg)


def write_progress(plan, out_dir: str, stopped: str) -> dict:
  status = [run_status(cfg.run.run_dir) for _, _, cfg in plan]
  progress = {
    "runs": len(plan),
    "done": status.count("done"),
    "partial": status.count("partial"),
    "pending": status.count("pending"),
    "stopped": stopped,
    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }
  if distributed.is_main_process():  # multi-host: one writer
    with open(os.path.join(out_dir, "progress.json"), "w") as f:
      json.dump(progress, f, indent=1)
  return progress


def _read_rows(run_dir: str) -> list[dict]:
  """metrics.jsonl rows; a last line cut by a killed process is skipped
  (the trainer's resume truncates it too)."""
  try:
    return read_metrics(run_dir)
  except (json.JSONDecodeError, FileNotFoundError):
    rows = []
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        for line in f:
          try:
            rows.append(json.loads(line))
          except json.JSONDecodeError:
            break
    return rows


def summarize(run_dir: str) -> dict:
  rows = _read_rows(run_dir)
  train = [r for r in rows if "reward_mean" in r]
  evals = [r for r in rows if "eval_accuracy" in r]

  def mean(key, part):
    vals = [r[key] for r in part if isinstance(r.get(key), (int, float))]
    return float(np.mean(vals)) if vals else None

  def median(key, part):
    vals = [r[key] for r in part if isinstance(r.get(key), (int, float))]
    return float(np.median(vals)) if vals else None

  q = max(1, len(train) // 4)
  return {
    "steps": len(train),
    "eval_before": evals[0]["eval_accuracy"] if evals else None,
    "eval_final": evals[-1]["eval_accuracy"] if evals else None,
    "eval_best": max(e["eval_accuracy"] for e in evals) if evals else None,
    "reward_first_q": mean("reward_mean", train[:q]),
    "reward_last_q": mean("reward_mean", train[-q:]),
    "behav_prox_kl": mean("behav_prox_kl", train),
    "max_rho": max(
      (r.get("max_prox_behav_ratio", 0.0) for r in train), default=None
    ),
    "clip_low": mean("clip_fraction_low", train),
    "clip_high": mean("clip_fraction_high", train),
    "tis_truncated": mean("tis_truncated_fraction", train),
    "acr_active": mean("acr_active_fraction", train),
    "changed_codes": mean("quant/quantized_change_fraction", train),
    # Medians over the steps after the first: step 1 compiles every
    # program (5.6 s/step against 0.135 warm on the tiny model), and a
    # resumed process's first step does too, which the median outvotes.
    "rollout_tok_s_warm": median("rollout_tokens_per_s", train[1:]),
    "s_per_step_warm": median("time_step", train[1:]),
  }


def _fmt(v) -> str:
  if v is None:
    return "–"
  if isinstance(v, float):
    return f"{v:.4g}"
  return str(v)


def write_table(results: list[dict], out_dir: str) -> str:
  cols = [
    "name",
    "seed",
    "status",
    "steps",
    "eval_before",
    "eval_final",
    "eval_best",
    "reward_first_q",
    "reward_last_q",
    "behav_prox_kl",
    "max_rho",
    "clip_low",
    "clip_high",
    "tis_truncated",
    "acr_active",
    "changed_codes",
    "rollout_tok_s_warm",
    "s_per_step_warm",
  ]
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for r in results:
    lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
  # Spread over the finished seeds.
  by_name: dict[str, list[dict]] = {}
  for r in results:
    if r.get("status", "done") == "done":
      by_name.setdefault(r["name"], []).append(r)
  agg = [
    "",
    "| config | seeds | eval_final mean ± std | eval_best mean | "
    "reward_last_q mean ± std |",
    "|---|---|---|---|---|",
  ]
  for name, rs in by_name.items():
    ef = [r["eval_final"] for r in rs if r["eval_final"] is not None]
    eb = [r["eval_best"] for r in rs if r["eval_best"] is not None]
    rl = [r["reward_last_q"] for r in rs if r["reward_last_q"] is not None]
    agg.append(
      f"| {name} | {len(rs)} | "
      f"{_fmt(np.mean(ef) if ef else None)} ± {_fmt(np.std(ef) if ef else None)} | "
      f"{_fmt(np.mean(eb) if eb else None)} | "
      f"{_fmt(np.mean(rl) if rl else None)} ± {_fmt(np.std(rl) if rl else None)} |"
    )
  note = [
    "",
    "rollout_tok_s_warm, s_per_step_warm: medians over the steps after the "
    "first (which compiles); the plot is not smoothed.",
  ]
  text = "\n".join(lines + note + agg) + "\n"
  if distributed.is_main_process():  # multi-host: one writer
    with open(os.path.join(out_dir, "table.md"), "w") as f:
      f.write(text)
    with open(os.path.join(out_dir, "table.json"), "w") as f:
      json.dump(results, f, indent=1)
  return text


def main(argv):
  del argv
  distributed.initialize_from_flags()  # before anything touches a device
  runs = grid_runs(_GRID.value)
  shared, seeds = {}, _SEEDS.value
  if _CONFIGS.value:
    shared, listed, file_seeds = load_config_file(_CONFIGS.value)
    runs += listed
    if file_seeds is not None and not flags.FLAGS["seeds"].present:
      seeds = [str(s) for s in file_seeds]
  if not runs:
    raise cli.UsageError("give --grid and/or --configs")
  run_study(runs, shared, seeds, _OUT_DIR.value)


def run_study(
  runs: list[dict], shared: dict, seeds: list, out_dir: str
) -> dict:
  """Trains what is not done yet of runs × seeds (this script's flags pick
  order and parts), rebuilds the table from disk; returns the progress."""
  plan = plan_runs(runs, shared, seeds, out_dir, order=_ORDER.value)
  unknown = set(_ONLY.value) - {run["name"] for run in runs}
  if unknown:
    raise cli.UsageError(
      f"--only names {sorted(unknown)}, which are not runs "
      f"of this ablation: {[r['name'] for r in runs]}"
    )
  # What every run needs (model, data file, vLLM), before the first trains.
  problems = sorted(
    {
      f"{run['name']}: {p}"
      for run, _, cfg in plan
      for p in preflight.problems(cfg)
    }
  )
  if problems:
    raise cli.UsageError(
      f"{len(problems)} problem(s) in the planned runs:\n  "
      + "\n  ".join(problems)
    )
  # Under multi-host every process trains every run (SPMD); process 0 alone
  # writes the study's own files (the runs' files are gated by the Trainer).
  main = distributed.is_main_process()
  os.makedirs(out_dir, exist_ok=True)
  if main:
    with open(os.path.join(out_dir, "ablation.json"), "w") as f:
      json.dump(
        {
          "base": shared,
          "runs": runs,
          "seeds": seeds,
          "resolved": {
            f"{run['name']}_s{seed}": cfg.to_dict() for run, seed, cfg in plan
          },
        },
        f,
        indent=1,
      )
  t0, trained, stopped = time.monotonic(), 0, "complete"
  for run, seed, cfg in plan:
    if _ONLY.value and run["name"] not in _ONLY.value:
      continue
    if run_status(cfg.run.run_dir) == "done":
      continue
    if _MAX_RUNS.value and trained >= _MAX_RUNS.value:
      stopped = f"--max_runs={_MAX_RUNS.value}"
      break
    if _STOP_AFTER_S.value and time.monotonic() - t0 > _STOP_AFTER_S.value:
      stopped = f"--stop_after_s={_STOP_AFTER_S.value:g}"
      break
    step = latest_checkpoint(cfg.run.run_dir)
    if step is not None:
      print(
        f"[ablate] resuming {run['name']} seed={seed} from step {step}",
        flush=True,
      )
    else:
      print(f"[ablate] {run['name']} seed={seed}", flush=True)
    cpu0, w0 = _cpu_seconds(), time.monotonic()
    run_one(cfg)
    trained += 1
    from rljax import study  # pylint: disable=g-import-not-at-top

    # Release what this run compiled and held, so that the next run's speed
    # and memory are those it would have alone, not inflated by its
    # predecessors (unless --keep_compiled asks to reuse the programs).
    rss = study.rss_gib() if _KEEP_COMPILED.value else study.release_memory()
    if main:
      with open(os.path.join(out_dir, "cpu_log.jsonl"), "a") as f:
        record = {
          "run": f"{run['name']}_s{seed}",
          "resumed_from": step,
          "cpu_s": _cpu_seconds() - cpu0,
          "wall_s": time.monotonic() - w0,
          "peak_rss_gib": _peak_rss_gib(),  # of the process so far
          "rss_after_release_gib": rss,
        }
        f.write(json.dumps(record) + "\n")
    print(write_table(collect(plan), out_dir), flush=True)
  results = collect(plan)
  print(write_table(results, out_dir), flush=True)
  progress = write_progress(plan, out_dir, stopped)
  print("[ablate] progress: " + json.dumps(progress), flush=True)
  done = [r for r in results if r["status"] == "done"]
  if done and main:
    from rljax.train.plots import plot_runs

    plot_runs(
      [r["run_dir"] for r in done],
      os.path.join(out_dir, "plots.png"),
      labels=[f"{r['name']} s{r['seed']}" for r in done],
    )  # not smoothed: the plot shows the numbers the table summarises
  return progress


def _peak_rss_gib() -> float:
  """The process's peak resident set size so far (GiB, Linux units)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _cpu_seconds() -> float:
  """User + system CPU seconds of this process and its waited children."""
  own = resource.getrusage(resource.RUSAGE_SELF)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
