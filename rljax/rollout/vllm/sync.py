"""Weight syncs into a vLLM server's checkpoint format.

`WeightSync` holds what a server's checkpoint dir declares (its tensors,
weight format and vocabulary) and turns new weights into exactly those
tensors; `timed_sync` writes them as safetensors shards to a fresh tmpfs
dir, has the server(s) reload it and times each phase.

`SharedWeights` is the fast path of one sidecar: a single checkpoint-format
safetensors file in tmpfs, laid out once and rewritten in place at every
sync (only the tensors that changed), that rljax's worker extension maps and
applies to the live model without vLLM's loader
(`third_party/vllm_ext/rljax_vllm_ext/shared_weights.py`); it stays a valid
checkpoint dir, so vLLM's reload (the fallback, and restarts) reads it too.
"""

from __future__ import annotations

import json
import os
import struct
import time
from typing import Any, Callable, Mapping

import numpy as np

from rljax.models import safetensors_io
from rljax.rollout import weight_sync
from rljax.rollout.base import SyncStats
from rljax.rollout.vllm.config import checkpoint_quant_mode


def _is_hf_state_dict(params: Any) -> bool:
  return (
    isinstance(params, Mapping)
    and bool(params)
    and all(
      isinstance(k, str) and hasattr(v, "shape") for k, v in params.items()
    )
  )


def _tree_format(params: Any) -> str | None:
  """The `QTensor` mode of an rljax tree ("int8", "int8_wo", "fp8"), None
  when it holds only floats."""
  import jax  # pylint: disable=g-import-not-at-top

  from rljax.quant import qtensor  # pylint: disable=g-import-not-at-top

  def is_q(x):
    return isinstance(x, qtensor.QTensor)

  leaves = jax.tree_util.tree_leaves(params, is_leaf=is_q)
  modes = sorted({x.mode for x in leaves if is_q(x)})
  if len(modes) > 1:
    raise ValueError(
      f"weight sync: the params tree mixes QTensor modes {modes}; expected "
      "one (quant.prepare_rollout_weights)"
    )
  return modes[0] if modes else None


_CODE_FORMATS = {"int8": "int8", "float8_e4m3fn": "fp8"}


def _state_dict_format(state_dict: Mapping[str, Any]) -> str | None:
  """ "int8"/"fp8" for the codes of a compressed-tensors state dict (a
  weight with a `*.weight_scale`), None otherwise (float tensors, or codes
  of another dtype, which the manifest check names)."""
  for name in state_dict:
    if name.endswith(".weight_scale"):
      codes = state_dict.get(name[: -len("_scale")])
      return _CODE_FORMATS.get(np.dtype(getattr(codes, "dtype", None)).name)
  return None


