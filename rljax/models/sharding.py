"""SPMD layout of the decoder: a ("data", "fsdp", "tensor") Mesh and the
NamedShardings of params, batches and KV caches.

Megatron-style tensor parallelism (Shoeybi et al., 2019): q/k/v/gate/up are
column-parallel (output dim over "tensor"), o/down are row-parallel (input dim
over "tensor"); the other dim of each kernel is split over "fsdp" (ZeRO-3
style; XLA all-gathers it for the matmul). The batch is split over
("data", "fsdp"). A dimension that an axis does not divide is replicated over
that axis rather than rejected, so odd head counts still run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rljax.models.config import ModelConfig

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# The one place where logical dimensions meet mesh axes (in the style of
# flax.linen.partitioning's logical-axis rules and MaxText's logical axes).
# Every sharding in rljax (params, optimizer state, critic, batch, KV cache)
# is derived from it; change a layout here, not at a call site.
LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
  ("batch", BATCH_AXES),  # sequences of a batch: data parallel + ZeRO
  ("embed", "fsdp"),  # D, the residual width: ZeRO-3 split
  ("heads", "tensor"),  # Hq * hd: Megatron column/row split
  ("kv_heads", "tensor"),  # Hkv * hd (and the cache's Hkv axis)
  ("mlp", "tensor"),  # F, the SwiGLU width
  ("vocab", "tensor"),  # V, embedding rows and LM-head columns
  ("layers", None),  # the scanned layer axis stays whole
  ("length", None),  # sequence / cache slots
  ("head_dim", None),
)

# Logical axes of each kernel's [in, out] dims (after the layer axis).
_KERNEL_AXES = {
  "q_proj": ("embed", "heads"),
  "k_proj": ("embed", "kv_heads"),
  "v_proj": ("embed", "kv_heads"),
  "o_proj": ("heads", "embed"),
  "gate_proj": ("embed", "mlp"),
  "up_proj": ("embed", "mlp"),
  "down_proj": ("mlp", "embed"),
}
# Top-level names of the params tree (docs/CONTRACTS.md). A path is read from
# the first of these it contains, so optimizer states (whose mu/nu mirror the
# params under a prefix) and critics ({"backbone": params}) get the same
# layout as the params they mirror.
_ROOTS = ("embed", "layers", "final_norm", "lm_head")


def mesh_axes(logical: tuple[str | None, ...], rules=LOGICAL_RULES) -> tuple:
  """Mesh axis (or None) of each logical axis name, by `rules`."""
  table = dict(rules)
  out = []
  for name in logical:
    if name is not None and name not in table:
      raise ValueError(
        f"logical axis {name!r} has no rule; known: {sorted(table)}"
      )
    out.append(None if name is None else table[name])
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Shape of the ("data", "fsdp", "tensor") mesh; one size may be -1 (the
  devices left over). The default puts every device on "data" (pure data
  parallelism: right for models that fit one device with their optimizer
  state); raise `fsdp` when they do not, `tensor` for very wide layers."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1

  def build(self, devices: Sequence[Any] | None = None) -> Mesh:
    """The Mesh over `devices` (default: all global devices)."""
    return make_mesh(self.data, self.fsdp, self.tensor, devices=devices)

  @classmethod
  def parse(cls, text: str) -> "MeshConfig":
    """From "data,fsdp,tensor", e.g. "2,2,2" or "1,-1,1"."""
    try:
      sizes = [int(x) for x in text.split(",")]
    except ValueError:
      sizes = []
    if len(sizes) != 3:
      raise ValueError(
        f"mesh={text!r}; expected three comma-separated ints "
        "data,fsdp,tensor such as 2,2,2 (one may be -1)"
      )
    return cls(*sizes)


def _suggest(named: dict, devices: int, use_all: bool) -> str:
  """Sizes that fit `devices`: the largest fixed axis resized, the others
  kept (or every device on "data" where the others alone do not fit)."""
  fixed = {a: s for a, s in named.items() if s != -1}
  axis = max(fixed, key=lambda a: (fixed[a], a == "data"))
  others = int(np.prod([s for a, s in fixed.items() if a != axis]))
  free = len(fixed) < len(named)  # the -1 axis stays; no second -1
  if devices % others == 0:
    alt = "" if free else " (or -1: the devices left over)"
    return f"--mesh.{axis}={devices // others} with the others as given{alt}"
  if not use_all and not free and others <= devices:
    return f"--mesh.{axis}={devices // others} with the others as given"
  return "--mesh.data=-1 --mesh.fsdp=1 --mesh.tensor=1 (every device on data)"


def mesh_fit_problem(
  sizes: Sequence[int], devices: int, use_all: bool = True
) -> tuple[str, str] | None:
  """Why a ("data", "fsdp", "tensor") mesh of `sizes` does not fit
  `devices` devices, or None: (the axis to change, what was expected),
  the sizes named by their `mesh.*` flags, with the device count and
  sizes that would fit.

  One size may be -1, the devices left over: the product of the others
  must divide `devices`. Otherwise the product must equal `devices`
  (`use_all`: a mesh over the devices it is given, or a run of several
  processes, which all run one program) or be at most `devices` (one
  process may use its first devices).
  """
  named = dict(zip(AXES, (int(s) for s in sizes)))
  given = " ".join(f"--mesh.{a}={s}" for a, s in named.items())
  free = [a for a, s in named.items() if s == -1]
  if len(free) > 1:
    return free[-1], f"only one axis may be -1 (the devices left over); {given}"
  fixed = int(np.prod([s for s in named.values() if s != -1]))
  if free:
    if devices % fixed == 0:
      return None
    axis = max(
      (a for a in AXES if a not in free), key=lambda a: (named[a], a == "data")
    )
    return axis, (
      f"sizes whose product divides the {devices} devices "
      f"(--mesh.{free[0]}=-1 takes what is left): {given}, and {devices} is "
      f"not divisible by {fixed}; e.g. {_suggest(named, devices, True)}"
    )
  if fixed == devices or (fixed < devices and not use_all):
    return None
  axis = max(named, key=lambda a: (named[a], a == "data"))
  if use_all:
    bound = f"= {devices}, the devices to span"
  else:
    bound = f"<= {devices}, the devices visible"
  return axis, (
    f"data*fsdp*tensor {bound}: {given} need {fixed} devices; e.g. "
    f"{_suggest(named, devices, use_all)}"
  )


def make_mesh(
  data: int = 1,
  fsdp: int = -1,
  tensor: int = 1,
  devices: Sequence[Any] | None = None,
) -> Mesh:
  """Mesh with axes ("data", "fsdp", "tensor"); one size may be -1 (the rest).

  The product of the sizes must equal the number of `devices` (default: all
  of `jax.devices()`).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
  for name, size in sizes.items():
    if not isinstance(size, int) or (size <= 0 and size != -1):
      raise ValueError(
        f"make_mesh {name}={size!r}; expected a positive int or -1"
      )
  problem = mesh_fit_problem(tuple(sizes.values()), len(devices))
  if problem:
    axis, expected = problem
    raise ValueError(
      f"make_mesh: mesh.{axis}={sizes[axis]}; expected {expected}"
    )
  free = [n for n, s in sizes.items() if s == -1]
  if free:
    fixed = int(np.prod([s for s in sizes.values() if s != -1]))
    sizes[free[0]] = len(devices) // fixed
  shape = tuple(sizes[a] for a in AXES)
  return Mesh(np.asarray(devices, dtype=object).reshape(shape), AXES)


