"""Overlap of rollout and update per async mode, on this machine (issue 47).

Trains `experiments/main.py`'s default job (SmolLM2-135M-Instruct, GRPO on
arithmetic, INT8 rollouts) for --steps steps in each mode, one Trainer after
the other in this process:

  sync                 --run.async_mode=off: rollout, then update
  one_step             --run.async_mode=one_step --run.max_staleness=1: the
                       next rollout is generated while this step updates
  streaming_keep       --run.async_mode=streaming --run.max_staleness=k
  streaming_recompute  --rollout.inflight_kv=keep | recompute: the worker runs
                       up to k + 1 requests ahead and takes each new θ
                       between decode chunks

and reports, over the steps after the first --warmup_steps (they compile):

  wall per step        mean and median, from the start of one step to the
                       start of the next (the last: to its end); steps/hour
  trainer idle         the steps' `trainer_idle_fraction` when the trainer
                       logs it, else time_rollout_wait / time_step (the wait
                       for the worker's rollout); sync: time_rollout /
                       time_step (the trainer's thread runs the rollout)
  engine idle          the steps' `engine_idle_fraction` when logged, else
                       n/a; sync: 1 − time_rollout / time_step (serial)
  version lag          over every trained token: mean, max, share >= 1 and
                       >= 4, and the whole distribution
  untrained tokens     tokens generated but never trained on: the rollouts
                       still queued when the run ends
                       (`Collector.pending_rollouts`) plus masked-out
                       filler groups (dynamic sampling); should be 0
  ratios               steps/hour of streaming / sync (target >= 1.5) and
                       streaming / one_step (target >= 1.2)

Where the engine runs: the JAX engine is a worker thread of the trainer's
process, so in every mode here engine and trainer share the process's cores;
the overlap measured is what one process's threads get. With
--rollout.engine=vllm the engine is the sidecar, a process of its own:
--engine_core=1 pins its threads to core 1 and the trainer's to the others
once it has started (the JSON records the placement; streaming then sends
each admitted prompt to the sidecar as a request of its own and takes new
weights in flight, `VLLMSidecar.generate_stream`).

A long-tailed workload (where streaming's deadlines can act: a step need
not wait for its longest response, and the update pads to the longest one
it trains): --rollout.max_new_tokens=256 --rollout.temperature=1.0 (the
default job's model then ends most responses at EOS within ~70 tokens and
runs some to the limit).

The modes use --batching (continuous by default: streaming needs it), so the
ratios compare the async modes, not two batchings. Every training flag of
the default job overrides as in experiments/main.py (`--rollout.quant=none`);
--model, --steps and --max_staleness set model.name, run.steps and
streaming's run.max_staleness. Checkpoints are not written (a save waits for
the queued rollouts, which would stall the overlap being measured).

  python experiments/bench_async.py --out_dir=docs/performance
  # a dry run on the tiny random model (numbers mean nothing):
  python experiments/bench_async.py --model=tiny --steps=4 \
      --rollout.prompts_per_step=2 --rollout.group_size=4 \
      --rollout.max_new_tokens=8 --update.micro_batches=1 \
      --out_dir=/tmp/bench_async

Writes <out_dir>/<--name>.json (machine, settings, per-mode summary and
per-step rows) and <out_dir>/<--name>.png (wall per step and idle fractions
by mode).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import tempfile
import time

from absl import flags
from absl import logging
import numpy as np

from rljax import hostmem
from rljax.train import cli
from rljax.train import flags as train_flags

import default_job  # experiments/, the script's own folder
from machine import machine_info  # experiments/, too

train_flags.define_train_flags(
  {
    # experiments/main.py's job without what a benchmark does not time: the
    # held-out set, the HF export, TensorBoard.
    **default_job.RECIPE,
    "task.eval_size": 0,
    "run.export_hf": False,
    "run.tensorboard": False,
  }
)

# mode -> the TrainConfig fields it sets (streaming's staleness from flags).
MODES = {
  "sync": {"run.async_mode": "off"},
  "one_step": {"run.async_mode": "one_step", "run.max_staleness": 1},
  "streaming_keep": {
    "run.async_mode": "streaming",
    "rollout.inflight_kv": "keep",
  },
  "streaming_recompute": {
    "run.async_mode": "streaming",
    "rollout.inflight_kv": "recompute",
  },
}
_ALIASES = {"off": "sync", "streaming": "streaming_keep"}
# (numerator, denominator, target) of issue 47's steps/hour ratios.
TARGETS = (("sync", 1.5), ("one_step", 1.2))
ENGINE_PLACEMENT = {
  "jax": (
    "JAX engine on a worker thread of the trainer's process: engine and "
    "trainer share the process's cores {affinity}"
  ),
  "vllm": (
    "vLLM sidecar, a process of its own: {pinned} (VLLM_CPU_OMP_THREADS_BIND"
    "={bind})"
  ),
}

_MODES = flags.DEFINE_list(
  "modes",
  list(MODES),
  f"Modes, run in this order: {', '.join(MODES)} (aliases: off = sync, "
  "streaming = streaming_keep).",
)
_STEPS = flags.DEFINE_integer("steps", 30, "Training steps per mode.")
_WARMUP = flags.DEFINE_integer(
  "warmup_steps", 1, "First steps left out of the rates (they compile)."
)
_MAX_STALENESS = flags.DEFINE_integer(
  "max_staleness", 1, "Streaming modes' run.max_staleness (k)."
)
_MODEL = flags.DEFINE_string(
  "model", "smollm2-135m-instruct", "model.name: a name, HF dir or GGUF."
)
_BATCHING = flags.DEFINE_enum(
  "batching",
  "continuous",
  ["static", "continuous"],
  "rollout.batching of every mode on the JAX engine (streaming needs "
  "continuous; the others take the same, so the ratios compare modes).",
)
_ENGINE_CORE = flags.DEFINE_integer(
  "engine_core",
  -1,
  "With --rollout.engine=vllm: pin the sidecar's processes (every thread)"
  " to this core and the trainer's threads to the others, once the sidecar"
  " has started (-1: no pinning).",
)
_OUT_DIR = flags.DEFINE_string(
  "out_dir", "runs/bench_async", "Where the JSON and the plot go."
)
_NAME = flags.DEFINE_string(
  "name", "async_overlap", "File stem of the JSON and the plot."
)

# Training flags the script's own flags (or the modes) set.
_OWNED = {
  "model.name": "--model",
  "run.steps": "--steps",
  "run.async_mode": "--modes",
  "run.pipelined": "--modes",
  "run.max_staleness": "--max_staleness (streaming) or --modes",
  "rollout.inflight_kv": "--modes",
  "rollout.batching": "--batching",
}


def parse_modes(names: list[str]) -> list[str]:
  """--modes as canonical names, in order, each once."""
  out = []
  for name in names:
    mode = _ALIASES.get(name, name)
    if mode not in MODES:
      raise cli.UsageError(
        f"--modes has {name!r}; expected some of {', '.join(MODES)} "
        "(or off, streaming)"
      )
    if mode in out:
      raise cli.UsageError(f"--modes names {mode!r} twice; expected once each")
    out.append(mode)
  if not out:
    raise cli.UsageError("--modes is empty; expected at least one mode")
  return out


def _descendants(root: int) -> list[int]:
  """`root` and every process below it (from /proc's parent links)."""
  children = collections.defaultdict(list)
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      except (OSError, ValueError, IndexError):
        continue
      children[ppid].append(int(entry))
  out, todo = [], [root]
  while todo:
    pid = todo.pop()
    out.append(pid)
    todo.extend(children.get(pid, ()))
  return out


def _pin(pid: int, cores: set[int]) -> int:
  """Every thread of `pid` onto `cores`; how many threads were pinned."""
  done = 0
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      os.sched_setaffinity(int(tid), cores)
      done += 1
    except OSError:  # a thread that ended meanwhile
      pass
  return done


def pin_engine(engine_pid: int, core: int) -> dict:
  """The sidecar (and its engine and worker processes) on `core`, this
  process's threads on the other cores; new threads inherit."""
  every = set(range(os.cpu_count() or 1))
  if core not in every or len(every) < 2:
    raise ValueError(
      f"--engine_core={core}; expected one of {sorted(every)} on a machine "
      "with at least 2 cores"
    )
  pids = _descendants(engine_pid)
  engine_threads = sum(_pin(p, {core}) for p in pids)
  trainer_threads = _pin(os.getpid(), every - {core})
  return {
    "engine_core": core,
    "engine_processes": len(pids),
    "engine_threads": engine_threads,
    "trainer_cores": sorted(every - {core}),
    "trainer_threads": trainer_threads,
  }


def lag_counts(batch, current_version: int, valid) -> collections.Counter:
  """{lag: tokens} of a rollout's trained tokens (the rows `valid` keeps,
  model tokens only), as `staleness.rollout_lag_metrics` counts them."""
  counts = collections.Counter()
  if batch.policy_version is None:
    return counts
  for row, versions in enumerate(batch.policy_version):
    if not valid[row]:
      continue
    versions = np.asarray(versions, np.int64)
    if batch.action_mask is not None:
      versions = versions[np.asarray(batch.action_mask[row], bool)]
    lags, n = np.unique(current_version - versions, return_counts=True)
    counts.update(dict(zip(lags.tolist(), n.tolist())))
  return counts


def _idle(rows: list[dict], key: str, fallback) -> float | None:
  """Idle share of the rows' time: the logged per-step fraction `key`
  when every row has it, else `fallback(row)`; time-weighted by
  time_step. None when neither is available."""
  total = sum(r["time_step"] for r in rows)
  if not rows or total <= 0:
    return None
  if all(key in r for r in rows):
    fracs = [r[key] for r in rows]
  else:
    fracs = [fallback(r) for r in rows]
    if any(f is None for f in fracs):
      return None
  return float(sum(f * r["time_step"] for f, r in zip(fracs, rows)) / total)


def summarize(
  mode: str,
  rows: list[dict],
  starts: list[float],
  end: float,
  lags: collections.Counter,
  untrained: dict[str, int],
  warmup: int,
) -> dict:
  """One mode's summary from its rows and the step start times.

  Step i's wall is starts[i + 1] − starts[i] (the last: end − starts[-1]);
  the first `warmup` steps are left out of every rate and fraction.
  """
  if len(starts) != len(rows):
    raise ValueError(
      f"summarize: {len(starts)} step starts for {len(rows)} rows; expected "
      "one per row"
    )
  walls = np.diff(np.asarray([*starts, end], np.float64))
  kept = rows[warmup:]
  wall = walls[warmup:]
  sync = mode == "sync"
  # The sync trainer runs the rollout on its own thread: serial by design.
  trainer_fallback = (
    (lambda r: r["time_rollout"] / r["time_step"])
    if sync
    else (lambda r: r.get("time_rollout_wait", 0.0) / r["time_step"])
  )
  engine_fallback = (
    (lambda r: 1.0 - r["time_rollout"] / r["time_step"])
    if sync
    else (lambda r: None)
  )
  logged = all("engine_idle_fraction" in r for r in kept) and bool(kept)
  tokens = sum(lags.values())
  lag_keys = sorted(lags)
  out = {
    "mode": mode,
    "steps": len(rows),
    "measured_steps": len(kept),
    "wall_per_step_mean_s": float(wall.mean()) if wall.size else None,
    "wall_per_step_median_s": float(np.median(wall)) if wall.size else None,
    "steps_per_hour": float(3600.0 / wall.mean()) if wall.size else None,
    "trainer_idle_fraction": _idle(
      kept, "trainer_idle_fraction", trainer_fallback
    ),
    "engine_idle_fraction": _idle(
      kept, "engine_idle_fraction", engine_fallback
    ),
    "idle_source": "logged"
    if logged
    else ("serial (sync)" if sync else "time_rollout_wait; engine n/a"),
    "trained_tokens": int(tokens),
    "version_lag_mean": (
      float(sum(k * n for k, n in lags.items()) / tokens) if tokens else 0.0
    ),
    "version_lag_max": int(lag_keys[-1]) if lag_keys else 0,
    "version_lag_ge1": (
      float(sum(n for k, n in lags.items() if k >= 1) / tokens)
      if tokens
      else 0.0
    ),
    "version_lag_ge4": (
      float(sum(n for k, n in lags.items() if k >= 4) / tokens)
      if tokens
      else 0.0
    ),
    "version_lag_tokens": {str(k): int(lags[k]) for k in lag_keys},
    "untrained_tokens": int(sum(untrained.values())),
    **{f"untrained_tokens_{k}": int(v) for k, v in untrained.items()},
    "wall_per_step_s": [float(w) for w in walls],
    "rows": [
      {
        k: r[k]
        for k in (
          "step",
          "time_step",
          "time_rollout",
          "time_rollout_wait",
          "time_update",
          "version_lag_mean",
          "version_lag_max",
          "rollout_tokens",
          "rollout_weight_swaps",
          "trainer_idle_fraction",
          "engine_idle_fraction",
          # The exposure of streaming's deadlines on a long tail: how long
          # the batch's responses ran (the update pads to the longest) and
          # how many groups came from another step's request.
          "response_length_mean",
          "response_length_max",
          "stream_groups_other_request",
          "stream_groups_expired",
        )
        if k in r
      }
      for r in rows
    ],
  }
  return out


def ratios(summaries: dict[str, dict]) -> list[dict]:
  """Steps/hour of each streaming mode over sync and one_step, with the
  targets, where both modes ran."""
  out = []
  for mode, s in summaries.items():
    if not mode.startswith("streaming"):
      continue
    for base, target in TARGETS:
      b = summaries.get(base)
      if b is None or not b["steps_per_hour"] or not s["steps_per_hour"]:
        continue
      value = s["steps_per_hour"] / b["steps_per_hour"]
      out.append(
        {
          "ratio": f"{mode} / {base}",
          "value": float(value),
          "target": target,
          "met": bool(value >= target),
        }
      )
  return out


def _fmt(x, spec: str) -> str:
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
      f"| {mode} | {_fmt(s['wall_per_step_mean_s'], '.3f')} | "
      f"{_fmt(s['wall_per_step_median_s'], '.3f')} | "
      f"{_fmt(s['steps_per_hour'], '.0f')} | "
      f"{_fmt(s['trainer_idle_fraction'], '.2f')} | "
      f"{_fmt(s['engine_idle_fraction'], '.2f')} | "
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


def run_mode(mode: str, cells: dict, warmup: int) -> dict:
  """Trains one mode's Trainer; its summary."""
  from rljax.train import critic_pretrain  # pylint: disable=g-import-not-at-top
  from rljax.train.loop import Trainer  # pylint: disable=g-import-not-at-top

  cfg = train_flags.config_from_flags(None, cells)
  trainer = Trainer(cfg, show_progress=False)
  pinned = {}
  if _ENGINE_CORE.value >= 0:
    if cfg.rollout.engine != "vllm":
      raise ValueError(
        f"--engine_core={_ENGINE_CORE.value} with rollout.engine="
        f"{cfg.rollout.engine!r}; expected 'vllm' (the JAX engine is a "
        "thread of this process)"
      )
    pinned = pin_engine(trainer.actor.engine.pid, _ENGINE_CORE.value)
    print(f"[{mode}] pinned: {pinned}", flush=True)
  # No checkpoints: a save waits for the queued rollouts (the overlap).
  trainer.checkpointer.should_save = lambda step, last=False: False
  starts, lags, masked = [], collections.Counter(), [0]
  train_step, collect = trainer.train_step, trainer.collector.collect

  def step():
    starts.append(time.perf_counter())
    return train_step()

  def collected(step_num):
    out = collect(step_num)
    current = critic_pretrain.policy_version(cfg, step_num - 1)
    lags.update(lag_counts(out.batch, current, out.valid))
    lengths = np.asarray(out.batch.response_lengths)
    masked[0] += int(lengths[~np.asarray(out.valid, bool)].sum())
    return out

  trainer.train_step = step
  trainer.collector.collect = collected
  try:
    rows = trainer.run()
    end = time.perf_counter()
    # Rollouts queued for steps past the last (generated, not trained in
    # this run; a checkpoint would keep them for an extension). Streaming
    # saves whole requests with a flag per group: count the untrained ones.
    queued = 0
    for rb, extra in trainer.collector.pending_rollouts():
      lengths = np.asarray(rb.response_lengths).reshape(-1, rb.n)
      for g in range(lengths.shape[0]):
        if extra.get(f"stream_trained_{g}", 0.0) == 0.0:
          queued += int(lengths[g].sum())
  finally:
    trainer.close()
  untrained = {"queued": queued, "masked": masked[0]}
  out = summarize(mode, rows, starts, end, lags, untrained, warmup)
  if pinned:
    out["pinning"] = pinned
  return out


def main(argv):
  del argv
  modes = parse_modes(_MODES.value)
  typed = sorted(set(train_flags.typed_flags()) & set(_OWNED))
  if typed:
    raise cli.UsageError(
      f"--{typed[0]} is set by this script; use {_OWNED[typed[0]]} instead"
    )
  if _STEPS.value <= _WARMUP.value:
    raise cli.UsageError(
      f"--steps={_STEPS.value}; expected more than --warmup_steps="
      f"{_WARMUP.value} (those steps are left out of the rates)"
    )
  if _MAX_STALENESS.value < 0:
    raise cli.UsageError(
      f"--max_staleness={_MAX_STALENESS.value}; expected >= 0"
    )
  from rljax import distributed  # pylint: disable=g-import-not-at-top
  from rljax import study  # pylint: disable=g-import-not-at-top

  distributed.initialize_from_flags()  # before anything touches a device
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes
  base = {"model.name": _MODEL.value, "run.steps": _STEPS.value}
  engine = train_flags.config_from_flags(None, base).rollout.engine
  cells = {}
  for mode in modes:
    cell = {**base, **MODES[mode], "run.resume": False}
    if mode.startswith("streaming"):
      cell["run.max_staleness"] = _MAX_STALENESS.value
    if engine == "jax":
      cell["rollout.batching"] = _BATCHING.value
    cells[mode] = cell
  for cell in cells.values():  # every mode's config errors before any run
    train_flags.config_from_flags(None, cell)
  machine = machine_info()
  result = {
    "machine": machine,
    "engine_placement": ENGINE_PLACEMENT[engine].format(
      affinity=sorted(os.sched_getaffinity(0)),
      pinned=(
        f"its processes pinned to core {_ENGINE_CORE.value} once started, "
        "the trainer's threads to the others (--engine_core)"
        if _ENGINE_CORE.value >= 0
        else f"not pinned: trainer and engine share cores "
        f"{sorted(os.sched_getaffinity(0))}"
      ),
      bind=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "(unset: vLLM's own)"),
    ),
    "settings": {
      "model": _MODEL.value,
      "steps": _STEPS.value,
      "warmup_steps": _WARMUP.value,
      "max_staleness": _MAX_STALENESS.value,
      "batching": _BATCHING.value,
      "overrides": train_flags.typed_flags(),
    },
    "load_average": {"start": list(os.getloadavg())},
    "modes": {},
  }
  print(f"engine placement: {result['engine_placement']}", flush=True)
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  scratch = tempfile.mkdtemp(prefix="bench_async_")
  try:
    for mode in modes:
      print(f"[{mode}] {_STEPS.value} steps ...", flush=True)
      cell = {**cells[mode], "run.run_dir": os.path.join(scratch, mode)}
      summary = run_mode(mode, cell, _WARMUP.value)
      result["modes"][mode] = summary
      print(
        f"  wall/step {_fmt(summary['wall_per_step_mean_s'], '.3f')} s, "
        f"rss after release {study.release_memory():.2f} GiB",
        flush=True,
      )
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  result["load_average"]["end"] = list(os.getloadavg())
  result["ratios"] = ratios(result["modes"])
  print("\n".join(report(result)))
  out = os.path.join(_OUT_DIR.value, _NAME.value)
  with open(out + ".json", "w") as f:
    json.dump(result, f, indent=1)
  plot(result, out + ".png")
  print(f"wrote {out}.json, {out}.png")


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
