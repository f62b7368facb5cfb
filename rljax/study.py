"""One run of a study (experiments/ablate.py, experiments/long_horizon.py):
evaluate, train, evaluate, with per-problem held-out records.

A paired comparison of two configurations resamples held-out problems ×
seeds, and its readout averages the last evaluations of a run, so it needs
each problem's correctness at every evaluation, not only the accuracy:
`run` writes `<run_dir>/eval_step<k>.jsonl` (one line per held-out problem:
uid, correct, score) before training, at every `run.eval_every` step (the
trainer's own evaluation, through `RecordingHeldOut`) and after training.
The accuracy of those records is the `eval_accuracy` row of metrics.jsonl
at that step (greedy, full-precision weights, the task's verifier, like
`Trainer.evaluate`).

A streaming run's responses may span a weight swap; `run` adds to each
step's metrics the share of its responses whose tokens came from more than
one policy version (`version_mixed_fraction`, `mixed_version_fraction`).
"""

from __future__ import annotations

import gzip
import json
import os
import time

__all__ = [
  "RecordingHeldOut",
  "eval_records",
  "mixed_version_fraction",
  "read_eval_records",
  "run",
]


def _greedy_records(trainer, params, engine) -> tuple[dict, list[dict]]:
  """({eval_accuracy, eval_reward, time_eval}, per-problem records) of
  `params` (full precision) on the trainer's held-out set, greedy, on
  `engine` (a JaxSampler without quantization)."""
  from rljax.rollout.base import SamplingConfig
  import numpy as np

  t0 = time.perf_counter()
  tok = trainer.tokenizer
  engine.update_weights(params)
  examples = trainer.task.eval_examples()
  prompts = [trainer.task.prompt_ids(e) for e in examples]
  rb = engine.generate(
    prompts,
    SamplingConfig(
      n=1,
      greedy=True,
      max_new_tokens=trainer.cfg.rollout.max_new_tokens,
      stop_token_ids=trainer.task.stop_token_ids,
      seed=0,
    ),
  )
  completions = [
    tok.decode(r, skip_special_tokens=True) for r in rb.response_ids
  ]
  scores, _ = trainer.task.verify(completions, examples, 1)
  records = [
    {"uid": e.uid, "correct": int(s >= 1.0), "score": float(s)}
    for e, s in zip(examples, scores)
  ]
  row = {
    "eval_accuracy": float((np.asarray(scores) >= 1.0).mean()),
    "eval_reward": float(np.mean(scores)),
    "time_eval": time.perf_counter() - t0,
  }
  return row, records


def _eval_engine(trainer):
  from rljax.rollout.jax_sampler import JaxSampler
  from rljax.train import batch as batch_lib

  return JaxSampler(
    trainer.model_config,
    None,
    quant="none",
    max_prompt_len=batch_lib.bucket(trainer.cfg.task.max_prompt_tokens),
    pad_id=int(getattr(trainer.tokenizer, "pad_token_id", None) or 0),
  )


def eval_records(trainer) -> tuple[dict, list[dict]]:
  """({eval_accuracy, eval_reward, time_eval}, per-problem records) of the
  trainer's current full-precision policy on its held-out set."""
  engine = _eval_engine(trainer)
  try:
    return _greedy_records(trainer, trainer.policy_params(), engine)
  finally:
    engine.close()


class RecordingHeldOut:
  """The trainer's `--run.eval_every` evaluation, writing each problem's
  record beside the accuracy (`eval_step<k>.jsonl`, k = the trainer's step):
  the same greedy evaluation as `heldout.HeldOut`, on one engine of its
  own. A multi-turn task is left to the trainer's own evaluation."""

  def __init__(self, trainer):
    self._trainer = trainer
    self._inner = trainer.heldout
    self._engine = None

  def evaluate(self, params) -> dict:
    if getattr(self._trainer.task, "multi_turn", False):
      return self._inner.evaluate(params)
    if self._engine is None:
      self._engine = _eval_engine(self._trainer)
    row, records = _greedy_records(self._trainer, params, self._engine)
    _write_records(
      self._trainer.cfg.run.run_dir, self._trainer.step_num, records
    )
    return row

  def close(self) -> None:
    if self._engine is not None:
      self._engine.close()
      self._engine = None
    self._inner.close()


def mixed_version_fraction(policy_version, valid=None) -> float | None:
  """Share of the responses (rows `valid` keeps) whose tokens were sampled
  by more than one policy version: responses that spanned a weight swap.
  None when the versions are unknown."""
  import numpy as np

  if policy_version is None:
    return None
  rows = [
    np.asarray(v).reshape(-1)
    for i, v in enumerate(policy_version)
    if valid is None or bool(valid[i])
  ]
  if not rows:
    return 0.0
  return float(np.mean([np.unique(r).size > 1 for r in rows if r.size] or [0]))