def _key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def logical_axes(keys: tuple[str, ...], ndim: int) -> tuple:
  """Logical axis name (or None) per dimension of the leaf at path `keys`."""
  roots = [i for i, k in enumerate(keys) if k in _ROOTS]
  if not roots:
    return (None,) * ndim
  keys = keys[roots[0] :]
  quant_field = keys[-1] if keys[-1] in ("value", "scale") else None
  if quant_field:
    keys = keys[:-1]
  if keys == ("embed", "embedding"):
    spec = ("vocab", "embed")
  elif keys == ("lm_head", "kernel"):
    spec = ("embed", "vocab")
  elif keys[:1] == ("layers",) and len(keys) == 3 and keys[1] in _KERNEL_AXES:
    d_in, d_out = _KERNEL_AXES[keys[1]]
    spec = (
      ("layers", d_in, d_out) if keys[2] == "kernel" else ("layers", d_out)
    )  # bias
  else:
    return (None,) * ndim  # norms, value heads, counts: small, replicated
  if quant_field == "scale":
    # Per-output-channel scale [..., 1, out] follows the kernel's out dim.
    spec = spec[:-2] + (None, spec[-1])
  if len(spec) != ndim:
    return (None,) * ndim
  return spec


def _logical_spec(keys: tuple[str, ...], ndim: int) -> tuple:
  """Mesh axis per dimension of the leaf at `keys`, before divisibility."""
  return mesh_axes(logical_axes(keys, ndim))


