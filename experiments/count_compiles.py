"""How many programs the JAX sampler compiles over an RL run.

  python experiments/count_compiles.py --rollout.batching=static
  python experiments/count_compiles.py --rollout.batching=continuous

Trains `experiments/main.py`'s job on the `tiny` model with README's
first-hour smoke sizes (2 prompts x 4 samples, 8 new tokens, no held-out
set, 20 steps; any training flag overrides them) and counts, per step:

  sampler_programs  `JaxSampler.num_compiles`: the distinct rollout
                    programs the sampler has traced (plan x weight layout),
                    the repo's own count;
  rollout_xla       XLA backend compiles inside `engine.generate` (every
                    jitted function a rollout runs: the programs, the
                    per-row PRNG keys, the fused-weight preparation);
  sync_xla          XLA backend compiles inside `engine.update_weights`;
  step_xla          XLA backend compiles of the whole step (update included).

XLA compiles are counted by a `jax.monitoring` listener on
"/jax/core/compile/backend_compile_duration" (one event per program XLA
compiles). The persistent compilation cache is turned off here, even where
JAX_COMPILATION_CACHE_DIR names one (the test suite sets it): a program
loaded from it is not compiled, so the count would miss it.
Bounded compiles mean: every count is set by step 1 or 2 and stays there.
Prints one JSON line (totals and the per-step lists) and writes it to --out.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from absl import flags
from absl import logging
import jax

from rljax import hostmem
from rljax.quant.cpu import host_cpu
from rljax.train import cli
from rljax.train import flags as train_flags

import default_job  # experiments/ is on sys.path: the script's own folder

train_flags.define_train_flags(
  {
    # experiments/main.py's job (its one recipe, `default_job.RECIPE`) ...
    **default_job.RECIPE,
    "run.steps": 20,
    # ... at README's first-hour sizes on the tiny random model.
    "model.name": "tiny",
    "task.eval_size": 0,
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 4,
    "rollout.max_new_tokens": 8,
    "update.micro_batches": 1,
    "run.export_hf": False,
    "run.tensorboard": False,
  }
)
_OUT = flags.DEFINE_string("out", "", "Also write the JSON result here.")

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


class _Counter:
  """XLA backend compiles so far (all threads)."""

  def __init__(self):
    self.count = 0
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, event: str, duration: float, **kwargs) -> None:
    del duration, kwargs
    if event == _BACKEND_COMPILE:
      self.count += 1


def _counted(counter: _Counter, fn, into: list[int]):
  """`fn`, adding the XLA compiles of each call to into[-1]."""

  def call(*args, **kwargs):
    before = counter.count
    try:
      return fn(*args, **kwargs)
    finally:
      into[-1] += counter.count - before

  return call


def main(argv):
  del argv
  from rljax import distributed
  from rljax.train.loop import Trainer  # heavy imports after flag parsing

  distributed.initialize_from_flags()  # before anything touches a device
  # Count every program XLA builds: none may come from a cache on disk.
  jax.config.update("jax_enable_compilation_cache", False)

  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes

  cells, scratch = [], None
  if not flags.FLAGS["run.run_dir"].present:
    # A throwaway run directory (checkpoints, metrics), removed at the end.
    scratch = tempfile.mkdtemp(prefix="count_compiles_")
    cells.append({"run.run_dir": scratch})
  cfg = train_flags.config_from_flags(None, *cells)
  if cfg.rollout.engine != "jax":
    raise ValueError(
      f"--rollout.engine={cfg.rollout.engine!r}; expected 'jax' (this counts "
      "the JAX sampler's compiles)"
    )
  counter = _Counter()
  trainer = Trainer(cfg, show_progress=False)
  engine = trainer.actor.engine
  rollout, sync, step_total, programs = [0], [0], [0], []
  engine.generate = _counted(counter, engine.generate, rollout)
  engine.update_weights = _counted(counter, engine.update_weights, sync)
  train_step = trainer.train_step

  def step():
    try:
      return _counted(counter, train_step, step_total)()
    finally:
      programs.append(engine.num_compiles)
      for per_step in (rollout, sync, step_total):
        per_step.append(0)

  trainer.train_step = step
  try:
    trainer.run()
  finally:
    trainer.close()
    if scratch is not None:
      shutil.rmtree(scratch, ignore_errors=True)
  for per_step in (rollout, sync, step_total):
    per_step.pop()  # the slot opened after the last step
  # The sync before step 1 (Trainer.run) lands in step 1's slot of `sync`.
  result = {
    "batching": cfg.rollout.batching,
    "quant": cfg.rollout.quant,
    "steps": len(programs),
    "sampler_programs": programs[-1] if programs else 0,
    "rollout_xla_total": sum(rollout),
    "rollout_xla_after_step_2": sum(rollout[2:]),
    "sync_xla_total": sum(sync),
    "step_xla_total": sum(step_total),
    "step_xla_after_step_2": sum(step_total[2:]),
    "per_step": {
      "sampler_programs": programs,
      "rollout_xla": rollout,
      "sync_xla": sync,
      "step_xla": step_total,
    },
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "cpu": host_cpu().model,
    "cores": os.cpu_count(),
  }
  line = json.dumps(result)
  print(line, flush=True)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write(line + "\n")


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
