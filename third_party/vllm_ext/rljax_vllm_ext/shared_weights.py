"""In-place weight updates from a shared-memory safetensors file (fast sync).

Why: vLLM 0.32's `reload_weights` re-runs the whole loader for every sync
(layerwise meta restore, per-shard weight loaders, `process_weights_after_
loading` on temporary tensors, copies back), and on the CPU backend it then
needs the INT8 handler repair in `worker.py`, which re-reads the files and
builds every oneDNN INT8 handler a second time. Measured on SmolLM2-135M
(2 cores): most of a bf16 reload is loader overhead around the 121 oneDNN
handler builds; an INT8 reload builds 240 handlers where 120 suffice.

What this does instead: the sidecar keeps one checkpoint-format
`.safetensors` file in /dev/shm and rewrites it in place at every sync, with
the parts of each fused vLLM module (q/k/v, gate/up) adjacent in the file.
This module maps that file once (no parse per tensor, no copies for fused
weights), and for every module whose tensors changed puts the new values
into the layout vLLM keeps after loading:

* unquantized linear (CPU): the fused [N, K] weight is handed to vLLM's own
  `process_weights_after_loading` (which builds the oneDNN / sgl handler and
  drops the weight, as at start-up);
* compressed-tensors W8A8 INT8 on the oneDNN path: scales copied into the
  live `weight_scale` (the handler reads them by pointer), `azp_adj`
  recomputed as vLLM does, the handler rebuilt from the new codes;
* the same on the SGL path (AMX CPUs, where vLLM picks it for codes whose
  shape fits the AMX tiles): scales copied in place, the codes re-packed
  with vLLM's `convert_weight_packed` into the live packed weight;
* embeddings and RMSNorm weights: copied in place; an LM head that shares
  the embedding (tied weights) gets its oneDNN handler rebuilt, which vLLM's
  own reload misses (its head keeps the old packed embedding).

Everything is checked before the first tensor is touched; anything this code
does not know (another layer type or kernel, tensor parallelism, compiled
graphs, shapes or dtypes that differ) makes `plan` raise `Unsupported`, and
the sidecar then uses `rljax_reload_weights` (vLLM's reload) on the same
file, which is a valid checkpoint directory.

Only imports vLLM, torch and the standard library.
"""
from __future__ import annotations

import dataclasses
import json
import mmap
import os
import struct
import warnings
from typing import Any, Iterable

FILE_NAME = "model.safetensors"


class Unsupported(Exception):
  """The fast path cannot apply this file to this model (nothing changed)."""


def _torch_dtypes():
  import torch  # pylint: disable=g-import-not-at-top
  return {"BF16": torch.bfloat16, "F16": torch.float16,
          "F32": torch.float32, "F64": torch.float64, "I8": torch.int8,
          "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32,
          "I64": torch.int64, "F8_E4M3": torch.float8_e4m3fn,
          "F8_E5M2": torch.float8_e5m2}


@dataclasses.dataclass(frozen=True)
class Entry:
  """One tensor of the file: dtype, shape, byte range from the file start."""
  dtype: Any
  shape: tuple[int, ...]
  start: int
  end: int


