"""What `summary.json` says about a whole run, across the processes that
trained it.

A run may take several processes (a kill, then `--run.resume`). Each one
that opens the run directory adds its entry to `processes.json` and
rewrites it after every logged step (`ProcessClock`, through
`ClockedWriter`), so a process killed without cleaning up still counts up
to its last logged step. The summary is then made from the run's files, not
from the last process's memory: the training rows of `metrics.jsonl` (the
first step's reward is the first step's, whichever process trained it) and
the wall time summed over `processes.json`.

A run is finished when its newest checkpoint is its last step and its
`summary.json` says so (`finished`): re-running its command with
`--run.resume` then prints that and returns the summary, before anything is
built or written, so every file stays as it was. A process killed between
the last checkpoint and the summary leaves no such summary: the next
invocation restores the last step, trains nothing, and writes the whole
run's summary.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from rljax.train import atomic
from rljax.train import critic_pretrain
from rljax.train import metrics as metrics_lib

PROCESSES_FILE = "processes.json"
SUMMARY_FILE = "summary.json"


def _read_json(path: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def newest_checkpoint(run_dir: str) -> int | None:
  """The newest step directory under `<run_dir>/checkpoints` (verified or
  not: only a finished run's summary is trusted, and it was written after
  its last checkpoint verified)."""
  ckpt = os.path.join(run_dir, "checkpoints")
  if not os.path.isdir(ckpt):
    return None
  steps = [int(d) for d in os.listdir(ckpt) if d.isdigit()]
  return max(steps) if steps else None


def finished(cfg: Any) -> dict | None:
  """The summary of a finished run in `cfg.run.run_dir` (None: not one):
  `--run.resume` is set, the summary covers the whole run (`processes` is
  in it) to the run's last step, and no checkpoint is newer. Reads only."""
  if not cfg.run.resume:
    return None
  run_dir = cfg.run.run_dir
  summary = _read_json(os.path.join(run_dir, SUMMARY_FILE))
  total = critic_pretrain.total_steps(cfg)
  if (
    not isinstance(summary, dict)
    or "processes" not in summary
    or summary.get("steps") != total
    or newest_checkpoint(run_dir) != total
  ):
    return None
  return summary


class ProcessClock:
  """This process's entry in `<run_dir>/processes.json`: when it started,
  its wall seconds so far and the steps it logged. `tick` rewrites the
  file (atomically); only the main process writes (`writer` False: a
  clock that only counts)."""

  def __init__(self, run_dir: str, start: float, writer: bool = True):
    self.path = os.path.join(run_dir, PROCESSES_FILE)
    self.start = start
    self.writer = writer
    earlier = _read_json(self.path) if writer else None
    self.earlier = list(earlier.get("processes", [])) if earlier else []
    self.entry = {
      "pid": os.getpid(),
      "host": socket.gethostname(),
      "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
      "wall_s": 0.0,
      "first_step": None,
      "last_step": None,
    }

  def tick(self, step: int | None = None) -> None:
    """Counts the time up to now (and `step` as logged) and writes."""
    self.entry["wall_s"] = time.perf_counter() - self.start
    if step is not None:
      if self.entry["first_step"] is None:
        self.entry["first_step"] = int(step)
      self.entry["last_step"] = int(step)
    if self.writer:
      atomic.write_json(self.path, {"processes": self.processes()})

  def processes(self) -> list[dict]:
    return self.earlier + [dict(self.entry)]


class ClockedWriter:
  """A `MetricsWriter` whose every row also ticks a `ProcessClock`."""

  def __init__(self, writer: Any, clock: ProcessClock):
    self._writer = writer
    self._clock = clock

  def write(self, step: int, metrics: Any) -> dict[str, float]:
    row = self._writer.write(step, metrics)
    self._clock.tick(step)
    return row

  def __getattr__(self, name: str) -> Any:
    return getattr(self._writer, name)


def training_rows(run_dir: str) -> list[dict]:
  """metrics.jsonl's rows of trained steps (an evaluation-only row has no
  reward), one per step: the whole run's, from its first step."""
  if not metrics_lib.has_metrics(run_dir):
    return []
  by_step = {}
  for row in metrics_lib.read_metrics(run_dir):
    if "reward_mean" in row:
      by_step[int(row["step"])] = row
  return [by_step[s] for s in sorted(by_step)]


def quarter_mean(rows: list[dict], first: bool) -> float | None:
  if not rows:
    return None
  q = max(1, len(rows) // 4)
  part = rows[:q] if first else rows[-q:]
  return sum(r["reward_mean"] for r in part) / len(part)


def total_wall(clock: ProcessClock) -> float:
  """Wall seconds of every process of the run, this one up to now."""
  clock.tick()
  return sum(float(p["wall_s"]) for p in clock.processes())


def whole_run(
  run_dir: str, steps: int, clock: ProcessClock, rows: list[dict]
) -> dict:
  """The summary fields that describe the whole run: steps, wall time over
  every process, rewards from `rows` (`training_rows`)."""
  return {
    "run_dir": run_dir,
    "wall_s": total_wall(clock),
    "steps": steps,
    "processes": len(clock.processes()),
    "first_reward": rows[0]["reward_mean"] if rows else None,
    "last_reward": rows[-1]["reward_mean"] if rows else None,
    "mean_reward_first_quarter": quarter_mean(rows, first=True),
    "mean_reward_last_quarter": quarter_mean(rows, first=False),
  }
