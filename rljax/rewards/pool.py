"""Scoring a batch of completions in worker processes, with per-item timeouts.

``RewardPool(fn).score(inputs)`` returns one ``RewardBatch``: scores and
components as arrays, plus counts of items that timed out or failed (those
score 0). A hung reward is killed with its process and the process replaced;
an exception or a dead process fails only its item. Nothing a reward function
does can stop the training run.

``mode="serial"`` scores in the calling process (tests, debugging); its
timeout is a SIGALRM deadline that only works in the main thread and cannot
interrupt C code.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import select
import time
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from rljax.rewards import equivalence, isolation
from rljax.rewards.base import RewardOutput, reward_name, to_reward_output

__all__ = ["RewardBatch", "RewardInput", "RewardPool", "make_inputs"]

ItemStatus = Literal["ok", "error", "timeout"]


@dataclasses.dataclass(frozen=True)
class RewardInput:
  """The four arguments of a reward function for one completion."""

  prompt: str
  completion: str
  ground_truth: str
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def make_inputs(
  prompts: Sequence[str],
  completions: Sequence[str],
  ground_truths: Sequence[str],
  metadatas: Sequence[Mapping[str, Any]] | None = None,
) -> list[RewardInput]:
  """Zips parallel lists into ``RewardInput``s (lengths must agree)."""
  lengths = {
    "prompts": len(prompts),
    "completions": len(completions),
    "ground_truths": len(ground_truths),
  }
  if metadatas is not None:
    lengths["metadatas"] = len(metadatas)
  if len(set(lengths.values())) > 1:
    raise ValueError(f"make_inputs: lengths differ: {lengths}")
  metadatas = metadatas if metadatas is not None else [{}] * len(prompts)
  return [
    RewardInput(*row)
    for row in zip(prompts, completions, ground_truths, metadatas)
  ]


@dataclasses.dataclass(frozen=True)
class RewardBatch:
  """Rewards for a batch.

  Attributes:
    scores: [N] float32; 0 for items that timed out or failed.
    components: name -> [N] float32 (0 where an item lacks the component).
    status: per item "ok", "error" or "timeout".
    metrics: items, timeouts, errors, worker_restarts, seconds.
  """

  scores: np.ndarray
  components: dict[str, np.ndarray]
  status: tuple[ItemStatus, ...]
  metrics: dict[str, float]


def _call_reward(
  fn: Callable[..., Any], name: str, prompt, completion, ground_truth, metadata
) -> RewardOutput:
  return to_reward_output(fn(prompt, completion, ground_truth, metadata), name)


class RewardPool:
  """Computes ``reward_fn`` over batches in worker processes.

  Args:
    reward_fn: ``fn(prompt, completion, ground_truth, metadata)`` returning
      a float or ``RewardOutput``. For ``mode="process"`` it must be
      picklable by reference (module-level function or dataclass instance,
      not defined in ``__main__``).
    mode: "process" (default) or "serial" (in the calling process).
    num_workers: worker processes (default: min(4, CPU count)).
    timeout_s: per-item limit; an item over it scores 0 and counts as a
      timeout.
    startup_timeout_s: limit for a worker process to import its function.
    warm_up: run once in each worker before it takes items (picklable, no
      arguments); the default loads math-verify, which takes seconds.
  """

  def __init__(
    self,
    reward_fn: Callable[..., Any],
    *,
    mode: Literal["process", "serial"] = "process",
    num_workers: int | None = None,
    timeout_s: float = 10.0,
    startup_timeout_s: float = 120.0,
    warm_up: Callable[[], Any] | None = equivalence.warm_up,
  ):
    if not callable(reward_fn):
      raise TypeError(
        f"RewardPool: reward_fn is {type(reward_fn).__name__}, not callable"
      )
    if mode not in ("process", "serial"):
      raise ValueError(
        f"RewardPool: mode is {mode!r}; expected 'process' or 'serial'"
      )
    if num_workers is None:
      num_workers = min(4, os.cpu_count() or 1)
    if (
      isinstance(num_workers, bool)
      or not isinstance(num_workers, int)
      or num_workers < 1
    ):
      raise ValueError(
        f"RewardPool: num_workers is {num_workers!r}; expected an int >= 1"
      )
    if not timeout_s > 0:
      raise ValueError(f"RewardPool: timeout_s is {timeout_s!r}; expected > 0")
    if mode == "process":
      isolation.check_importable(reward_fn)
    self.reward_fn = reward_fn
    self.mode = mode
    self.num_workers = num_workers
    self.timeout_s = float(timeout_s)
    self.startup_timeout_s = float(startup_timeout_s)
    self._name = reward_name(reward_fn)
    self._target = functools.partial(_call_reward, reward_fn, self._name)
    self._warm_up = warm_up
    self._workers: list[isolation.IsolatedWorker] = []
    self._restarts = 0

  # -- lifecycle ---------------------------------------------------------
  def start(self) -> None:
    """Starts the worker processes and waits until all have loaded the
    reward function (``score`` does this on first use)."""
    if self.mode != "process" or self._workers:
      return
    workers = [
      isolation.IsolatedWorker(
        self._target,
        warm_up=self._warm_up,
        startup_timeout_s=self.startup_timeout_s,
      )
      for _ in range(self.num_workers)
    ]
    try:
      for worker in workers:
        worker.start()
      for worker in workers:
        worker.wait_ready()
    except BaseException:
      for worker in workers:
        worker.kill()
      raise
    self._workers = workers

  def close(self) -> None:
    """Ends the worker processes."""
    for worker in self._workers:
      worker.kill()
    self._workers = []

  def __enter__(self) -> "RewardPool":
    self.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def __del__(self):
    try:
      self.close()
    except Exception:
      pass

  # -- scoring -------------------------------------------------------------
  def score(
    self, inputs: Sequence[RewardInput], *, progress: bool = False
  ) -> RewardBatch:
    """Rewards for ``inputs``, in order."""
    for index, item in enumerate(inputs):
      if not isinstance(item, RewardInput):
        raise TypeError(
          f"RewardPool.score: inputs[{index}] is {type(item).__name__}; expected RewardInput"
        )
    start = time.monotonic()
    restarts_before = self._restarts
    bar = _progress_bar(len(inputs), progress)
    if self.mode == "serial":
      outputs, status = self._score_serial(inputs, bar)
    else:
      outputs, status = self._score_processes(inputs, bar)
    if bar is not None:
      bar.close()
    return _assemble(
      outputs,
      status,
      time.monotonic() - start,
      self._restarts - restarts_before,
    )

  def _score_serial(self, inputs, bar):
    outputs: list[RewardOutput | None] = []
    status: list[ItemStatus] = []
    for item in inputs:
      try:
        with isolation.time_limit(self.timeout_s):
          out = self._target(
            item.prompt, item.completion, item.ground_truth, item.metadata
          )
        outputs.append(out)
        status.append("ok")
      except isolation.ItemTimeout:
        outputs.append(None)
        status.append("timeout")
      except Exception:
        outputs.append(None)
        status.append("error")
      if bar is not None:
        bar.update(1)
    return outputs, status

  def _replace_worker(self, index: int) -> None:
    self._workers[index].kill()
    self._restarts += 1
    self._workers[index].start()

  def _score_processes(self, inputs, bar):
    self.start()
    count = len(inputs)
    outputs: list[RewardOutput | None] = [None] * count
    status: list[ItemStatus] = ["error"] * count
    pending = collections.deque(range(count))
    idle = [i for i, w in enumerate(self._workers) if w.ready]
    starting = {
      i: time.monotonic() + self.startup_timeout_s
      for i, w in enumerate(self._workers)
      if not w.ready
    }
    busy: dict[int, tuple[int, float]] = {}  # worker -> (item, deadline)

    def finish(
      item: int, item_status: ItemStatus, output: RewardOutput | None = None
    ) -> None:
      status[item] = item_status
      outputs[item] = output
      if bar is not None:
        bar.update(1)

    def fail_worker(worker: int, item_status: ItemStatus) -> None:
      item, _ = busy.pop(worker)
      finish(item, item_status)
      self._replace_worker(worker)
      starting[worker] = time.monotonic() + self.startup_timeout_s

    while pending or busy:
      while idle and pending:
        worker, item = idle.pop(), pending.popleft()
        row = inputs[item]
        busy[worker] = (item, time.monotonic() + self.timeout_s)
        try:
          self._workers[worker].send(
            item, (row.prompt, row.completion, row.ground_truth, row.metadata)
          )
        except OSError:
          fail_worker(worker, "error")
      if not busy and not starting:
        continue
      deadlines = [d for _, d in busy.values()] + list(starting.values())
      wait_s = max(0.0, min(deadlines) - time.monotonic())
      watched = {
        self._workers[w].fileno(): w for w in list(busy) + list(starting)
      }
      readable, _, _ = select.select(list(watched), [], [], wait_s)
      for fd in readable:
        worker = watched[fd]
        ok, message = self._workers[worker].receive()
        if worker in starting:
          if not ok or message[0] != "ready":
            reason = "exited" if not ok else message[1]
            raise isolation.WorkerError(
              f"a replacement reward worker failed to start: {reason}"
            )
          self._workers[worker].ready = True
          del starting[worker]
          idle.append(worker)
        elif not ok:
          fail_worker(worker, "error")  # the process died mid-item
        else:
          item_id, item_status, value = message
          item, _ = busy.pop(worker)
          if item_id != item:
            raise isolation.WorkerError(
              f"reward worker answered item {item_id}, expected {item}"
            )
          if item_status == "ok":
            finish(item, "ok", value)
          else:
            finish(item, "error")
          idle.append(worker)
      now = time.monotonic()
      for worker, (item, deadline) in list(busy.items()):
        if deadline <= now:
          fail_worker(worker, "timeout")
      for worker, deadline in starting.items():
        if deadline <= now:
          raise isolation.WorkerError(
            f"a replacement reward worker did not start within {self.startup_timeout_s:.0f} s"
          )
    return outputs, status


def _progress_bar(total: int, enabled: bool):
  if not enabled:
    return None
  from tqdm.auto import tqdm

  return tqdm(total=total, desc="rewards", unit="item")


def _assemble(outputs, status, seconds: float, restarts: int) -> RewardBatch:
  count = len(outputs)
  scores = np.zeros(count, np.float32)
  names: dict[str, None] = {}  # ordered set: first-seen order
  for out in outputs:
    if out is not None:
      names.update(dict.fromkeys(out.components))
  components = {name: np.zeros(count, np.float32) for name in names}
  for index, out in enumerate(outputs):
    if out is None:
      continue
    scores[index] = out.score
    for name, value in out.components.items():
      components[name][index] = value
  metrics = {
    "items": float(count),
    "timeouts": float(sum(s == "timeout" for s in status)),
    "errors": float(sum(s == "error" for s in status)),
    "worker_restarts": float(restarts),
    "seconds": seconds,
  }
  return RewardBatch(scores, components, tuple(status), metrics)