class SharedFile:
  """A read-only mapping of one safetensors file, kept across syncs.

  The sidecar rewrites the file in place (same inode, same size), so the
  mapping sees every sync's bytes without being re-created.
  """

  def __init__(self, path: str):
    import torch  # pylint: disable=g-import-not-at-top
    self.path = path
    with open(path, "rb") as f:
      stat = os.fstat(f.fileno())
      self.key = (stat.st_ino, stat.st_size)
      (header_len,) = struct.unpack("<Q", f.read(8))
      if header_len > stat.st_size - 8:
        raise Unsupported(f"{path!r}: header length {header_len} exceeds the "
                          f"file size {stat.st_size}")
      header = json.loads(f.read(header_len))
      self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # "buffer is not writable": never is
      self.bytes = torch.frombuffer(self._map, dtype=torch.uint8)
    dtypes = _torch_dtypes()
    base = 8 + header_len
    self.entries: dict[str, Entry] = {}
    for name, spec in header.items():
      if name == "__metadata__":
        continue
      if spec.get("dtype") not in dtypes:
        raise Unsupported(f"{path!r}: tensor {name!r} has dtype "
                          f"{spec.get('dtype')!r}; expected one of "
                          f"{sorted(dtypes)}")
      start, end = spec["data_offsets"]
      self.entries[name] = Entry(dtypes[spec["dtype"]], tuple(spec["shape"]),
                                 base + start, base + end)
      if base + end > stat.st_size:
        raise Unsupported(f"{path!r}: tensor {name!r} ends past the file")

  def tensor(self, name: str):
    """A view of one tensor (no copy when aligned)."""
    e = self.entries[name]
    return self._view(e.start, e.end, e.dtype, e.shape)

  def fused(self, names: list[str], rows: int, cols: int):
    """The parts stacked along dim 0 as one [rows, cols] tensor: a view when
    the file holds them adjacent and in order (the sidecar writes them so),
    else a concatenated copy."""
    import torch  # pylint: disable=g-import-not-at-top
    entries = [self.entries[n] for n in names]
    adjacent = all(a.end == b.start and a.dtype == b.dtype
                   for a, b in zip(entries, entries[1:]))
    if adjacent:
      return self._view(entries[0].start, entries[-1].end, entries[0].dtype,
                        (rows, cols))
    return torch.cat([self.tensor(n).reshape(-1, cols) for n in names])

  def _view(self, start: int, end: int, dtype, shape):
    raw = self.bytes[start:end]
    if start % raw.new_empty((), dtype=dtype).element_size():
      raw = raw.clone()  # unaligned for the dtype: copy once
    return raw.view(dtype).view(shape)

  def owns(self, tensor) -> bool:
    """True when tensor's memory lies in this mapping."""
    begin = self.bytes.data_ptr()
    ptr = tensor.data_ptr()
    return begin <= ptr < begin + self.bytes.numel()


_FILES: dict[str, SharedFile] = {}


def open_shared(path: str) -> SharedFile:
  """The cached mapping of path, re-made when the file was replaced."""
  stat = os.stat(path)
  cached = _FILES.get(path)
  if cached is not None and cached.key == (stat.st_ino, stat.st_size):
    return cached
  shared = SharedFile(path)
  _FILES.clear()  # one sidecar buffer per server: drop stale mappings
  _FILES[path] = shared
  return shared


@dataclasses.dataclass
class Step:
  """How to update one module: kind, module, file tensors per param."""
  kind: str  # "linear", "int8" (oneDNN), "int8_sgl", "embedding", "norm"
  name: str
  module: Any
  tensors: dict[str, list[str]]  # param -> file names (fused parts in order)

  def names(self) -> Iterable[str]:
    for names in self.tensors.values():
      yield from names


def _classes():
  # pylint: disable=g-import-not-at-top
  from vllm.model_executor.layers.layernorm import RMSNorm
  from vllm.model_executor.layers.linear import (LinearBase,
                                                 UnquantizedLinearMethod)
  from vllm.model_executor.layers.vocab_parallel_embedding import (
      ParallelLMHead, UnquantizedEmbeddingMethod, VocabParallelEmbedding)
  return (RMSNorm, LinearBase, UnquantizedLinearMethod, ParallelLMHead,
          UnquantizedEmbeddingMethod, VocabParallelEmbedding)


def build_int8_handler(module, kernel, weight, scale, out_dtype) -> None:
  """Gives `kernel` a new oneDNN INT8 GEMM handler for the [N, K] int8 codes
  `weight` (unit stride along K) and the live per-channel `scale` (the
  handler reads it by pointer), as vLLM's own processing builds it."""
  from vllm import _custom_ops as ops  # pylint: disable=g-import-not-at-top
  _, _, input_scale_name, _, _ = kernel.layer_param_names
  kernel.dnnl_handler = ops.create_onednn_scaled_mm(
      weight.t(), scale, out_dtype,
      getattr(module, input_scale_name, None) is None,
      not kernel.config.input_symmetric, 32)


