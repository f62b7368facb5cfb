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

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rljax.models.config import ModelConfig

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1,
              devices: Sequence[Any] | None = None) -> Mesh:
  """Mesh with axes ("data", "fsdp", "tensor"); one size may be -1 (the rest).

  The product of the sizes must equal the number of `devices` (default: all
  of `jax.devices()`).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
  for name, size in sizes.items():
    if not isinstance(size, int) or (size <= 0 and size != -1):
      raise ValueError(f"make_mesh {name}={size!r}; expected a positive int "
                       "or -1")
  free = [n for n, s in sizes.items() if s == -1]
  if len(free) > 1:
    raise ValueError(f"make_mesh: only one axis may be -1; got {free}")
  fixed = int(np.prod([s for s in sizes.values() if s != -1]))
  if free:
    if len(devices) % fixed:
      raise ValueError(f"make_mesh: {len(devices)} devices not divisible by "
                       f"the fixed axis sizes {sizes}")
    sizes[free[0]] = len(devices) // fixed
  shape = tuple(sizes[a] for a in AXES)
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"make_mesh: axis sizes {dict(zip(AXES, shape))} need "
                     f"{int(np.prod(shape))} devices; have {len(devices)}")
  return Mesh(np.asarray(devices, dtype=object).reshape(shape), AXES)


def _key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _logical_spec(keys: tuple[str, ...], ndim: int) -> tuple:
  """Mesh axis per dimension of the leaf at `keys`, before divisibility."""
  quant_field = keys[-1] if keys[-1] in ("value", "scale") else None
  if quant_field:
    keys = keys[:-1]
  if keys == ("embed", "embedding"):
    return ("tensor", "fsdp")
  if keys[:1] == ("lm_head",) and keys[-1] == "kernel":
    spec = ("fsdp", "tensor")
  elif keys[:1] == ("layers",) and len(keys) == 3 and keys[1] in _COLUMN:
    spec = ((None, "fsdp", "tensor") if keys[2] == "kernel" else
            (None, "tensor"))
  elif keys[:1] == ("layers",) and len(keys) == 3 and keys[1] in _ROW:
    spec = (None, "tensor", "fsdp")
  else:
    return (None,) * ndim  # norms, value heads, ...: small, replicated
  if quant_field == "scale":
    # Per-output-channel scale [..., 1, out] follows the kernel's out dim.
    spec = spec[:-2] + (None, spec[-1])
  if len(spec) != ndim:
    return (None,) * ndim
  return spec


def _fit(spec: tuple, shape: tuple[int, ...], mesh: Mesh) -> P:
  fitted = []
  for axis, dim in zip(spec, shape):
    if axis is not None and dim % mesh.shape[axis]:
      axis = None
    fitted.append(axis)
  return P(*fitted)


def param_shardings(config: ModelConfig, params, mesh: Mesh):
  """A NamedSharding per leaf of `params` (QTensor leaves included)."""
  del config  # The layout follows the tree's names; config kept for symmetry.

  def leaf_sharding(path, leaf):
    keys = tuple(_key_name(k) for k in path)
    shape = tuple(np.shape(leaf))
    return NamedSharding(mesh, _fit(_logical_spec(keys, len(shape)), shape,
                                    mesh))

  return jax.tree_util.tree_map_with_path(leaf_sharding, params)


def shard_params(config: ModelConfig, params, mesh: Mesh):
  """`params` placed on `mesh` with `param_shardings`."""
  return jax.device_put(params, param_shardings(config, params, mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dim split over ("data", "fsdp"); other dims replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def shard_batch(batch, mesh: Mesh):
  """Every array of `batch` (any pytree) split along its leading dim."""
  n = mesh.shape["data"] * mesh.shape["fsdp"]

  def put(path, x):
    if np.ndim(x) == 0 or np.shape(x)[0] % n:
      raise ValueError(
          f"batch leaf {jax.tree_util.keystr(path) or 'array'} has shape "
          f"{np.shape(x)}; its leading dim must be divisible by "
          f"data*fsdp={n}")
    return jax.device_put(x, batch_sharding(mesh))

  return jax.tree_util.tree_map_with_path(put, batch)


def cache_shardings(mesh: Mesh, cache):
  """KV cache [L, B, S, Hkv, hd]: batch over ("data","fsdp"), heads over
  "tensor" (where they divide)."""
  def leaf_sharding(x):
    spec = (None, BATCH_AXES, None, "tensor", None)
    fitted = []
    for axis, dim in zip(spec, np.shape(x)):
      size = (int(np.prod([mesh.shape[a] for a in axis]))
              if isinstance(axis, tuple) else
              (mesh.shape[axis] if axis else 1))
      fitted.append(axis if dim % size == 0 else None)
    return NamedSharding(mesh, P(*fitted))
  return jax.tree.map(leaf_sharding, cache)
