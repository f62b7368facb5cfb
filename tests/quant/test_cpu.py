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
    assert info.flags == ("avx512_bf16", "avx512_vnni", "avx512f")
    # Measured on this kind of machine: bf16 dots ~1.8x f32, int8 ~0.8x bf16.
    assert info.fast_int8_dot and info.fast_bf16_dot
    assert not info.int8_dot_beats_bf16
    assert "amx_int8=no" in info.summary()
    assert "avx512_vnni=yes" in info.summary()

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

  def test_empty_text(self):
    info = cpu.parse_cpuinfo("")
    assert info.flags == () and not info.fast_int8_dot
    assert info.model

  def test_host_cpu_is_cached(self):
    assert cpu.host_cpu() is cpu.host_cpu()