def cpu_int8_kernel(module) -> tuple[Any, str | None]:
  """(kernel, path) of the module's CPU INT8 W8A8 kernel: path "onednn"
  (a oneDNN GEMM handler) or "sgl" (AMX CPUs: vLLM's SGL GEMM over weights
  packed by `convert_weight_packed`, chosen when the codes' shape fits its
  tiles); (None, None) for any other module or kernel."""
  try:
    # pylint: disable-next=g-import-not-at-top
    from vllm.model_executor.kernels.linear.scaled_mm.cpu import (
        CPUInt8ScaledMMLinearKernel)
  except ImportError:
    return None, None
  kernel = getattr(getattr(module, "scheme", None), "kernel", None)
  if not isinstance(kernel, CPUInt8ScaledMMLinearKernel):
    return None, None
  method = getattr(getattr(kernel, "linear_method", None), "__func__", None)
  # pylint: disable=protected-access
  paths = {CPUInt8ScaledMMLinearKernel._apply_weights_onednn: "onednn",
           getattr(CPUInt8ScaledMMLinearKernel, "_apply_weights_sgl",
                   None): "sgl"}
  # pylint: enable=protected-access
  path = paths.get(method) if method is not None else None
  return (kernel, path) if path is not None else (None, None)


def onednn_int8_kernel(module):
  """The module's CPU INT8 kernel when it runs the oneDNN path, else None."""
  kernel, path = cpu_int8_kernel(module)
  return kernel if path == "onednn" else None


# (rows, cols) -> shape of `convert_weight_packed` of [rows, cols] int8 codes
# (the codes plus per-row compensation terms); learnt once per shape.
_SGL_PACKED_SHAPES: dict[tuple[int, int], tuple[int, ...]] = {}


def sgl_packed_shape(rows: int, cols: int) -> tuple[int, ...]:
  """The packed shape vLLM's SGL INT8 GEMM keeps for [rows, cols] codes."""
  import torch  # pylint: disable=g-import-not-at-top
  if (rows, cols) not in _SGL_PACKED_SHAPES:
    zeros = torch.zeros((rows, cols), dtype=torch.int8)
    packed = torch.ops._C.convert_weight_packed(zeros)
    _SGL_PACKED_SHAPES[rows, cols] = tuple(packed.shape)
  return _SGL_PACKED_SHAPES[rows, cols]


def repack_sgl_int8(module, kernel, weight) -> None:
  """Packs the [N, K] int8 codes `weight` as vLLM's `process_weights_for_sgl`
  does and copies them into the module's live packed weight (same storage,
  so nothing that holds the parameter sees a stale tensor); refreshes the
  float32 bias copy that the SGL GEMM adds. The per-channel scales are the
  live `weight_scale`, which the GEMM reads at every call."""
  import torch  # pylint: disable=g-import-not-at-top
  weight_name = kernel.layer_param_names[0]
  live = getattr(module, weight_name)
  live.data.copy_(torch.ops._C.convert_weight_packed(weight.contiguous()))
  if getattr(module, "bias", None) is not None:
    module.bias_fp32.data.copy_(module.bias.data.float())


def check_engine(vllm_config) -> None:
  """Raises Unsupported unless the engine is what this code was written
  for: vLLM's CPU backend, one process, eager mode, no LoRA."""
  from vllm.platforms import current_platform  # pylint: disable=g-import-not-at-top
  parallel = vllm_config.parallel_config
  if not current_platform.is_cpu():
    raise Unsupported("only vLLM's CPU backend is supported")
  if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
    raise Unsupported(
        f"tensor_parallel_size={parallel.tensor_parallel_size}, "
        f"pipeline_parallel_size={parallel.pipeline_parallel_size}; "
        "expected 1 and 1")
  if not vllm_config.model_config.enforce_eager:
    raise Unsupported("the server is not in eager mode (--enforce-eager): "
                      "compiled graphs may hold kernel handles")
  if vllm_config.lora_config is not None:
    raise Unsupported("LoRA is enabled")


