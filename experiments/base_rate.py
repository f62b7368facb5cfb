"""Held-out greedy accuracy of the untrained policy at several difficulties.

Picks a generated task's difficulty with headroom for RL (a base model that
starts at 15-40% has both rewarded and unrewarded samples to learn from),
through the trainer's own evaluation path
(`heldout.HeldOut.evaluate`: greedy, full-precision weights, the task's verifier):

  python experiments/base_rate.py --task.name=arithmetic \
      --difficulties=medium,steps=2_digits=2 --task.eval_size=256 \
      --rollout.max_new_tokens=32 --out=runs/base_rate.json

Every flag of the trainer applies (the model, the template's token budget);
each difficulty is evaluated in a scratch run directory under --run.run_dir.
"""

from __future__ import annotations

import json
import os
import time

from absl import flags

from rljax import hostmem
from rljax.train import cli
from rljax import distributed  # --coordinator_address, ... (multi-host)
from rljax.train import flags as train_flags

train_flags.define_train_flags(
  {
    "task.name": "arithmetic",
    "task.eval_size": 256,
    "run.steps": 1,
    "run.export_hf": False,
    "run.tensorboard": False,
    "task.reward_workers": 0,
    "run.run_dir": "runs/base_rate",
  }
)
_DIFFS = flags.DEFINE_list(
  "difficulties", ["medium"], "Difficulties (levels or specs) to evaluate."
)
_OUT = flags.DEFINE_string("out", "", "JSON file for the results ('' = none).")


def main(argv):
  del argv
  distributed.initialize_from_flags()  # before anything touches a device
  from rljax.train.loop import Trainer

  base = train_flags.config_from_flags()
  results = []
  for diff in _DIFFS.value:
    run_dir = os.path.join(base.run.run_dir, diff)
    cfg = base.replace(
      {"task.difficulty": diff, "run.run_dir": run_dir, "run.resume": True}
    )
    t0 = time.perf_counter()
    trainer = Trainer(cfg, show_progress=False)
    try:
      ev = trainer.heldout.evaluate(trainer.policy_params())
    finally:
      trainer.close()
    row = {
      "model": cfg.model.name,
      "task": cfg.task.name,
      "difficulty": diff,
      "problems": cfg.task.eval_size,
      "max_new_tokens": cfg.rollout.max_new_tokens,
      "accuracy": ev["eval_accuracy"],
      "wall_s": time.perf_counter() - t0,
    }
    results.append(row)
    print(json.dumps(row), flush=True)
  if _OUT.value:
    os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
