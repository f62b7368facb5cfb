"""Safetensors files and checkpoint directories: the one reader and writer.

Used by the HF export (`hf_io.save_hf`, `hf_io.load_hf_state_dict`), the
quantized export (`quant_export`) and the rollout weight sync
(`rollout.weight_sync`). `safetensors.numpy` cannot write float8 (numpy has
no such dtype); the format is simple enough (little-endian u64 header
length, JSON header, raw bytes) to write directly. Tensor data is read with
the `safetensors` package (vLLM reads these files with `safetensors.torch`);
headers are parsed here, which is cheap for any model size.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from typing import Mapping

import ml_dtypes
import numpy as np

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

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
# safetensors dtype tag -> numpy dtype.
_DTYPES = {tag: dtype for dtype, tag in _DTYPE_NAMES.items()}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  """Shape and dtype of one checkpoint tensor."""

  shape: tuple[int, ...]
  dtype: np.dtype

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def read_header(path: str | os.PathLike) -> dict[str, TensorSpec]:
  """Tensor name -> TensorSpec, from the JSON header of a `.safetensors` file.

  Reads only the header (not the data), so it is cheap for any model size.
  """
  path = os.fspath(path)
  with open(path, "rb") as f:
    raw_len = f.read(8)
    if len(raw_len) != 8:
      raise ValueError(
        f"{path!r} is not a safetensors file (shorter than 8 bytes)"
      )
    (header_len,) = struct.unpack("<Q", raw_len)
    size = os.fstat(f.fileno()).st_size
    # A damaged length is not allocated: the header lies inside the file.
    raw = f.read(header_len) if header_len <= size - 8 else b""
  try:
    if len(raw) != header_len:
      raise ValueError(f"a {header_len}-byte header in a {size}-byte file")
    header = json.loads(raw)
  except ValueError as e:
    raise ValueError(
      f"{path!r} is not a safetensors file (truncated or damaged header: {e})"
    ) from e
  specs = {}
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    tag = entry["dtype"]
    if tag not in _DTYPES:
      raise ValueError(
        f"{path!r}: tensor {name!r} has safetensors dtype {tag!r}; expected "
        f"one of {sorted(_DTYPES)}"
      )
    specs[name] = TensorSpec(
      tuple(int(d) for d in entry["shape"]), _DTYPES[tag]
    )
  return specs


def checkpoint_files(model_dir: str | os.PathLike) -> list[str]:
  """The weight files of a checkpoint dir: those its index names, else
  `model.safetensors`, else every `*.safetensors` file."""
  model_dir = os.fspath(model_dir)
  index = os.path.join(model_dir, INDEX_FILE)
  single = os.path.join(model_dir, SINGLE_FILE)
  if os.path.isfile(index) and os.path.isfile(single):
    # transformers would load the single file, rljax the shards: refuse to
    # guess which one is the model.
    raise ValueError(
      f"{model_dir!r} holds both {INDEX_FILE} (sharded weights) and "
      f"{SINGLE_FILE}; remove the one that is not the model"
    )
  if os.path.isfile(index):
    try:
      with open(index) as f:
        names = sorted(set(json.load(f)["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise ValueError(
        f"{index}: not a safetensors index ({type(e).__name__}: {e}); "
        "expected JSON with a 'weight_map' object"
      ) from e
  elif os.path.isfile(os.path.join(model_dir, SINGLE_FILE)):
    names = [SINGLE_FILE]
  else:
    names = sorted(
      n for n in os.listdir(model_dir) if n.endswith(".safetensors")
    )
  if not names:
    raise FileNotFoundError(
      f"no .safetensors files in {model_dir!r}; expected an HF checkpoint "
      "directory"
    )
  return [os.path.join(model_dir, n) for n in names]


def shard(
  tensors: Mapping[str, np.ndarray], max_shard_bytes: int
) -> list[dict[str, np.ndarray]]:
  """Splits tensors (in name order) into shards of at most `max_shard_bytes`
  (a tensor larger than that gets a shard of its own)."""
  if max_shard_bytes < 1:
    raise ValueError(f"max_shard_bytes={max_shard_bytes}; expected >= 1")
  shards, current, size = [], {}, 0
  for name in sorted(tensors):
    array = tensors[name]
    if current and size + array.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = array
    size += array.nbytes
  if current:
    shards.append(current)
  return shards


def write_checkpoint(
  tensors: Mapping[str, np.ndarray],
  out_dir: str | os.PathLike,
  max_shard_bytes: int = 1 << 30,
  single_file: bool = False,
  metadata: Mapping[str, str] | None = None,
) -> int:
  """Writes tensors as `model-0000k-of-0000n.safetensors` + index.

  Args:
    tensors: name -> numpy array, already in checkpoint dtype and shape.
    out_dir: an existing directory (files of the same names are replaced).
    max_shard_bytes: shard size limit.
    single_file: write one shard as `model.safetensors` with no index (the
      layout HF writes for small models).
    metadata: the files' `__metadata__` ({"format": "pt"} by default).

  Returns:
    Bytes of tensor data written.
  """
  out_dir = os.fspath(out_dir)
  shards = shard(tensors, max_shard_bytes)
  total = sum(a.nbytes for s in shards for a in s.values())
  if single_file and len(shards) == 1:
    save_safetensors(os.path.join(out_dir, SINGLE_FILE), shards[0], metadata)
    return total
  weight_map = {}
  for k, part in enumerate(shards, start=1):
    file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
    save_safetensors(os.path.join(out_dir, file), part, metadata)
    weight_map.update({name: file for name in part})
  with open(os.path.join(out_dir, INDEX_FILE), "w") as f:
    json.dump(
      {"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2
    )
  return total


def save_safetensors(
  path: str | os.PathLike,
  tensors: Mapping[str, np.ndarray],
  metadata: Mapping[str, str] | None = None,
) -> None:
  """Writes `tensors` (name -> array) to a `.safetensors` file at `path`."""
  header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
  arrays = []
  offset = 0
  for name in sorted(tensors):
    a = np.ascontiguousarray(np.asarray(tensors[name]))
    if a.dtype not in _DTYPE_NAMES:
      raise TypeError(
        f"save_safetensors: tensor {name!r} has dtype {a.dtype}; supported: "
        f"{sorted(str(d) for d in _DTYPE_NAMES)}"
      )
    if not a.dtype.isnative and a.dtype.itemsize > 1:
      a = a.astype(a.dtype.newbyteorder("<"))
    header[name] = {
      "dtype": _DTYPE_NAMES[a.dtype],
      "shape": list(a.shape),
      "data_offsets": [offset, offset + a.nbytes],
    }
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
