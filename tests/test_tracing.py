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


class TestCategorize:
  @pytest.mark.parametrize(
    "name,category",
    [
      ("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT", "matmul"),
      ("sm90_xmma_gemm_i8i32_i8i32_i32_tn_n_tilesize128x128x128", "matmul"),
      ("gemm_fusion_dot_339", "matmul"),
      ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma", "attention"),
      ("loop_multiply_fusion_6", "elementwise"),
      ("input_reduce_fusion_2", "reduction"),
      ("memcpy128", "copy"),
      ("something_else", "other"),
    ],
  )
  def test_kernel_names_seen_on_an_h200(self, name, category):
    assert tracing.categorize(name) == category


# The text of a compiled module as `compiled.as_text()` prints it: a fused
# computation whose instructions carry the name stacks, the fusion that
# calls it (no metadata of its own), and a plain dot.
HLO = """HloModule jit_step
%fused_computation.3 (p0: f32[4]) -> f32[4] {
  %p0 = f32[4] parameter(0)
  ROOT %m = f32[4] multiply(%p0, %p0), metadata={op_name="jit(step)/transpose(jvp(logprob_head))/checkpoint/rematted_computation/mul"}
}
ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  %loop_multiply_fusion.3 = f32[4] fusion(%a), kind=kLoop, calls=%fused_computation.3
  ROOT %dot.7 = f32[4] dot(%a, %a), metadata={op_name="jit(step)/jvp(decoder)/dot_general"}
}
"""


class TestTimeShares:
  def test_hlo_op_names_give_a_fusion_its_computations_stacks(self):
    names = tracing.hlo_op_names(HLO)
    assert "rematted_computation" in names["loop_multiply_fusion.3"]
    assert "logprob_head" in names["loop_multiply_fusion.3"]
    assert names["dot.7"] == "jit(step)/jvp(decoder)/dot_general"

  def test_device_time_by_category_and_by_scope(self):
    def op(name, hlo_op, dur):
      event = _op(2, name, 0, dur)
      event["args"] = {"hlo_op": hlo_op}
      return event

    events = [
      _meta(1, "/host:CPU"),
      _meta(2, "/device:GPU:0"),
      _op(1, "launch", 0, 999),  # host spans are not device time
      op("loop_multiply_fusion_3", "loop_multiply_fusion.3", 30),
      op("nvjet_sm90_tst", "dot.7", 70),
    ]
    got = tracing.time_shares(
      events,
      scopes=("logprob_head", "rematted_computation", "decoder"),
      op_names=tracing.hlo_op_names(HLO),
    )
    assert got["total_ms"] == pytest.approx(0.1)
    assert got["by_category"] == pytest.approx(
      {"matmul": 0.07, "elementwise": 0.03}
    )
    assert got["by_scope"] == pytest.approx(
      {"logprob_head": 0.03, "rematted_computation": 0.03, "decoder": 0.07}
    )

  def test_kernels_inside_a_cuda_graph_are_named_by_kernel(self):
    # Inside an XLA command buffer every kernel's hlo_op is the buffer
    # ("command_buffer_1"); its name is the fusion's, with "_" for ".".
    event = _op(2, "loop_multiply_fusion_3", 0, 40)
    event["args"] = {"hlo_op": "command_buffer_1"}
    got = tracing.time_shares(
      [_meta(2, "/device:GPU:0"), event],
      scopes=("rematted_computation",),
      op_names=tracing.hlo_op_names(HLO),
    )
    assert got["by_scope"]["rematted_computation"] == pytest.approx(0.04)