def _fit(spec: tuple, shape: tuple[int, ...], mesh: Mesh) -> P:
  fitted = []
  for axis, dim in zip(spec, shape):
    if axis is not None and dim % _axis_size(mesh, axis):
      axis = None  # replicate what the axis does not divide
    fitted.append(axis)
  return P(*fitted)


def _axis_size(mesh: Mesh, axis) -> int:
  names = axis if isinstance(axis, tuple) else (axis,)
  return int(np.prod([mesh.shape[a] for a in names]))


def param_shardings(config: ModelConfig, params, mesh: Mesh):
  """A NamedSharding per leaf of `params` (QTensor leaves included)."""
  del config  # The layout follows the tree's names; config kept for symmetry.

  def leaf_sharding(path, leaf):
    keys = tuple(_key_name(k) for k in path)
    shape = tuple(np.shape(leaf))
    return NamedSharding(
      mesh, _fit(_logical_spec(keys, len(shape)), shape, mesh)
    )

  return jax.tree_util.tree_map_with_path(leaf_sharding, params)


def shard_params(config: ModelConfig, params, mesh: Mesh):
  """`params` placed on `mesh` with `param_shardings`."""
  return jax.device_put(params, param_shardings(config, params, mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dim split over ("data", "fsdp"); other dims replicated."""
  return NamedSharding(mesh, P(*mesh_axes(("batch",))))


def shard_batch(batch, mesh: Mesh):
  """Every array of `batch` (any pytree) split along its leading dim."""
  n = _axis_size(mesh, mesh_axes(("batch",))[0])

  def put(path, x):
    if np.ndim(x) == 0 or np.shape(x)[0] % n:
      raise ValueError(
        f"batch leaf {jax.tree_util.keystr(path) or 'array'} has shape "
        f"{np.shape(x)}; its leading dim must be divisible by "
        f"data*fsdp={n}"
      )
    return jax.device_put(x, batch_sharding(mesh))

  return jax.tree_util.tree_map_with_path(put, batch)


def cache_shardings(mesh: Mesh, cache):
  """KV cache [L, B, S, Hkv, hd]: batch over ("data","fsdp"), heads over
  "tensor" (where they divide)."""
  spec = mesh_axes(("layers", "batch", "length", "kv_heads", "head_dim"))

  def leaf_sharding(x):
    return NamedSharding(mesh, _fit(spec, np.shape(x), mesh))

  return jax.tree.map(leaf_sharding, cache)


def decode_cache_shardings(mesh: Mesh, cache):
  """`init_decode_cache` layout (per layer, k [B, Hkv, hd, S] and v [B, Hkv,
  S, hd]), sharded as `cache_shardings`."""
  axes = {
    "k": ("batch", "kv_heads", "head_dim", "length"),
    "v": ("batch", "kv_heads", "length", "head_dim"),
  }
  return {
    name: tuple(
      NamedSharding(mesh, _fit(mesh_axes(axes[name]), np.shape(x), mesh))
      for x in layers
    )
    for name, layers in cache.items()
  }
