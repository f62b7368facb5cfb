"""rljax.tracing: what a profiler trace says about a step's time."""

import gzip
import json
import os

import jax
import jax.numpy as jnp
import pytest

from rljax import tracing


def _meta(pid, name):
  return {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}


def _op(pid, name, ts, dur):
  return {"ph": "X", "pid": pid, "tid": 1, "name": name, "ts": ts, "dur": dur}


# A hand-made trace: the host launches two kernels; the GPU runs "dot" twice
# (0-10 us and 30-50 us) and "add" once, overlapping the first dot on a
# second stream (5-15 us). Busy = |[0, 15) U [30, 50)| = 35 us of a 50 us
# window.
EVENTS = [
  _meta(1, "/host:CPU"),
  _meta(2, "/device:GPU:0"),
  _op(1, "dot", 0, 100),
  _op(1, "$python_frame", 0, 500),
  _op(1, "ThunkExecutor", 0, 500),
  _op(2, "dot", 0, 10),
  _op(2, "add", 5, 10),
  _op(2, "dot", 30, 20),
  {"ph": "i", "pid": 2, "name": "marker", "ts": 60},
]


class TestTopOps:
  def test_host_and_device_ops_summed_frames_and_thunks_left_out(self):
    got = tracing.top_ops(EVENTS)
    assert got == [["dot", 0.13, 3], ["add", 0.01, 1]]

  def test_device_only_counts_kernels(self):
    got = tracing.top_ops(EVENTS, device_only=True)
    assert got == [["dot", 0.03, 2], ["add", 0.01, 1]]

  def test_n_limits_and_a_negative_n_is_named(self):
    assert tracing.top_ops(EVENTS, n=1) == [["dot", 0.13, 3]]
    with pytest.raises(ValueError, match="n=-1"):
      tracing.top_ops(EVENTS, n=-1)


class TestDeviceBusy:
  def test_union_of_overlapping_kernels_over_the_window(self):
    got = tracing.device_busy(EVENTS)
    assert list(got) == ["/device:GPU:0"]
    b = got["/device:GPU:0"]
    assert b["busy_ms"] == pytest.approx(0.035)
    assert b["window_ms"] == pytest.approx(0.050)
    assert b["busy_frac"] == pytest.approx(0.7)
    assert b["kernels"] == 3

  def test_a_kernel_inside_another_counts_once(self):
    events = [
      _meta(2, "/device:GPU:0"),
      _op(2, "a", 0, 100),
      _op(2, "b", 10, 5),
    ]
    b = tracing.device_busy(events)["/device:GPU:0"]
    assert b["busy_ms"] == pytest.approx(0.1)
    assert b["busy_frac"] == pytest.approx(1.0)

  def test_cpu_only_trace_has_no_device(self):
    assert tracing.device_busy(EVENTS[:1] + EVENTS[2:5]) == {}


class TestSummarize:
  def test_reads_the_newest_gzipped_trace(self, tmp_path):
    old = tmp_path / "a" / "old.trace.json.gz"
    new = tmp_path / "b" / "c" / "new.trace.json.gz"
    for path, events in ((old, EVENTS[:3]), (new, EVENTS)):
      path.parent.mkdir(parents=True)
      with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    os.utime(old, (1, 1))
    got = tracing.summarize(str(tmp_path))
    assert got["trace"] == str(new)
    # A trace with a device reports its kernels, not the host's spans.
    assert got["top_ops"] == [["dot", 0.03, 2], ["add", 0.01, 1]]
    assert got["device_busy"]["/device:GPU:0"]["busy_frac"] == pytest.approx(
      0.7
    )

  def test_no_trace_is_empty(self, tmp_path):
    assert tracing.summarize(str(tmp_path)) == {}

  def test_a_real_cpu_trace_names_the_jitted_ops(self, tmp_path):
    f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
    x = jnp.ones((256, 256))
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
      for _ in range(3):
        f(x).block_until_ready()
    got = tracing.summarize(str(tmp_path))
    assert got["device_busy"] == {}  # the CPU backend: host ops only
    assert got["top_ops"], "the trace had no op"
    assert all(ms >= 0 and n >= 1 for _, ms, n in got["top_ops"])
    assert not any(
      name.startswith(("$", "Thunk")) for name, _, _ in got["top_ops"]
    )
