"""What a `jax.profiler` trace says about where a step's time went.

`jax.profiler.trace(dir, create_perfetto_trace=True)` writes a Chrome/perfetto
JSON trace (`*.trace.json.gz`) next to its protobuf. Reading that JSON needs
no profiler plugin, so a benchmark can print the answer to "what bounds this
step" beside its tokens/s:

  * `top_ops`: the XLA ops (CPU thunks or GPU kernels) that took longest,
    summed over their calls (a layer scan's or a decode loop's iterations).
  * `time_shares`: the device time by kernel category (matmul, attention,
    elementwise, ...) and by JAX name scope (e.g. the log-prob head).
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
import re
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


# Kernel-name patterns of each category, tried in this order (the first
# that matches wins). cuBLAS/cuBLASLt GEMMs on Hopper are "nvjet_*" or
# "sm90_xmma_*"; cuDNN's flash attention kernels carry "flash"/"fmha"/"sdpa"
# or "cudnn" in their names; XLA's own fusions are "loop_*"/"input_*"
# (elementwise and reductions) and Triton GEMM fusions "triton_gemm*".
_CATEGORY_PATTERNS = (
  ("attention", ("flash", "fmha", "sdpa", "cudnn", "attention")),
  ("matmul", ("gemm", "nvjet", "xmma", "cublas", "cutlass", "wgmma", "dot")),
  ("copy", ("copy", "memcpy", "memset", "transpose", "dynamic_update_slice")),
  ("reduction", ("reduce", "input_")),
  ("elementwise", ("loop_", "fusion", "convert", "multiply", "add")),
)


def categorize(name: str) -> str:
  """The category of a kernel or op name (`_CATEGORY_PATTERNS`), or
  "other"."""
  low = name.lower()
  for category, patterns in _CATEGORY_PATTERNS:
    if any(p in low for p in patterns):
      return category
  return "other"


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")


def hlo_op_names(hlo_text: str) -> dict[str, str]:
  """{HLO instruction name: the JAX name stacks of its metadata}, from a
  compiled module's text (`compiled.as_text()`). A fusion gets the name
  stacks of every instruction of the computation it calls, so a kernel in a
  trace (whose args name only its HLO op) can be traced back to the JAX
  scopes it ran: `jax.named_scope`s, "rematted_computation" for what a
  `jax.checkpoint` recomputes in the backward pass, "transpose(" for the
  backward pass itself."""
  own: dict[str, str] = {}
  calls: dict[str, list[str]] = {}
  body: dict[str, list[str]] = collections.defaultdict(list)
  current = None
  for line in hlo_text.splitlines():
    m = _COMPUTATION.match(line)
    if m and "=" not in line.split("(")[0]:
      current = m.group(1)
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    name, rest = m.groups()
    stacks = " ".join(_OP_NAME.findall(rest))
    own[name] = stacks
    calls[name] = _CALLS.findall(rest)
    if current is not None and stacks:
      body[current].append(stacks)
  return {
    name: " ".join([text] + [" ".join(body.get(c, ())) for c in calls[name]])
    for name, text in own.items()
  }


def time_shares(
  events,
  scopes: tuple[str, ...] = (),
  op_names: dict[str, str] | None = None,
) -> dict[str, Any]:
  """Where the device time went: {"total_ms", "by_category": {category:
  ms}, "by_scope": {scope: ms}}.

  Categories come from the kernel names (`categorize`). A scope is counted
  when its text appears in the JAX name stacks of the event's HLO op
  (`op_names`, from `hlo_op_names`), e.g. `jax.named_scope("logprob_head")`
  or "rematted_computation"; scopes may overlap each other and the
  categories. Device kernels where there are any, else host ops."""
  op_names = op_names or {}
  # Kernels that run inside an XLA command buffer (a CUDA graph) carry the
  # buffer as their hlo_op; their names are their fusions' with "_" for ".".
  by_kernel_name = {k.replace(".", "_"): v for k, v in op_names.items()}
  names = _process_names(events)
  ops = [e for e in events if _is_op(e)]
  dev = [e for e in ops if _is_device(names.get(e.get("pid"), ""))]
  ops = dev or ops
  by_cat = collections.Counter()
  by_scope = collections.Counter()
  for e in ops:
    dur = e.get("dur", 0) / 1e3
    by_cat[categorize(e.get("name", ""))] += dur
    if scopes:
      text = op_names.get(e.get("args", {}).get("hlo_op", "")) or (
        by_kernel_name.get(e.get("name", ""), "")
      )
      for scope in scopes:
        if scope.lower() in text:
          by_scope[scope] += dur
  return {
    "total_ms": sum(by_cat.values()),
    "by_category": dict(by_cat.most_common()),
    "by_scope": {s: by_scope.get(s, 0.0) for s in scopes},
  }


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
