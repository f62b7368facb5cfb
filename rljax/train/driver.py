"""Runs one experiment end to end: evaluate, train, evaluate, plot, export.

Shared by every script under experiments/, so that a script is only its
defaults (one paper setup) and a call to `run_experiment`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

from rljax.train.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class BenchmarkPlan:
  """Benchmarks evaluated after training, as a paper reports them: Avg@k
  (`samples` completions per problem, mean correctness) of the
  full-precision policy, each keyed by its `EvalSpec.label`."""

  specs: tuple = ()  # rljax.evaluation.EvalSpec
  samples: int = 1  # k of Avg@k; 0 = no benchmarks
  temperature: float = 0.6
  top_p: float = 0.95
  allow_train_on_eval: bool = False


def _same_file(a: str, b: str) -> bool:
  """One file, or two files with the same bytes (a copy is the same set)."""
  if not (os.path.isfile(a) and os.path.isfile(b)):
    return False
  if os.path.samefile(a, b):
    return True
  if os.path.getsize(a) != os.path.getsize(b):
    return False
  digests = []
  for path in (a, b):
    with open(path, "rb") as f:
      digests.append(hashlib.sha256(f.read()).hexdigest())
  return digests[0] == digests[1]


def check_benchmarks(cfg: TrainConfig, plan: BenchmarkPlan) -> tuple:
  """The specs of `plan` to evaluate; runs before any model loads.

  A benchmark whose file is not given or missing is skipped with a
  message. Training on a file that is evaluated is refused (its scores
  would measure memorisation), unless `plan.allow_train_on_eval`.
  """
  if plan.samples < 0:
    raise ValueError(
      f"--bench_samples={plan.samples}: expected >= 0 (0 skips the benchmarks)"
    )
  if plan.samples == 0:
    return ()
  if plan.temperature == 0.0 and plan.samples > 1:
    raise ValueError(
      f"--bench_temperature=0 samples greedily: expected "
      f"--bench_samples=1, got {plan.samples}"
    )
  present = []
  for spec in plan.specs:
    if spec.path and os.path.isfile(spec.path):
      present.append(spec)
    else:
      print(
        f"[rljax] benchmark {spec.label}: skipped, no file at "
        f"--eval_{spec.label}={spec.path!r}",
        flush=True,
      )
  if cfg.data_path and not plan.allow_train_on_eval:
    clash = [s for s in present if _same_file(cfg.data_path, s.path)]
    if clash:
      raise ValueError(
        f"--data_path={cfg.data_path!r} is the evaluated benchmark "
        + ", ".join(f"{s.label} (--eval_{s.label}={s.path!r})" for s in clash)
        + ": training on it would make its scores meaningless. Train on "
        "another file, or pass --allow_train_on_eval to do it anyway"
      )
  return tuple(present)


def run_benchmarks(trainer, specs, plan: BenchmarkPlan) -> dict:
  """{label: evaluation summary} of the trainer's full-precision policy;
  per-sample records go to <run_dir>/benchmarks/<label>.jsonl."""
  from rljax import evaluation, models, quant
  from rljax.rollout.base import SamplingConfig
  from rljax.rollout.jax_sampler import JaxSampler
  from rljax.train import batch as batch_lib

  cfg = trainer.cfg
  params = trainer.state.params
  if trainer.uaq_scale != 1.0:
    params = quant.unfold_uaq(
      trainer.model_config, params, scale=trainer.uaq_scale
    )
  model = models.Model(
    config=trainer.model_config, params=params, tokenizer=trainer.tokenizer
  )
  tok = trainer.tokenizer
  greedy = plan.samples == 1 and plan.temperature == 0.0
  sampling = SamplingConfig(
    n=plan.samples,
    greedy=greedy,
    temperature=0.0 if greedy else plan.temperature,
    top_p=1.0 if greedy else plan.top_p,
    max_new_tokens=cfg.max_new_tokens,
    stop_token_ids=(int(tok.eos_token_id),),
    seed=cfg.seed,
  )
  out_dir = os.path.join(cfg.run_dir, "benchmarks")
  os.makedirs(out_dir, exist_ok=True)
  results = {}
  for spec in specs:
    examples = evaluation.load_examples(spec)
    render = trainer.task.render
    # Benchmarks are not filtered by length: the engine holds the longest.
    longest = max(
      len(tok.encode(render(e.question), add_special_tokens=False))
      for e in examples
    )
    engine = JaxSampler(
      model.config,
      model.params,
      quant="none",
      max_prompt_len=batch_lib.bucket(longest),
      pad_id=int(tok.pad_token_id or 0),
    )
    try:
      summary, records = evaluation.evaluate_dataset(
        model, engine, examples, sampling, k=plan.samples, render=render
      )
    finally:
      engine.close()
    results[spec.label] = {"dataset": spec.name, "path": spec.path, **summary}
    with open(os.path.join(out_dir, f"{spec.label}.jsonl"), "w") as f:
      for r in records:
        f.write(json.dumps(r) + "\n")
    print(
      f"[rljax] {spec.label} avg@{plan.samples}: "
      f"{summary[f'avg@{plan.samples}']:.4f} "
      f"({summary['examples']} problems)",
      flush=True,
    )
  return results


def run_experiment(
  cfg: TrainConfig,
  plot: bool = True,
  show_progress: bool = True,
  benchmarks: BenchmarkPlan | None = None,
) -> dict:
  """Trains `cfg.steps` steps (resuming if asked), then evaluates
  `benchmarks`; returns the summary."""
  from absl import logging

  bench_specs = check_benchmarks(cfg, benchmarks) if benchmarks else ()
  from rljax.train.loop import Trainer  # heavy imports only when running

  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes
  t0 = time.perf_counter()
  trainer = Trainer(cfg, show_progress=show_progress)
  print(
    f"[rljax] run_dir={cfg.run_dir} algorithm={cfg.algorithm} "
    f"engine={cfg.engine} rollout_quant={cfg.rollout_quant} "
    f"correction={cfg.correction} uaq_scale={trainer.uaq_scale} "
    f"steps={cfg.steps}",
    flush=True,
  )
  try:
    before = {}
    if cfg.eval_size and trainer.step_num == 0:
      before = trainer.heldout.evaluate(trainer.policy_params())
      trainer.writer.write(0, before)
      print(
        f"[rljax] held-out accuracy before training: "
        f"{before['eval_accuracy']:.3f}",
        flush=True,
      )
    rows = trainer.run()
    after = {}
    if rows and "eval_accuracy" in rows[-1]:
      # --eval_every already evaluated the last step: do not pay for it twice.
      after = {k: v for k, v in rows[-1].items() if k.startswith("eval_")}
    elif cfg.eval_size:
      after = trainer.heldout.evaluate(trainer.policy_params())
      trainer.writer.write(trainer.step_num, after)
    if after:
      print(
        f"[rljax] held-out accuracy after training: "
        f"{after['eval_accuracy']:.3f}",
        flush=True,
      )
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
    if bench_specs:
      summary["benchmarks"] = run_benchmarks(trainer, bench_specs, benchmarks)
      k = benchmarks.samples
      trainer.writer.write(
        trainer.step_num,
        {
          f"bench_{label}_avg@{k}": r[f"avg@{k}"]
          for label, r in summary["benchmarks"].items()
        },
      )
    if cfg.export_hf:
      from rljax.train import export as export_lib

      # From the last checkpoint (restore_policy): UAQ unfolded, LoRA merged.
      summary["hf_export"] = export_lib.export_run(
        cfg.run_dir, os.path.join(cfg.run_dir, "hf")
      )
      if trainer.lora is not None:  # the adapters alone, PEFT layout
        summary["lora_adapter"] = export_lib.export_adapter(
          trainer.model_config,
          trainer.lora,
          trainer.state.params,
          os.path.join(cfg.run_dir, "lora_adapter"),
          cfg.model,
          trainer.uaq_scale,
        )
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