class WeightSync:
  """New weights as the tensors of the checkpoint one server runs.

  Attributes:
    model_dir: the HF checkpoint dir.
    manifest: its tensors (name, shape, dtype): what a sync must match.
    quant_mode: its weight format ("bf16", "f16", "f32", "int8", "fp8").
    vocab_size: from its config.json (None if absent).
  """

  def __init__(
    self, model_dir: str, check_finite: bool = True, model_config: Any = None
  ):
    """Reads the checkpoint dir.

    Args:
      model_dir: the HF checkpoint dir the server runs.
      check_finite: refuse NaN/inf weights.
      model_config: `rljax.models.ModelConfig` that converts params trees;
        default read from model_dir when first needed.
    """
    self.model_dir = model_dir
    self.manifest = weight_sync.CheckpointManifest.from_dir(model_dir)
    self.quant_mode = checkpoint_quant_mode(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
      self.vocab_size = json.load(f).get("vocab_size")
    self._check_finite = check_finite
    self._model_config = model_config

  def prepare(self, params: Any, engine: str) -> dict[str, np.ndarray]:
    """HF name -> array in checkpoint format, checked against the manifest.

    Args:
      params: prepared rollout weights (`quant.prepare_rollout_weights`) or
        an HF state dict (name -> array: float tensors for a float
        checkpoint; int8/fp8 codes + float32 `*.weight_scale` for a
        compressed-tensors one). An rljax tree is converted with
        `models.to_hf_state_dict` / `models.compressed_tensors_state_dict`
        (a full-precision tree for an int8/fp8 checkpoint is quantized
        here); its `QTensor` mode must be the checkpoint's.
      engine: the engine, as error messages name it.

    Raises:
      ValueError: the weights are in another format than the checkpoint
        (vLLM cannot change it at a sync), or do not match its tensors.
      TypeError: `params` is neither kind, or a tensor's dtype is wrong.
    """
    mode = self.quant_mode
    context = f"{engine} weight sync"
    if _is_hf_state_dict(params):
      self._check_format(_state_dict_format(params), engine)
      state_dict = params
    elif isinstance(params, Mapping):
      self._check_format(_tree_format(params), engine)
      config = self._rljax_model_config()
      from rljax import models  # pylint: disable=g-import-not-at-top

      if mode in ("int8", "fp8"):
        state_dict = models.compressed_tensors_state_dict(
          config, params, mode=mode, dtype=self._float_dtype_name()
        )
      else:
        state_dict = models.to_hf_state_dict(config, params)
    else:
      raise TypeError(
        f"{context}: params is a {type(params).__name__}; "
        "expected an HF state dict or an rljax params tree"
      )
    return weight_sync.prepare_tensors(
      state_dict, self.manifest, self._check_finite, context
    )

  def _check_format(self, given: str | None, engine: str) -> None:
    """Quantized weights (`given`: their format, None for floats) must be in
    the checkpoint's format: a float checkpoint takes no codes, and an
    int8/fp8 one only its own (floats are quantized to it at the sync)."""
    if given is None or given == self.quant_mode:
      return
    raise ValueError(
      f"{engine}: the weights are {given} but the engine runs a "
      f"{self.quant_mode} checkpoint ({self.model_dir}); vLLM cannot change "
      f"the weight format at a sync: prepare {self.quant_mode} weights "
      f"(quant.prepare_rollout_weights) or launch a sidecar from a {given} "
      "export"
    )

  def _rljax_model_config(self) -> Any:
    if self._model_config is None:
      from rljax import models  # pylint: disable=g-import-not-at-top

      self._model_config = models.ModelConfig.from_hf(self.model_dir)
    return self._model_config

  def _float_dtype_name(self) -> str:
    """The checkpoint's dtype for the tensors it keeps unquantized.

    Scales are left out: a compressed-tensors checkpoint holds more float32
    `*.weight_scale` tensors than bf16 embeddings and norms, and taking
    their dtype made every sync convert the embedding to float32 and back
    (~0.09 s of a 0.15 s `prepare` for SmolLM2-135M INT8 on 2 cores).
    """
    floats = [
      s.dtype
      for name, s in self.manifest.specs.items()
      if weight_sync.is_float_dtype(s.dtype)
      and s.dtype.itemsize > 1
      and not name.endswith("_scale")
    ]
    names = [np.dtype(d).name for d in floats]
    return max(set(names), key=names.count) if names else "bfloat16"


def write_sync_dir(
  sync_dirs: weight_sync.SyncDirs,
  tensors: Mapping[str, np.ndarray],
  shard_bytes: int,
) -> tuple[str, int]:
  """Writes tensors to a fresh sync dir; returns (path, bytes)."""
  nbytes = sum(a.nbytes for a in tensors.values())
  path = sync_dirs.new(nbytes)
  try:
    written = safetensors_io.write_checkpoint(tensors, path, shard_bytes)
  except BaseException:
    sync_dirs.discard(path)
    raise
  return path, written


def timed_sync(
  prepare: Callable[[], Mapping[str, np.ndarray]],
  sync_dirs: weight_sync.SyncDirs,
  shard_bytes: int,
  reload: Callable[[str], None],
) -> tuple[SyncStats, dict[str, float]]:
  """prepare() -> write a sync dir -> reload(path); returns the sync's
  stats and its phases (prepare_s, write_s, reload_s, seconds, bytes).

  The dir is kept as the current one even when the reload failed: a
  restarted engine re-reads it.
  """
  start = time.perf_counter()
  tensors = prepare()
  prepared = time.perf_counter()
  path, nbytes = write_sync_dir(sync_dirs, tensors, shard_bytes)
  written = time.perf_counter()
  try:
    reload(path)
  finally:
    sync_dirs.commit(path)
  end = time.perf_counter()
  timing = _phases(start, prepared, written, end, nbytes)
  return SyncStats(seconds=end - start, bytes=nbytes), timing


def _phases(start, prepared, written, end, nbytes) -> dict[str, float]:
  """A sync's phases from its four clock readings (prepare -> write ->
  engine ready)."""
  return {
    "prepare_s": prepared - start,
    "write_s": written - prepared,
    "reload_s": end - written,
    "seconds": end - start,
    "bytes": nbytes,
  }


# The HF projections that vLLM fuses into one module (qkv_proj, gate_up_proj
# in Llama/Qwen), in vLLM's order: `SharedWeights` stores them adjacent so the
# worker reads the fused weight as one view. Only a speed-up: the worker
# checks adjacency and concatenates otherwise.
_FUSED_PARTS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def shared_order(specs: Mapping[str, safetensors_io.TensorSpec]) -> list[str]:
  """Tensor names in `SharedWeights` file order: wider dtypes first (with a
  64-byte aligned data start, every tensor is then aligned to its element
  size), the parts of each fused vLLM module adjacent and in vLLM's order."""

  def key(name):
    module, _, param = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    group, index = name, 0
    for g, parts in enumerate(_FUSED_PARTS):
      if leaf in parts:
        group, index = f"{parent}.<fused{g}>.{param}", parts.index(leaf)
    return (-specs[name].dtype.itemsize, group, index)

  return sorted(specs, key=key)


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
  """Bitwise equality (so -0.0 != 0.0 and NaN payloads count), checking a
  leading slice first: weights that changed almost always differ there."""
  a8 = a.reshape(-1).view(np.uint8)
  b8 = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
  head = min(a8.size, 4096)
  if not np.array_equal(a8[:head], b8[:head]):
    return False
  return bool(np.array_equal(a8, b8))


class SharedWeights:
  """The weights one server runs, as one safetensors file in tmpfs.

  Created once per sidecar (in a 0700 dir of its `SyncDirs`), with the
  manifest's tensors in `shared_order`; each sync copies into it only the
  tensors whose bytes differ from the last sync the engine applied, and
  names them to the engine, which rebuilds only the modules they touch.

  Attributes:
    path: the dir (a checkpoint dir vLLM's reload can read).
    file: the safetensors file in it.
    in_sync: the engine runs exactly the file's bytes (set by the caller
      after a successful apply; a write clears it until then). When False,
      the next write names every tensor as changed.
  """

  def __init__(
    self,
    sync_dirs: weight_sync.SyncDirs,
    manifest: weight_sync.CheckpointManifest,
  ):
    specs = manifest.specs
    order = shared_order(specs)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in order:
      spec = specs[name]
      header[name] = {
        # pylint: disable-next=protected-access
        "dtype": safetensors_io._DTYPE_NAMES[np.dtype(spec.dtype)],
        "shape": list(spec.shape),
        "data_offsets": [offset, offset + spec.nbytes],
      }
      offset += spec.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % 64)  # data starts 64-byte aligned
    start = 8 + len(blob)
    self.path = sync_dirs.new(offset)
    self.file = os.path.join(self.path, safetensors_io.SINGLE_FILE)
    try:
      with open(self.file, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.truncate(start + offset)
      self._map = np.memmap(self.file, dtype=np.uint8, mode="r+")
    except BaseException:
      sync_dirs.discard(self.path)
      raise
    sync_dirs.commit(self.path)
    self.nbytes = offset
    self.views: dict[str, np.ndarray] = {}
    for name in order:
      spec = specs[name]
      begin, end = header[name]["data_offsets"]
      raw = self._map[start + begin : start + end]
      self.views[name] = raw.view(spec.dtype).reshape(spec.shape)
    self.in_sync = False

  def write(self, tensors: Mapping[str, np.ndarray]) -> tuple[list[str], int]:
    """Copies the tensors that changed into the file.

    Args:
      tensors: `WeightSync.prepare` output (every manifest tensor, in its
        dtype and shape).

    Returns:
      (names of the tensors written, bytes written); every name when the
      engine was not in sync with the file.
    """
    full = not self.in_sync
    self.in_sync = False
    changed, nbytes = [], 0
    for name, view in self.views.items():
      src = tensors[name]
      if not full and _same_bytes(view, src):
        continue
      np.copyto(view, src, casting="no")
      changed.append(name)
      nbytes += view.nbytes
    return changed, nbytes

  def close(self) -> None:
    """Unmaps the file (its dir is removed with the sidecar's sync dirs)."""
    self.views = {}
    self._map = None


def timed_shared_sync(
  prepare: Callable[[], Mapping[str, np.ndarray]],
  shared: SharedWeights,
  apply: Callable[[list[str]], dict[str, Any]],
) -> tuple[SyncStats, dict[str, Any]]:
  """prepare() -> write the changed tensors into `shared` -> apply(changed);
  returns the stats (bytes: those written) and the phases (prepare_s,
  write_s, reload_s, seconds, bytes, changed_tensors; apply's report as
  `engine_*`, its "seconds" as engine_apply_s, part of reload_s).

  `shared.in_sync` is set only once apply returned: after a failed apply the
  next sync names every tensor again."""
  start = time.perf_counter()
  tensors = prepare()
  prepared = time.perf_counter()
  changed, nbytes = shared.write(tensors)
  written = time.perf_counter()
  report = dict(apply(changed))
  shared.in_sync = True
  end = time.perf_counter()
  timing = _phases(start, prepared, written, end, nbytes)
  timing["changed_tensors"] = len(changed)
  if "seconds" in report:  # the engine's own time, inside reload_s
    timing["engine_apply_s"] = report.pop("seconds")
  timing.update({f"engine_{k}": v for k, v in report.items()})
  return SyncStats(seconds=end - start, bytes=nbytes), timing