def plan(model, shared: SharedFile) -> list[Step]:
  """One step per model module that the file's tensors update.

  Raises:
    Unsupported: a tensor maps to no module, or to one whose layer type,
      kernel, shape or dtype this code does not handle.
  """
  (rms_norm, linear_base, unquantized_linear, _, unquantized_embed,
   embedding_cls) = _classes()
  modules = dict(model.named_modules())
  packed = getattr(model, "packed_modules_mapping", {}) or {}
  part_of = {part: (fused, i) for fused, parts in packed.items()
             for i, part in enumerate(parts)}
  grouped: dict[str, dict[str, dict[int, str]]] = {}
  for name in shared.entries:
    module_name, _, param = name.rpartition(".")
    parent, _, leaf = module_name.rpartition(".")
    index = 0
    if module_name not in modules and leaf in part_of:
      fused, index = part_of[leaf]
      module_name = f"{parent}.{fused}" if parent else fused
    if module_name not in modules:
      raise Unsupported(f"tensor {name!r} maps to no module of the model")
    slots = grouped.setdefault(module_name, {}).setdefault(param, {})
    slots[index] = name
  steps = []
  for module_name, params in grouped.items():
    module = modules[module_name]
    leaf = module_name.rpartition(".")[2]
    parts = len(packed.get(leaf, [leaf])) if leaf in packed else 1
    tensors = {}
    for param, slots in params.items():
      if sorted(slots) != list(range(parts)):
        raise Unsupported(
            f"module {module_name!r} has {parts} fused parts but the file "
            f"holds {len(slots)} {param!r} tensors for it")
      tensors[param] = [slots[i] for i in range(parts)]
    method = getattr(module, "quant_method", None)
    if isinstance(module, linear_base):
      kernel, path = cpu_int8_kernel(module)
      if isinstance(method, unquantized_linear):
        kind = "linear"
        _check_linear(module_name, module, tensors, shared, {"weight"})
      elif kernel is not None:
        kind = "int8" if path == "onednn" else "int8_sgl"
        _check_int8(module_name, module, kernel, tensors, shared)
        if path == "sgl":
          _check_sgl(module_name, module, kernel)
      else:
        raise Unsupported(
            f"module {module_name!r} runs {type(method).__name__} with "
            f"kernel {type(getattr(getattr(module, 'scheme', None), 'kernel', None)).__name__}"
            "; expected an unquantized linear or a CPU W8A8 INT8 one "
            "(oneDNN or SGL)")
    elif isinstance(module, embedding_cls):
      kind = "embedding"
      if not isinstance(method, unquantized_embed):
        raise Unsupported(f"embedding {module_name!r} runs "
                          f"{type(method).__name__}")
      _check_plain(module_name, module, tensors, shared)
    elif type(module) is rms_norm:  # subclasses (e.g. offsets) differ
      kind = "norm"
      _check_plain(module_name, module, tensors, shared)
    else:
      raise Unsupported(f"module {module_name!r} is a {type(module).__name__};"
                        " expected a linear, embedding or RMSNorm layer")
    steps.append(Step(kind, module_name, module, tensors))
  return steps


def _rows(shared, names):
  return [shared.entries[n].shape[0] for n in names]


