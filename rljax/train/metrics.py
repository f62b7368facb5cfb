"""Per-step metrics: one JSON object a line in `metrics.jsonl`, TensorBoard
scalars beside it, and a console progress bar with ETA.

The JSONL file is appended and flushed every step, so a crash loses nothing
already logged; a resumed run truncates it back to its checkpoint's step so
the file never holds two different step 4s.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import time
from typing import Any, Mapping

import numpy as np

from rljax import distributed
from rljax.train import atomic


def to_float(value: Any) -> float | None:
  """Host float of a scalar-like value (jax/numpy scalar, 0-d array)."""
  try:
    f = float(np.asarray(value))
  except (TypeError, ValueError):
    return None
  return f


def nonfinite_keys(metrics: Mapping[str, Any]) -> list[str]:
  return sorted(
    k
    for k, v in metrics.items()
    if isinstance(v, float) and not math.isfinite(v)
  )


class MetricsWriter:
  """Writes flat dicts of floats per step to JSONL and (optionally) TensorBoard."""

  def __init__(
    self, run_dir: str, tensorboard: bool = True, resume_step: int | None = None
  ):
    self._file = self._tb = None
    if not distributed.is_main_process():
      return  # multi-host: process 0 writes; `write` still returns the row
    os.makedirs(run_dir, exist_ok=True)
    self.path = os.path.join(run_dir, "metrics.jsonl")
    if resume_step is not None and os.path.exists(self.path):
      self._truncate_after(resume_step)
    elif resume_step is None and os.path.exists(self.path):
      # A fresh start in a directory with an earlier run's log (one that
      # never checkpointed): keep that log under another name, never delete.
      stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
      kept = os.path.join(run_dir, f"metrics.{stamp}.jsonl")
      while os.path.exists(kept):
        kept = kept[: -len(".jsonl")] + "_.jsonl"
      os.replace(self.path, kept)
      print(
        f"[rljax] {self.path} held an earlier run's metrics; moved to {kept}",
        flush=True,
      )
    self._file = open(self.path, "a", encoding="utf-8")
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(os.path.join(run_dir, "tb"))
      except ImportError:  # TensorBoard is optional; JSONL is the record.
        self._tb = None

  def _truncate_after(self, step: int) -> None:
    kept = []
    with open(self.path, encoding="utf-8") as f:
      for line in f:
        try:
          if json.loads(line).get("step", 0) <= step:
            kept.append(line)
        except json.JSONDecodeError:
          break  # a line cut by the crash ends the file
    # Atomic: a kill inside this rewrite must not lose the kept rows.
    atomic.write_text(self.path, "".join(kept))

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
    row: dict[str, Any] = {"step": int(step)}
    for k, v in metrics.items():
      f = to_float(v)
      if f is not None:
        row[k] = f if math.isfinite(f) else str(f)
    if self._file is None:
      return row
    line = json.dumps(row) + "\n"
    try:
      self._file.write(line)
      self._file.flush()
    except OSError as e:
      if atomic.is_disk_full(e):
        raise atomic.DiskFullError(
          os.path.dirname(self.path), len(line), "a metrics.jsonl row"
        ) from e
      raise
    if self._tb is not None:
      for k, v in row.items():
        if k != "step" and isinstance(v, float):
          self._tb.add_scalar(k, v, step)
      self._tb.flush()
    return row

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
    if self._tb is not None:
      self._tb.close()


def metrics_path(run_dir: str) -> str:
  """The run's `metrics.jsonl`, or its gzip `metrics.jsonl.gz` where only
  that exists (archived studies are stored compressed: ~10x smaller)."""
  path = os.path.join(run_dir, "metrics.jsonl")
  if not os.path.exists(path) and os.path.exists(path + ".gz"):
    return path + ".gz"
  return path


def has_metrics(run_dir: str) -> bool:
  return os.path.isfile(metrics_path(run_dir))


def _open_text(path: str):
  if path.endswith(".gz"):
    return gzip.open(path, "rt", encoding="utf-8")
  return open(path, encoding="utf-8")


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
  rows = []
  with _open_text(metrics_path(run_dir)) as f:
    for line in f:
      line = line.strip()
      if line:
        rows.append(json.loads(line))
  return rows


def recorded_eval(run_dir: str, step: int = 0) -> dict[str, float]:
  """The held-out evaluation `metrics.jsonl` holds for `step` ({} if none):
  a resumed run's "before training" numbers (step 0) were measured by the
  process that started it."""
  path = metrics_path(run_dir)
  if not os.path.exists(path):
    return {}
  with _open_text(path) as f:
    for line in f:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue  # a line cut by a killed process
      if row.get("step") == step and "eval_accuracy" in row:
        return {k: v for k, v in row.items() if k.startswith("eval_")}
  return {}
