"""Runs one experiment end to end: evaluate, train, evaluate, plot, export.

Shared by every script under experiments/, so that a script is only its
defaults (one paper setup) and a call to `run_experiment`.

Multi-host: importing this module defines `rljax.distributed`'s
--coordinator_address, --num_processes and --process_id flags for every
script that trains through it, and `run_experiment` joins the processes
before anything touches a device. Every process trains (SPMD); only process
0 prints, writes the summary, the plots, the benchmark records and the HF
export (`rljax.distributed.is_main_process`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

import jax

from rljax import distributed  # defines the multi-host flags
from rljax.train import atomic
from rljax.train import config as config_lib
from rljax.train import metrics as metrics_lib
from rljax.train import run_summary
from rljax.train import spec_summary
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
  if cfg.task.data_path and not plan.allow_train_on_eval:
    clash = [s for s in present if _same_file(cfg.task.data_path, s.path)]
    if clash:
      raise ValueError(
        f"--task.data_path={cfg.task.data_path!r} is the evaluated benchmark "
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
  # Whole on this host (gathered under multi-host), LoRA merged.
  params = trainer.local_policy_params()
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
    max_new_tokens=cfg.rollout.max_new_tokens,
    stop_token_ids=(int(tok.eos_token_id),),
    seed=cfg.run.seed,
  )
  out_dir = os.path.join(cfg.run.run_dir, "benchmarks")
  main = distributed.is_main_process()
  if main:
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
    if not main:  # every process evaluates the same; one writes
      continue
    atomic.write_text(
      os.path.join(out_dir, f"{spec.label}.jsonl"),
      "".join(json.dumps(r) + "\n" for r in records),
    )
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
  """Trains `cfg.run.steps` steps (resuming if asked), then evaluates
  `benchmarks`; returns the summary.

  Joins a multi-host run first (`distributed.initialize_from_flags`: the
  flags, or a cluster JAX detects; nothing on one machine)."""
  from absl import logging

  distributed.initialize_from_flags()
  say = print if distributed.is_main_process() else _quiet
  bench_specs = check_benchmarks(cfg, benchmarks) if benchmarks else ()
  done = run_summary.finished(cfg)
  if done is not None:  # before anything is built: no file is touched
    say(
      f"[rljax] run_dir={cfg.run.run_dir} holds a finished run ({done['steps']}"
      f" steps, {done['processes']} process(es), summary.json); nothing to "
      "train. Raise --run.steps to train it further, or choose another "
      "--run.run_dir for a new run",
      flush=True,
    )
    return done
  from rljax.train.loop import Trainer  # heavy imports only when running

  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes
  t0 = time.perf_counter()
  trainer = Trainer(cfg, show_progress=show_progress)
  # Every logged step also records this process's wall time so far
  # (processes.json): the summary sums it over every process of the run.
  clock = run_summary.ProcessClock(
    cfg.run.run_dir, t0, writer=distributed.is_main_process()
  )
  clock.tick()
  trainer.writer = run_summary.ClockedWriter(trainer.writer, clock)
  say(
    f"[rljax] run_dir={cfg.run.run_dir} algorithm={cfg.algorithm} "
    f"rollout.engine={cfg.rollout.engine} rollout.quant={cfg.rollout.quant} "
    f"loss.correction={cfg.loss.correction} uaq_scale={trainer.uaq_scale} "
    f"run.steps={cfg.run.steps}",
    flush=True,
  )
  for note in config_lib.notes(cfg):  # legitimate but unusual settings
    say(f"[rljax] note: {note}", flush=True)
  try:
    before = {}
    if cfg.task.eval_size and trainer.step_num == 0:
      before = trainer.heldout.evaluate(trainer.local_policy_params())
      trainer.writer.write(0, before)
      say(
        f"[rljax] held-out accuracy before training: "
        f"{before['eval_accuracy']:.3f}",
        flush=True,
      )
    elif cfg.task.eval_size:  # a resume: measured by the run's first process
      before = metrics_lib.recorded_eval(cfg.run.run_dir, 0)
    rows = trainer.run()
    after = {}
    if rows and "eval_accuracy" in rows[-1]:
      # --run.eval_every already evaluated the last step: do not pay for it twice.
      after = {k: v for k, v in rows[-1].items() if k.startswith("eval_")}
    elif cfg.task.eval_size and not rows:
      # Resumed at the last step (killed before its summary): measured by
      # the process that trained it, if it got that far.
      after = metrics_lib.recorded_eval(cfg.run.run_dir, trainer.step_num)
    if not after and cfg.task.eval_size:
      after = trainer.heldout.evaluate(trainer.local_policy_params())
      trainer.writer.write(trainer.step_num, after)
    if after:
      say(
        f"[rljax] held-out accuracy after training: "
        f"{after['eval_accuracy']:.3f}",
        flush=True,
      )
    # The whole run's rows (every process's), not only this process's
    # (which are all there is where no log is kept here: multi-host).
    if distributed.is_main_process():
      rows = run_summary.training_rows(cfg.run.run_dir) or rows
    summary = {
      **run_summary.whole_run(cfg.run.run_dir, trainer.step_num, clock, rows),
      "eval_accuracy_before": before.get("eval_accuracy"),
      "eval_accuracy_after": after.get("eval_accuracy"),
      "acr_exposure": acr_exposure_summary(rows),
      "speculation": spec_summary.summary(rows),
    }
    say(exposure_line(summary["acr_exposure"]), flush=True)
    if summary["speculation"]:
      say(spec_summary.line(summary["speculation"]), flush=True)
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
    if cfg.run.export_hf:
      summary.update(_export(trainer))
    # Counted to here (benchmarks and exports too), while the run directory
    # is still this process's.
    summary["wall_s"] = run_summary.total_wall(clock)
  finally:
    trainer.close()
  if distributed.is_main_process():
    write_outputs(cfg, summary, plot)
  say("[rljax] summary: " + json.dumps(summary), flush=True)
  return summary


def _quiet(*args, **kwargs) -> None:
  """`print` on the processes other than 0."""
  del args, kwargs


def _export(trainer) -> dict:
  """The HF export (UAQ unfolded, LoRA merged) and a LoRA run's adapters
  alone (PEFT layout), written by process 0: {"hf_export", ["lora_adapter"]}.

  One process: from the last checkpoint (`restore_policy`). Several: from
  the trainer's params, gathered by every process (a collective), since an
  orbax restore on process 0 alone would wait for the others forever; the
  last step is always checkpointed, so both are the same θ.
  """
  from rljax.train import export as export_lib

  cfg = trainer.cfg
  out = {}
  hf_dir = os.path.join(cfg.run.run_dir, "hf")
  adapter_dir = os.path.join(cfg.run.run_dir, "lora_adapter")
  adapters = None
  if jax.process_count() == 1:
    out["hf_export"] = export_lib.export_run(cfg.run.run_dir, hf_dir)
    adapters = trainer.state.params
  else:
    model = export_lib.unfolded_policy(
      trainer.model_config,
      trainer.local_policy_params(),
      trainer.tokenizer,
      trainer.uaq_scale,
    )
    if trainer.lora is not None:
      adapters = trainer.placement.local(trainer.state.params)
    if distributed.is_main_process():
      out["hf_export"] = export_lib.export_policy(model, hf_dir)
  if trainer.lora is not None and distributed.is_main_process():
    out["lora_adapter"] = export_lib.export_adapter(
      trainer.model_config,
      trainer.lora,
      adapters,
      adapter_dir,
      cfg.model.name,
      trainer.uaq_scale,
    )
  return out


def write_outputs(cfg: TrainConfig, summary: dict, plot: bool) -> None:
  """plots.png and summary.json of a finished run (process 0 only: the
  caller checks)."""
  if plot:
    from rljax.train.plots import plot_runs

    summary["plot"] = os.path.join(cfg.run.run_dir, "plots.png")
    plot_runs([cfg.run.run_dir], summary["plot"])
  atomic.write_json(os.path.join(cfg.run.run_dir, "summary.json"), summary)


def acr_exposure_summary(rows: list[dict]) -> dict[str, float | None]:
  """Means over the run's steps of ACR's exposure (rljax.core.exposure,
  logged for every correction): whether ACR could have acted in this run."""
  from rljax.core.exposure import METRIC_NAMES

  out = {}
  for key in METRIC_NAMES.values():
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    out[key] = sum(vals) / len(vals) if vals else None
  return out


def exposure_line(exposure: dict[str, float | None]) -> str:
  """One line for the run's output: what ACR changed, or that it could not."""
  from rljax.core.exposure import METRIC_NAMES

  if exposure.get("acr_grad_share") is None:
    return "[rljax] ACR exposure: not logged (no update ran)"
  shown = ", ".join(
    f"{name} {exposure[name]:.2e}" for name in METRIC_NAMES.values()
  )
  line = f"[rljax] ACR exposure (mean over steps): {shown}"
  if exposure["acr_grad_share"] < 1e-3:
    # The same threshold as experiments/qurl_report_lib/gates.py.
    line += " -- below 1e-3: ACR acted as TIS in this run"
  return line
