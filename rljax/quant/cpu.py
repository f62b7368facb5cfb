"""What the host CPU is fast at, read from /proc/cpuinfo.

XLA:CPU reaches different kernels on different x86 machines, and the gap is
large (docs/performance.md): on Intel Sapphire Rapids, AMX makes bf16 x bf16
-> f32 dots ~5x and int8 x int8 -> int32 dots ~10x faster than f32; on an AMD
EPYC with AVX-512 VNNI but no AMX, int8 is only ~1.2-1.5x f32 and bf16 inputs
gain little. Code that picks a compute path asks here instead of assuming.
"""

from __future__ import annotations

import dataclasses
import functools
import platform

# Flags of /proc/cpuinfo that decide the fast dot path.
FLAGS = (
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
    """bf16 x bf16 -> f32 dots beat f32 by a wide margin (AMX-BF16 only:
    measured ~5x on Sapphire Rapids, ~1x with AVX512-BF16 alone)."""
    return self.has("amx_bf16")

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
