"""The `ModelConfig` a model name stands for, read without its weights.

A run's settings bounded by the model's shape (the LoRA rank by the
residual width, the sequence by the context) are checked before anything
loads (`rljax.train.preflight`). `read_config` reads the shape through the
loaders' own config paths, never the tensors:

  "tiny"                  `tiny_config()` (its vocabulary follows the
                          tokenizer loaded with it; the shape does not);
  an HF directory         its config.json (`ModelConfig.from_hf`);
  a .gguf file, or the    the file's header: the key/value metadata and
  embedded default model  the tensor names, mapped by the loader's own
                          `gguf_io.config_from_gguf_metadata`.

The GGUF header is parsed here because gguf's reader builds every array
of the header (the vocabulary and merges: 6-7 s for SmolLM2's 49,152
tokens) where a run needs a dozen scalars; skipping the arrays takes a few
tens of milliseconds. Layout (little-endian, GGUF v2/v3): magic "GGUF",
u32 version, u64 tensor count, u64 key/value count; each key/value a
string key, a u32 type and its value (arrays: u32 element type, u64
count, the elements); then per tensor a string name, u32 dims, u64 per
dim, u32 type, u64 offset. Strings are a u64 length and UTF-8 bytes.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

from rljax.models import gguf_io
from rljax.models import pretrained
from rljax.models.config import ModelConfig, tiny_config

# GGUF value types: struct format of each fixed-size one.
_SCALARS = {
  0: "<B",
  1: "<b",
  2: "<H",
  3: "<h",
  4: "<I",
  5: "<i",
  6: "<f",
  7: "<?",
  10: "<Q",
  11: "<q",
  12: "<d",
}
_STRING, _ARRAY = 8, 9
_VERSIONS = (2, 3)


class _Header:
  """A cursor over a GGUF file's bytes."""

  def __init__(self, data):
    self.data, self.at = data, 0

  def take(self, fmt: str) -> Any:
    (value,) = struct.unpack_from(fmt, self.data, self.at)
    self.at += struct.calcsize(fmt)
    return value

  def string(self) -> str:
    n = self.take("<Q")
    if self.at + n > len(self.data):
      raise ValueError("a string runs past the end of the file")
    text = bytes(self.data[self.at : self.at + n]).decode("utf-8", "replace")
    self.at += n
    return text

  def skip_string(self) -> None:
    n = self.take("<Q")  # moves the cursor past the length first
    self.at += n

  def value(self, kind: int) -> Any:
    """The value of type `kind`; None for an array (skipped)."""
    if kind in _SCALARS:
      return self.take(_SCALARS[kind])
    if kind == _STRING:
      return self.string()
    if kind != _ARRAY:
      raise ValueError(f"unknown GGUF value type {kind}")
    item, count = self.take("<I"), self.take("<Q")
    if item in _SCALARS:
      self.at += count * struct.calcsize(_SCALARS[item])
    elif item == _STRING:
      for _ in range(count):
        self.skip_string()
    else:  # arrays of arrays: walk them
      for _ in range(count):
        self.value(item)
    return None


def gguf_header(path: str) -> tuple[dict[str, Any], dict[str, tuple]]:
  """({key: scalar or string} of the metadata (arrays left out),
  {tensor name: dims as stored}) of the GGUF file at `path`."""
  with (
    open(path, "rb") as f,
    mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data,
  ):
    h = _Header(data)
    if bytes(data[:4]) != b"GGUF":
      raise ValueError(f"{path!r} is not a GGUF file")
    h.at = 4
    version = h.take("<I")
    if version not in _VERSIONS:
      raise ValueError(f"{path!r}: GGUF version {version} (or big-endian)")
    n_tensors, n_values = h.take("<Q"), h.take("<Q")
    metadata = {}
    for _ in range(n_values):
      key = h.string()
      value = h.value(h.take("<I"))
      if value is not None:
        metadata[key] = value
    tensors = {}
    for _ in range(n_tensors):
      name = h.string()
      dims = tuple(h.take("<Q") for _ in range(h.take("<I")))
      h.take("<I")  # type
      h.take("<Q")  # offset
      tensors[name] = dims
  return metadata, tensors


def gguf_config(path: str) -> ModelConfig:
  """The ModelConfig `gguf_io.load_gguf` builds for `path`, from its header
  alone (the same mapping, and the same vocabulary fallback: the embedding's
  row count where the key is missing)."""
  metadata, tensors = gguf_header(path)
  vocab_key = f"{metadata.get('general.architecture')}.vocab_size"
  if vocab_key not in metadata and "token_embd.weight" in tensors:
    metadata[vocab_key] = int(tensors["token_embd.weight"][-1])
  return gguf_io.config_from_gguf_metadata(metadata, set(tensors))


def read_config(name: str) -> ModelConfig | None:
  """The ModelConfig of a run's `model.name`, without its weights; None
  where it cannot be told here (another kind of name, a file the header
  parser cannot read: the loader says why, with its own message)."""
  if name == "tiny":
    return tiny_config()
  try:
    path = pretrained.resolve_path(name)
    if path.endswith(".gguf"):
      return gguf_config(path)
    if os.path.isdir(path):
      return ModelConfig.from_hf(path)
  except (OSError, ValueError, TypeError, KeyError, struct.error):
    return None
  return None