def _check_shapes(module_name, module, tensors, shared, cols_name):
  cols = module.input_size_per_partition
  expected = list(module.output_partition_sizes)
  for param, names in tensors.items():
    shapes = [shared.entries[n].shape for n in names]
    want_cols = cols if param == cols_name else None
    if len(expected) == len(names):
      rows = expected
    elif len(names) == 1:
      rows = [sum(expected)]
    else:
      raise Unsupported(f"{module_name!r}: {len(names)} parts in the file, "
                        f"{len(expected)} output partitions in the model")
    for shape, n_rows, name in zip(shapes, rows, names):
      if param == "bias":
        ok = shape == (n_rows,)
      elif param == "weight_scale":
        ok = len(shape) in (1, 2) and shape[0] == n_rows and (
            len(shape) == 1 or shape[1] == 1)
      else:
        ok = shape == (n_rows, want_cols)
      if not ok:
        raise Unsupported(f"{name!r} has shape {shape}; {module_name!r} "
                          f"expects {n_rows} rows" +
                          (f" x {want_cols}" if want_cols else ""))


def _check_linear(module_name, module, tensors, shared, weights):
  has_bias = getattr(module, "bias", None) is not None
  wanted = set(weights) | ({"bias"} if has_bias else set())
  if set(tensors) != wanted:
    raise Unsupported(f"{module_name!r}: the file holds {sorted(tensors)}; "
                      f"expected {sorted(wanted)}")
  if not hasattr(module, "cpu_linear"):
    raise Unsupported(f"{module_name!r} has no CPU GEMM dispatch")
  live = module.weight
  dtype = shared.entries[tensors["weight"][0]].dtype
  if live is None or live.dtype != dtype:
    raise Unsupported(f"{module_name!r}: weight dtype "
                      f"{getattr(live, 'dtype', None)} in the model, {dtype} "
                      "in the file")
  _check_shapes(module_name, module, tensors, shared, "weight")


def _check_int8(module_name, module, kernel, tensors, shared):
  import torch  # pylint: disable=g-import-not-at-top
  has_bias = getattr(module, "bias", None) is not None
  wanted = {"weight", "weight_scale"} | ({"bias"} if has_bias else set())
  if set(tensors) != wanted:
    raise Unsupported(f"{module_name!r}: the file holds {sorted(tensors)}; "
                      f"expected {sorted(wanted)}")
  config = kernel.config
  if not config.is_channelwise or config.is_static_input_scheme:
    raise Unsupported(f"{module_name!r}: INT8 with is_channelwise="
                      f"{config.is_channelwise}, is_static_input_scheme="
                      f"{config.is_static_input_scheme}; expected per-channel "
                      "weights and dynamic activations")
  _, scale_name, _, _, _ = kernel.layer_param_names
  scale = getattr(module, scale_name, None)
  rows = sum(module.output_partition_sizes)
  if scale is None or scale.dtype != torch.float32 or scale.numel() != rows:
    raise Unsupported(f"{module_name!r}: live weight_scale "
                      f"{getattr(scale, 'shape', None)} "
                      f"{getattr(scale, 'dtype', None)}; expected {rows} "
                      "float32 values")
  for param, dtype in (("weight", torch.int8), ("weight_scale", torch.float32)):
    for name in tensors[param]:
      if shared.entries[name].dtype != dtype:
        raise Unsupported(f"{name!r} is {shared.entries[name].dtype}; "
                          f"expected {dtype}")
  _check_shapes(module_name, module, tensors, shared, "weight")


def _check_sgl(module_name, module, kernel):
  import torch  # pylint: disable=g-import-not-at-top
  rows = sum(module.output_partition_sizes)
  cols = module.input_size_per_partition
  live = getattr(module, kernel.layer_param_names[0], None)
  want = sgl_packed_shape(rows, cols)
  if live is None or live.dtype != torch.int8 or tuple(live.shape) != want:
    raise Unsupported(f"{module_name!r}: live SGL INT8 weight "
                      f"{tuple(getattr(live, 'shape', ()))} "
                      f"{getattr(live, 'dtype', None)}; expected {want} int8 "
                      f"(the packed [{rows}, {cols}] codes)")
  if (getattr(module, "bias", None) is not None
      and getattr(module, "bias_fp32", None) is None):
    raise Unsupported(f"{module_name!r} has a bias but no float32 copy "
                      "(bias_fp32) for the SGL GEMM")


