"""Weights for an inference engine as a checkpoint-format safetensors dir.

The vLLM sidecar receives new weights at every RL step by reading a directory
of `.safetensors` shards, written in the engine's own checkpoint format (HF
names, HF dtypes and shapes), from tmpfs (`/dev/shm`): vLLM's in-place
`reload_weights` then runs its normal loader on it, so the same path serves
bf16 checkpoints and INT8/FP8 compressed-tensors checkpoints (int8 `*.weight`
codes plus `*.weight_scale`).

This module is engine-agnostic and strict. `CheckpointManifest` records the
name, shape and dtype of every tensor of the checkpoint the engine was started
from; `prepare_tensors` checks a new state dict against it *before* anything
reaches the engine, because vLLM 0.32 aborts its engine process on an unknown
tensor name (the half-reloaded layers are left without data), so a typo would
otherwise cost a restart.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import os
import shutil
import tempfile
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from rljax.models import safetensors_io

TensorSpec = safetensors_io.TensorSpec

# Dtypes a float tensor may be cast to. Everything else (int8 / fp8 codes of a
# quantized checkpoint) must arrive in exactly the checkpoint's dtype: casting
# floats to codes would silently skip the quantizer and its scales.
_FLOAT_DTYPES = frozenset(
  np.dtype(d) for d in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)
)


def is_float_dtype(dtype: Any) -> bool:
  """True for the float dtypes a weight may be cast between (bf16 included)."""
  return np.dtype(dtype) in _FLOAT_DTYPES


@dataclasses.dataclass(frozen=True)
class CheckpointManifest:
  """Every tensor of a checkpoint: name -> TensorSpec.

  Attributes:
    specs: tensor name -> TensorSpec, for every tensor of the checkpoint.
    source: where it was read from (for error messages).
  """

  specs: Mapping[str, TensorSpec]
  source: str = "<memory>"

  @classmethod
  def from_dir(cls, model_dir: str | os.PathLike) -> "CheckpointManifest":
    """Reads the manifest of an HF safetensors checkpoint directory."""
    specs: dict[str, TensorSpec] = {}
    for path in safetensors_io.checkpoint_files(model_dir):
      for name, spec in safetensors_io.read_header(path).items():
        if name in specs:
          raise ValueError(
            f"tensor {name!r} appears in two shards of {os.fspath(model_dir)!r}"
          )
        specs[name] = spec
    return cls(specs=specs, source=os.fspath(model_dir))

  @property
  def nbytes(self) -> int:
    return sum(s.nbytes for s in self.specs.values())

  def __len__(self) -> int:
    return len(self.specs)


def _format_names(names, limit: int = 6) -> str:
  names = sorted(names)
  shown = ", ".join(repr(n) for n in names[:limit])
  return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def prepare_tensors(
  state_dict: Mapping[str, Any],
  manifest: CheckpointManifest,
  check_finite: bool = True,
  context: str = "weight sync",
) -> dict[str, np.ndarray]:
  """Checks a state dict against the engine's checkpoint; casts float dtypes.

  Args:
    state_dict: HF tensor name -> array (numpy, JAX or anything `np.asarray`
      accepts). It must hold exactly the manifest's tensors: the engine
      reloads all of them.
    manifest: the checkpoint the engine runs.
    check_finite: refuse NaN/inf in float tensors (a NaN weight would turn
      every rollout into garbage without any error).
    context: prefix of error messages (which engine, doing what).

  Returns:
    name -> C-contiguous numpy array with the manifest's shape and dtype
    (float tensors are cast to the manifest dtype; integer/fp8 codes must
    already have it).

  Raises:
    ValueError: missing, unexpected or mis-shaped tensors, or non-finite
      values.
    TypeError: a tensor whose dtype cannot be cast to the checkpoint's, e.g.
      float weights for an int8 slot of a compressed-tensors engine.
  """
  if not isinstance(state_dict, Mapping):
    raise TypeError(
      f"{context}: state_dict is a {type(state_dict).__name__}; "
      "expected a mapping of HF tensor names to arrays"
    )
  bad_keys = [k for k in state_dict if not isinstance(k, str)]
  if bad_keys:
    raise TypeError(
      f"{context}: state_dict key {bad_keys[0]!r} is not a "
      "string; expected HF tensor names"
    )
  expected = manifest.specs
  missing = set(expected) - set(state_dict)
  unexpected = set(state_dict) - set(expected)
  if unexpected:
    hints = []
    for name in sorted(unexpected)[:3]:
      close = difflib.get_close_matches(name, list(expected), n=1)
      if close:
        hints.append(f"{name!r} -> did you mean {close[0]!r}?")
    raise ValueError(
      f"{context}: {len(unexpected)} tensor(s) not in the engine's "
      f"checkpoint {manifest.source!r}: {_format_names(unexpected)}"
      + (f" ({'; '.join(hints)})" if hints else "")
      + f"; expected exactly the {len(expected)} names of that checkpoint"
    )
  if missing:
    raise ValueError(
      f"{context}: {len(missing)} tensor(s) of the engine's checkpoint "
      f"{manifest.source!r} are missing: {_format_names(missing)}; the "
      "engine reloads every tensor, so pass the full state dict"
    )
  out: dict[str, np.ndarray] = {}
  for name, spec in expected.items():
    array = np.asarray(state_dict[name])
    if tuple(array.shape) != spec.shape:
      raise ValueError(
        f"{context}: tensor {name!r} has shape {tuple(array.shape)}; "
        f"expected {spec.shape} (HF layout, [out, in] for linear weights)"
      )
    if array.dtype != spec.dtype:
      if not (is_float_dtype(spec.dtype) and is_float_dtype(array.dtype)):
        raise TypeError(
          f"{context}: tensor {name!r} has dtype {array.dtype}; expected "
          f"{spec.dtype} (the engine's checkpoint stores it so; quantized "
          "codes must be produced by the quantizer, e.g. "
          "rljax.models.compressed_tensors_state_dict)"
        )
      if check_finite and array.dtype == np.float32:
        _check_finite(name, array, context)  # cheaper before the cast
        array = array.astype(spec.dtype)
      else:
        array = array.astype(spec.dtype)
        if check_finite:
          _check_finite(name, array, context)
    elif check_finite and is_float_dtype(spec.dtype):
      _check_finite(name, array, context)
    out[name] = np.ascontiguousarray(array)
  return out


# Float dtype -> (unsigned view, |x| bit mask, exponent mask): a value is
# NaN/inf exactly when its exponent bits are all ones.
_FLOAT_BITS = {
  np.dtype(ml_dtypes.bfloat16): (np.uint16, 0x7FFF, 0x7F80),
  np.dtype(np.float16): (np.uint16, 0x7FFF, 0x7C00),
  np.dtype(np.float32): (np.uint32, 0x7FFFFFFF, 0x7F800000),
  np.dtype(np.float64): (np.uint64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000),
}
_FINITE_CHUNK = 1 << 20


def _all_finite(array: np.ndarray) -> bool:
  """np.isfinite(array).all() for float arrays, ~10x faster (integer bit
  tests in cache-sized chunks; ml_dtypes' bf16 isfinite converts each
  value): this check runs on every weight of every sync."""
  bits = _FLOAT_BITS.get(array.dtype)
  if bits is None or not array.flags.c_contiguous:
    return bool(np.isfinite(array).all())
  uint, magnitude, exponent = bits
  flat = array.reshape(-1).view(uint)
  tmp = np.empty(min(flat.size, _FINITE_CHUNK), uint)
  for i in range(0, flat.size, _FINITE_CHUNK):
    chunk = flat[i : i + _FINITE_CHUNK]
    out = tmp[: chunk.size]
    np.bitwise_and(chunk, uint(magnitude), out=out)
    if out.max() >= exponent:
      return False
  return True


def _check_finite(name: str, array: np.ndarray, context: str) -> None:
  if array.size and not _all_finite(array):
    bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
    raise ValueError(
      f"{context}: tensor {name!r} has {bad} non-finite "
      "value(s) (NaN/inf); refusing to load them"
    )


def default_sync_root() -> str:
  """/dev/shm (tmpfs: no disk I/O on the sync path), else the temp dir."""
  if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
    return "/dev/shm"
  return tempfile.gettempdir()


class SyncDirs:
  """Fresh directories for successive weight syncs, deleting stale ones.

  The directory of the last sync that an engine loaded is kept (a restarted
  engine reloads from it); older ones are removed when a newer one is
  committed.
  """

  _counter = itertools.count()

  def __init__(
    self, root: str | os.PathLike | None = None, prefix: str = "rljax-sync"
  ):
    self.root = os.fspath(root) if root is not None else default_sync_root()
    self.prefix = f"{prefix}-{os.getpid()}-{next(self._counter)}"
    self._step = itertools.count()
    self.current: str | None = None
    self._pending: list[str] = []

  @property
  def glob_pattern(self) -> str:
    """Matches every directory this object creates (for crash cleanup)."""
    return os.path.join(self.root, f"{self.prefix}-*")

  def new(self, nbytes: int) -> str:
    """Creates an empty directory with room for nbytes (checked up front)."""
    os.makedirs(self.root, mode=0o700, exist_ok=True)
    free = shutil.disk_usage(self.root).free
    if free < nbytes * 1.05 + (16 << 20):
      raise OSError(
        f"weight sync needs {nbytes / 2**20:.0f} MiB in {self.root!r} but "
        f"only {free / 2**20:.0f} MiB are free; pass a larger sync_root"
      )
    # mkdtemp: owner-only (0700) and a random suffix (created with O_EXCL
    # semantics, so no other local user can pre-create or read it in the
    # shared /dev/shm); still matched by glob_pattern.
    path = tempfile.mkdtemp(
      prefix=f"{self.prefix}-{next(self._step):06d}-", dir=self.root
    )
    self._pending.append(path)
    return path

  def commit(self, path: str) -> None:
    """Marks path as the loaded weights; removes every other directory."""
    for other in self._pending + ([self.current] if self.current else []):
      if other != path:
        shutil.rmtree(other, ignore_errors=True)
    self._pending = []
    self.current = path

  def discard(self, path: str) -> None:
    """Removes a directory that was not loaded."""
    if path in self._pending:
      self._pending.remove(path)
    shutil.rmtree(path, ignore_errors=True)

  def cleanup(self) -> None:
    for path in self._pending + ([self.current] if self.current else []):
      shutil.rmtree(path, ignore_errors=True)
    self._pending = []
    self.current = None
