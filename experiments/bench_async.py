"""Overlap of rollout and update per async mode, on this machine.

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

This file holds the flags, the modes and the run of each; the summary,
report and pinning are in experiments/bench_async_lib/.
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

# experiments/, the script's own folder:
from bench_async_lib.pinning import pin_engine
from bench_async_lib.report import fmt, plot, report
from bench_async_lib.summary import lag_counts, ratios, summarize
import default_job
from machine import machine_info

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
        f"  wall/step {fmt(summary['wall_per_step_mean_s'], '.3f')} s, "
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