def _check_plain(module_name, module, tensors, shared):
  if set(tensors) != {"weight"} or len(tensors["weight"]) != 1:
    raise Unsupported(f"{module_name!r}: the file holds {sorted(tensors)}; "
                      "expected one 'weight'")
  entry = shared.entries[tensors["weight"][0]]
  live = module.weight
  if tuple(live.shape) != entry.shape or live.dtype != entry.dtype:
    raise Unsupported(f"{module_name!r}: weight {tuple(live.shape)} "
                      f"{live.dtype} in the model, {entry.shape} "
                      f"{entry.dtype} in the file")


def apply(model, shared: SharedFile, steps: list[Step], changed, out_dtype
          ) -> dict[str, Any]:
  """Runs the steps of modules with a changed tensor (all when changed is
  None); returns counts."""
  import torch  # pylint: disable=g-import-not-at-top
  changed = None if changed is None else set(changed)
  counts = {"modules": 0, "handlers": 0, "skipped_modules": 0}
  new_embeddings = []
  with torch.no_grad():
    for step in steps:
      if changed is not None and changed.isdisjoint(step.names()):
        counts["skipped_modules"] += 1
        continue
      counts["modules"] += 1
      module = step.module
      if step.kind in ("embedding", "norm"):
        module.weight.data.copy_(shared.tensor(step.tensors["weight"][0]))
        if step.kind == "embedding":
          new_embeddings.append(module.weight)
        continue
      rows = sum(module.output_partition_sizes)
      cols = module.input_size_per_partition
      weight = shared.fused(step.tensors["weight"], rows, cols)
      if "bias" in step.tensors:
        module.bias.data.copy_(shared.fused(step.tensors["bias"], rows, 1)
                               .reshape(module.bias.shape))
      if step.kind == "linear":
        module.weight = torch.nn.Parameter(weight, requires_grad=False)
        module.quant_method.process_weights_after_loading(module)
        kept = module.weight
        if kept is not None and kept.numel() and shared.owns(kept):
          # A dispatch that keeps the weight must not read shared memory
          # that the next sync overwrites.
          module.weight = torch.nn.Parameter(kept.detach().clone(),
                                             requires_grad=False)
      else:
        kernel = module.scheme.kernel
        _, scale_name, _, _, azp_name = kernel.layer_param_names
        scale = getattr(module, scale_name)
        scale.data.copy_(shared.fused(step.tensors["weight_scale"], rows, 1)
                         .reshape(scale.shape))
        if step.kind == "int8_sgl":
          repack_sgl_int8(module, kernel, weight)
        else:
          azp_adj = getattr(module, azp_name, None) if azp_name else None
          if azp_adj is not None:
            # As vLLM's process_weights_for_onednn: column sums of the [K, N]
            # codes (exact in float32 for int8 rows) times the scales.
            adj = weight.sum(dim=1, dtype=torch.float32).unsqueeze(0)
            azp_adj.data.copy_(adj * scale.squeeze())
          build_int8_handler(module, kernel, weight, scale, out_dtype)
      counts["handlers"] += 1
    if new_embeddings:
      counts["handlers"] += rebuild_lm_heads(model, new_embeddings)
  return counts


def rebuild_lm_heads(model, weights=None) -> int:
  """Re-runs vLLM's processing of every unquantized LM head (those whose
  weight is one of `weights`, when given). On CPU that processing packs the
  weight into a oneDNN handler, which an in-place change of the weight does
  not reach; vLLM 0.32's reload does not redo it for a head tied to the
  embeddings (seen: the head kept the old embedding)."""
  (_, _, _, lm_head_cls, unquantized_embed, _) = _classes()
  ptrs = None if weights is None else {w.data_ptr() for w in weights}
  rebuilt = 0
  for module in model.modules():
    if (isinstance(module, lm_head_cls)
        and isinstance(getattr(module, "quant_method", None),
                       unquantized_embed)
        and (ptrs is None or module.weight.data_ptr() in ptrs)):
      module.quant_method.process_weights_after_loading(module)
      rebuilt += 1
  return rebuilt
