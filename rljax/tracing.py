"""What a `jax.profiler` trace says about where a step's time went.

`jax.profiler.trace(dir, create_perfetto_trace=True)` writes a Chrome/perfetto
JSON trace (`*.trace.json.gz`) next to its protobuf. Reading that JSON needs
no profiler plugin, so a benchmark can print the answer to "what bounds this
step" beside its tokens/s:

  * `top_ops`: the XLA ops (CPU thunks or GPU kernels) that took longest,
    summed over their calls (a layer scan's or a decode loop's iterations).
  * `device_busy`: per accelerator stream, the time some kernel ran (the
    union of its kernels' intervals) against the window from the first
    kernel's start to the last one's end. A GPU decode loop that is busy a
    small share of its window is bound by launches and host round trips,
    not by its kernels; one that is busy nearly all of it is bound by them.

Only the standard library: this module sits at the bottom of rljax's layers.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
from typing import Any


def newest_trace(trace_dir: str) -> str | None:
  """The newest `*.trace.json.gz` under `trace_dir` (any depth), or None."""
  paths = glob.glob(
    os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True
  )
  return max(paths, key=os.path.getmtime) if paths else None


def load_events(path: str) -> list[dict[str, Any]]:
  """The trace's events (gzip'd or plain JSON, list or {"traceEvents"})."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    trace = json.load(f)
  return trace["traceEvents"] if isinstance(trace, dict) else trace


def _process_names(events) -> dict[Any, str]:
  return {
    e.get("pid"): e.get("args", {}).get("name", "")
    for e in events
    if e.get("ph") == "M" and e.get("name") == "process_name"
  }


def _is_op(event: dict[str, Any]) -> bool:
  # Complete events of XLA ops; "$..." are Python frames and Thunk* the
  # executor's own spans, which enclose the ops.
  name = event.get("name", "")
  return event.get("ph") == "X" and not name.startswith(("$", "Thunk"))


def top_ops(events, n: int = 12, device_only: bool = False) -> list[list]:
  """The `n` ops with the largest summed duration, as [name, ms, calls].

  Args:
    events: `load_events(...)`.
    n: how many to return, longest first.
    device_only: count only events of accelerator processes
      ("/device:GPU:0", "/device:TPU:0"), i.e. kernels, not the host's
      launch spans of the same ops.
  """
  if n < 0:
    raise ValueError(f"top_ops: n={n}; expected n >= 0")
  names = _process_names(events)
  total, calls = collections.Counter(), collections.Counter()
  for e in events:
    if not _is_op(e):
      continue
    if device_only and not _is_device(names.get(e.get("pid"), "")):
      continue
    total[e["name"]] += e.get("dur", 0)
    calls[e["name"]] += 1
  return [[k, v / 1e3, calls[k]] for k, v in total.most_common(n)]


def _is_device(process_name: str) -> bool:
  return process_name.startswith("/device:") and "CPU" not in process_name


def _union_us(intervals: list[tuple[float, float]]) -> float:
  """Length of the union of [start, end) intervals."""
  busy, end = 0.0, float("-inf")
  for s, e in sorted(intervals):
    if e <= end:
      continue
    busy += e - max(s, end)
    end = e
  return busy


def device_busy(events) -> dict[str, dict[str, float]]:
  """For each accelerator process: {"busy_ms", "window_ms", "busy_frac",
  "kernels"}.

  busy = |∪ kernel intervals| (overlapping streams count once), window =
  last kernel end − first kernel start. Empty on a CPU-only trace.
  """
  names = _process_names(events)
  spans = collections.defaultdict(list)
  for e in events:
    name = names.get(e.get("pid"), "")
    if _is_op(e) and _is_device(name):
      ts = float(e.get("ts", 0.0))
      spans[name].append((ts, ts + float(e.get("dur", 0.0))))
  out = {}
  for name, iv in sorted(spans.items()):
    window = max(e for _, e in iv) - min(s for s, _ in iv)
    busy = _union_us(iv)
    out[name] = {
      "busy_ms": busy / 1e3,
      "window_ms": window / 1e3,
      "busy_frac": busy / window if window > 0 else 1.0,
      "kernels": len(iv),
    }
  return out


def summarize(trace_dir: str, n: int = 12) -> dict[str, Any]:
  """`top_ops` (device kernels where there are any, else host ops) and
  `device_busy` of the newest trace under `trace_dir`; {} when none."""
  path = newest_trace(trace_dir)
  if path is None:
    return {}
  events = load_events(path)
  busy = device_busy(events)
  return {
    "trace": path,
    "top_ops": top_ops(events, n, device_only=bool(busy)),
    "device_busy": busy,
  }
