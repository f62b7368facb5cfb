"""Runs one experiment end to end: evaluate, train, evaluate, plot, export.

Shared by every script under experiments/, so that a script is only its
defaults (one paper setup) and a call to `run_experiment`.
"""
from __future__ import annotations

import json
import os
import time

from rljax.train.config import TrainConfig


def run_experiment(cfg: TrainConfig, plot: bool = True,
                   show_progress: bool = True) -> dict:
  """Trains `cfg.steps` steps (resuming if asked); returns the summary."""
  from absl import logging
  from rljax.train.loop import Trainer  # heavy imports only when running
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes
  t0 = time.perf_counter()
  trainer = Trainer(cfg, show_progress=show_progress)
  print(f"[rljax] run_dir={cfg.run_dir} algorithm={cfg.algorithm} "
        f"engine={cfg.engine} rollout_quant={cfg.rollout_quant} "
        f"correction={cfg.correction} uaq_scale={trainer.uaq_scale} "
        f"steps={cfg.steps}", flush=True)
  try:
    before = {}
    if cfg.eval_size and trainer.step_num == 0:
      before = trainer.evaluate()
      trainer.writer.write(0, before)
      print(f"[rljax] held-out accuracy before training: "
            f"{before['eval_accuracy']:.3f}", flush=True)
    rows = trainer.run()
    after = {}
    if rows and "eval_accuracy" in rows[-1]:
      # --eval_every already evaluated the last step: do not pay for it twice.
      after = {k: v for k, v in rows[-1].items() if k.startswith("eval_")}
    elif cfg.eval_size:
      after = trainer.evaluate()
      trainer.writer.write(trainer.step_num, after)
    if after:
      print(f"[rljax] held-out accuracy after training: "
            f"{after['eval_accuracy']:.3f}", flush=True)
    summary = {
        "run_dir": cfg.run_dir,
        "wall_s": time.perf_counter() - t0,
        "steps": trainer.step_num,
        "first_reward": rows[0]["reward_mean"] if rows else None,
        "last_reward": rows[-1]["reward_mean"] if rows else None,
        "mean_reward_first_quarter": _quarter_mean(rows, first=True),
        "mean_reward_last_quarter": _quarter_mean(rows, first=False),
        "eval_accuracy_before": before.get("eval_accuracy"),
        "eval_accuracy_after": after.get("eval_accuracy"),
    }
    if cfg.export_hf:
      summary["hf_export"] = trainer.export_policy(
          os.path.join(cfg.run_dir, "hf"))
      if trainer.lora is not None:  # the adapters alone, PEFT layout
        summary["lora_adapter"] = trainer.export_adapter(
            os.path.join(cfg.run_dir, "lora_adapter"))
  finally:
    trainer.close()
  if plot:
    from rljax.train.plots import plot_runs
    summary["plot"] = os.path.join(cfg.run_dir, "plots.png")
    plot_runs([cfg.run_dir], summary["plot"])
  with open(os.path.join(cfg.run_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  print("[rljax] summary: " + json.dumps(summary), flush=True)
  return summary


def _quarter_mean(rows: list[dict], first: bool) -> float | None:
  if not rows:
    return None
  q = max(1, len(rows) // 4)
  part = rows[:q] if first else rows[-q:]
  return sum(r["reward_mean"] for r in part) / len(part)
