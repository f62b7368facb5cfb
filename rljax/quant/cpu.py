"""What the host CPU is fast at, read from /proc/cpuinfo.

XLA:CPU reaches different kernels on different x86 machines, and the gap is
large (docs/performance.md): on Intel Sapphire Rapids, AMX makes bf16 x bf16
-> f32 dots ~5x and int8 x int8 -> int32 dots ~10x faster than f32; on an AMD
EPYC with AVX512-BF16 and AVX-512 VNNI but no AMX, bf16 x bf16 -> f32 dots
are ~1.6-1.9x f32 and int8 -> int32 ~0.8-1.05x bf16 (W8A8 with its activation
quantization 0.7-0.95x), so int8 does not beat bf16 there (XLA 0.10, 2
cores, SmolLM2 decode shapes); on an AMD EPYC with AVX2 only (Zen 3), f32
runs ~100-120 GFLOP/s, int8 -> int32 about the same, and bf16 x bf16 -> f32
~75 (slower than f32: no bf16 units). Code that picks a compute path
asks here instead of assuming.
"""

from __future__ import annotations

import dataclasses
import functools
import platform

# Flags of /proc/cpuinfo that decide the fast dot path.
FLAGS = (
  "avx2",
  "avx512f",
  "avx512_vnni",
  "avx512_bf16",
  "amx_tile",
  "amx_int8",
  "amx_bf16",
  "avx_vnni",
)


@dataclasses.dataclass(frozen=True)
class CpuInfo:
  """Model name and the dot-relevant feature flags of the host CPU."""

  model: str
  flags: tuple[str, ...]

  def has(self, flag: str) -> bool:
    return flag in self.flags

  @property
  def fast_int8_dot(self) -> bool:
    """int8 x int8 -> int32 dots run on AMX or VNNI units."""
    return (
      self.has("amx_int8") or self.has("avx512_vnni") or self.has("avx_vnni")
    )

  @property
  def fast_bf16_dot(self) -> bool:
    """bf16 x bf16 -> f32 dots beat f32 by a wide margin: ~5x with AMX-BF16
    (Sapphire Rapids), ~1.7-2x with AVX512-BF16 alone (AMD EPYC; XLA
    converts bf16 to f32 inside the kernel on CPUs with neither)."""
    return self.has("amx_bf16") or self.has("avx512_bf16")

  @property
  def int8_dot_beats_bf16(self) -> bool:
    """int8 x int8 -> int32 dots outrun bf16 x bf16 -> f32 ones: with AMX
    (~2x), or with VNNI on a CPU without bf16 dot units. With AVX-512 VNNI
    and AVX512-BF16 both (AMD EPYC) XLA's int8 dot is ~0.8x the bf16 one."""
    if self.has("amx_int8"):
      return True
    return self.fast_int8_dot and not self.fast_bf16_dot

  @property
  def onednn_int8_saturates(self) -> bool:
    """oneDNN's s8 x s8 GEMM (vLLM-CPU's INT8 W8A8 kernel) loses accuracy.

    Without VNNI or AMX-INT8, the x86 int8 GEMM multiplies u8 x s8 pairs
    with `vpmaddubsw`, which adds two products into a saturating int16:
    255 * 127 * 2 = 64,770 > 32,767, so codes |w| > 63 overflow. Measured
    with vLLM-CPU 0.32 on an AVX2-only AMD EPYC (Zen 3): full-range codes
    give a 12.9% relative error against the exact int8 product, codes
    |w| <= 63 0.33% (bf16 output rounding); SmolLM2-135M INT8 greedy text
    then drifts (mean |log-prob error| 0.22 against the W8A8 model).
    XLA's int8 dot (the JAX sampler) is exact on the same CPU.
    """
    return self.has("avx2") and not self.fast_int8_dot

  def summary(self) -> str:
    shown = [f for f in ("avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")]
    marks = " ".join(f"{f}={'yes' if self.has(f) else 'no'}" for f in shown)
    return f"{self.model} | {marks}"


def parse_cpuinfo(text: str) -> CpuInfo:
  """CpuInfo from the text of /proc/cpuinfo (first processor's entries)."""
  model, flags = "", ()
  for line in text.splitlines():
    key, _, value = line.partition(":")
    key = key.strip()
    if key == "model name" and not model:
      model = value.strip()
    elif key == "flags" and not flags:
      flags = tuple(sorted(f for f in value.split() if f in FLAGS))
  return CpuInfo(model=model or platform.processor() or "unknown", flags=flags)


@functools.lru_cache(maxsize=1)
def host_cpu() -> CpuInfo:
  """The host's CpuInfo (no flags where /proc/cpuinfo is missing)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      return parse_cpuinfo(f.read())
  except OSError:
    return CpuInfo(model=platform.processor() or "unknown", flags=())
