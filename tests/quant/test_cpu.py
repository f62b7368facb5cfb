"""CPU feature detection (rljax.quant.cpu)."""

from rljax.quant import cpu

_AMD = """processor\t: 0
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni sse4_2
processor\t: 1
model name\t: other
flags\t\t: fpu
"""
_SPR = """model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""


class TestParseCpuinfo:
  def test_amd_epyc_vnni_no_amx(self):
    info = cpu.parse_cpuinfo(_AMD)
    assert info.model == "AMD EPYC"
    assert info.flags == ("avx2", "avx512_bf16", "avx512_vnni", "avx512f")
    # Measured on this kind of machine: bf16 dots ~1.8x f32, int8 ~0.8x bf16.
    assert info.fast_int8_dot and info.fast_bf16_dot
    assert not info.int8_dot_beats_bf16
    assert "amx_int8=no" in info.summary()
    assert "avx512_vnni=yes" in info.summary()
    assert not info.onednn_int8_saturates

  def test_sapphire_rapids_amx(self):
    info = cpu.parse_cpuinfo(_SPR)
    assert info.has("amx_int8") and info.has("amx_bf16")
    assert info.fast_int8_dot and info.fast_bf16_dot
    assert info.int8_dot_beats_bf16

  def test_vnni_without_bf16_units(self):
    info = cpu.parse_cpuinfo(
      "model name\t: x\nflags\t\t: avx512f avx512_vnni\n"
    )
    assert info.fast_int8_dot and not info.fast_bf16_dot
    assert info.int8_dot_beats_bf16

  def test_avx2_only_epyc(self):
    # Zen 3: AVX2, no AVX-512, no VNNI. Measured there: f32 ~110 GFLOP/s,
    # int8 ~120 GOP/s, bf16 -> f32 ~75; oneDNN's int8 GEMM saturates.
    info = cpu.parse_cpuinfo("model name\t: AMD EPYC\nflags\t\t: fma avx2\n")
    assert not info.fast_int8_dot and not info.fast_bf16_dot
    assert info.onednn_int8_saturates
    spr = cpu.parse_cpuinfo(_SPR.replace("flags\t\t: ", "flags\t\t: avx2 "))
    assert spr.has("avx2") and not spr.onednn_int8_saturates

  def test_empty_text(self):
    info = cpu.parse_cpuinfo("")
    assert info.flags == () and not info.fast_int8_dot
    assert not info.onednn_int8_saturates  # not an x86 CPU we know
    assert info.model

  def test_host_cpu_is_cached(self):
    assert cpu.host_cpu() is cpu.host_cpu()