def _count_mixed(collector) -> None:
  """Wraps `collector.collect` so that each rollout's metrics carry
  `version_mixed_fraction` (the trainer writes rollout.metrics as is)."""
  collect = collector.collect

  def counted(step, *args, **kwargs):
    rollout = collect(step, *args, **kwargs)
    mixed = mixed_version_fraction(
      rollout.batch.policy_version, getattr(rollout, "valid", None)
    )
    if mixed is not None and isinstance(rollout.metrics, dict):
      rollout.metrics["version_mixed_fraction"] = mixed
    return rollout

  collector.collect = counted


def _write_records(run_dir: str, step: int, records: list[dict]) -> str:
  path = os.path.join(run_dir, f"eval_step{step}.jsonl")
  with open(path + ".tmp", "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  os.replace(path + ".tmp", path)
  return path


def read_eval_records(run_dir: str) -> dict[int, list[dict]]:
  """{step: records} of every `eval_step<k>.jsonl` (or `.jsonl.gz`, as
  archived) of a run."""
  out = {}
  for name in os.listdir(run_dir):
    if not name.startswith("eval_step"):
      continue
    for suffix, opener in ((".jsonl", open), (".jsonl.gz", gzip.open)):
      step = name[len("eval_step") : -len(suffix)]
      if name.endswith(suffix) and step.isdigit():
        with opener(os.path.join(run_dir, name), "rt") as f:
          out[int(step)] = [json.loads(line) for line in f if line.strip()]
  return dict(sorted(out.items()))


def run(
  cfg, model=None, task=None, show_progress: bool = True, plot: bool = True
) -> dict:
  """Trains `cfg` to cfg.run.steps (resuming), with per-problem held-out
  records before and after; writes summary.json and returns it."""
  from absl import logging
  from rljax.train import metrics as metrics_lib
  from rljax.train.loop import Trainer

  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes
  t0 = time.perf_counter()
  trainer = Trainer(cfg, model=model, task=task, show_progress=show_progress)
  trainer.heldout = RecordingHeldOut(trainer)
  _count_mixed(trainer.collector)
  try:
    before = {}
    if cfg.task.eval_size and trainer.step_num == 0:
      before, records = eval_records(trainer)
      _write_records(cfg.run.run_dir, 0, records)
      trainer.writer.write(0, before)
    elif cfg.task.eval_size:  # a resume: measured by the run's first process
      before = metrics_lib.recorded_eval(cfg.run.run_dir, 0)
    rows = trainer.run()
    after = {}
    if cfg.task.eval_size:
      last = os.path.join(cfg.run.run_dir, f"eval_step{trainer.step_num}.jsonl")
      if rows and "eval_accuracy" in rows[-1] and os.path.exists(last):
        # --run.eval_every evaluated (and recorded) the last step already.
        after = {"eval_accuracy": rows[-1]["eval_accuracy"]}
      else:
        after, records = eval_records(trainer)
        _write_records(cfg.run.run_dir, trainer.step_num, records)
        trainer.writer.write(trainer.step_num, after)
    summary = {
      "run_dir": cfg.run.run_dir,
      "wall_s": time.perf_counter() - t0,
      "steps": trainer.step_num,
      "eval_accuracy_before": before.get("eval_accuracy"),
      "eval_accuracy_after": after.get("eval_accuracy"),
    }
  finally:
    trainer.close()
  if plot:
    from rljax.train.plots import plot_runs

    plot_runs([cfg.run.run_dir], os.path.join(cfg.run.run_dir, "plots.png"))
  with open(os.path.join(cfg.run.run_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  print("[rljax] summary: " + json.dumps(summary), flush=True)
  return summary


def release_memory() -> float:
  """Frees what a finished run left in this process, before the next run of
  a study starts; returns the resident set size after it (GiB).

  A closed Trainer drops its params, engine and optimizer state, but the
  process keeps every program compiled for it (JAX's caches, and the update
  steps that Trainers of equal configuration share), with the buffers
  they hold, and glibc keeps freed heap pages: a 4-run SmolLM2 grid
  reached 6.3 GiB at its second run where one run alone peaks at 5.2 GiB
  (measured). The next run recompiles what it needs (seconds on a CPU).
  """
  import ctypes
  import gc

  import jax

  from rljax.train import loop, placement

  loop._UPDATE_STEPS.clear()  # pylint: disable=protected-access
  placement._STEPS.clear()  # pylint: disable=protected-access
  jax.clear_caches()
  gc.collect()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):  # not glibc
    pass
  return rss_gib()


def rss_gib() -> float:
  """This process's resident set size now (GiB; 0 where /proc is absent)."""
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) / 2**20
  except OSError:
    pass
  return 0.0
