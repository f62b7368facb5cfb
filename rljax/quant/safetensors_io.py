"""Minimal safetensors writer for numpy arrays, float8 and bfloat16 included.

`safetensors.numpy` cannot write float8 (numpy has no such dtype); the format
is simple enough (little-endian u64 header length, JSON header, raw bytes) to
write directly. Reading is left to the `safetensors` package (vLLM reads these
files with `safetensors.torch`).
"""
from __future__ import annotations

import json
import os
import struct
from typing import Mapping

import ml_dtypes
import numpy as np

_DTYPE_NAMES = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.int16): "I16",
    np.dtype(np.int32): "I32",
    np.dtype(np.int64): "I64",
    np.dtype(np.float16): "F16",
    np.dtype(np.float32): "F32",
    np.dtype(np.float64): "F64",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
    np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
}


def save_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                     metadata: Mapping[str, str] | None = None) -> None:
  """Writes `tensors` (name -> array) to a `.safetensors` file at `path`."""
  header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
  arrays = []
  offset = 0
  for name in sorted(tensors):
    a = np.ascontiguousarray(np.asarray(tensors[name]))
    if a.dtype not in _DTYPE_NAMES:
      raise TypeError(
          f"save_safetensors: tensor {name!r} has dtype {a.dtype}; supported: "
          f"{sorted(str(d) for d in _DTYPE_NAMES)}")
    if not a.dtype.isnative and a.dtype.itemsize > 1:
      a = a.astype(a.dtype.newbyteorder("<"))
    header[name] = {"dtype": _DTYPE_NAMES[a.dtype], "shape": list(a.shape),
                    "data_offsets": [offset, offset + a.nbytes]}
    offset += a.nbytes
    arrays.append(a)
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # the format aligns the data start to 8 bytes
  tmp = f"{os.fspath(path)}.tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for a in arrays:
      f.write(a.tobytes())
  os.replace(tmp, path)
