"""The update step on a ("data", "fsdp", "tensor") Mesh.

`make_sharded_update_step` wraps `update.make_update_step` (the loss, the
micro-batch accumulation and the guarded optimizer step stay there, written
once) in a `jax.jit` with explicit shardings:

  params, optimizer state, critic, frozen LoRA base -> `param_shardings`
      (logical axes -> mesh axes by `rljax.models.sharding.LOGICAL_RULES`;
      Adam's mu/nu get the layout of the params they mirror)
  batch                                -> leading dim over ("data", "fsdp")
  metrics                              -> replicated scalars

and donates the train state, so the new params and moments reuse the old
buffers. With explicit out_shardings the layout of the state is a fixed point:
step n+1 receives exactly what step n produced, with no resharding between
steps and no recompilation.

Sharding changes no number beyond float32 reassociation: GSPMD inserts the
all-gathers (fsdp weights), reduce-scatters (gradients) and all-reduces
(tensor-parallel partial sums) that make the partitioned program compute the
same function as the single-device one
(tests/train/test_sharded_update.py checks it for three meshes).

Multi-host: the same code runs under `jax.distributed.initialize()`
(`rljax.distributed`); `put_global` builds the global arrays from host data
that every process holds in full.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rljax.models import sharding as sharding_lib
from rljax.train import update as update_lib


def state_shardings(spec: update_lib.UpdateSpec, state: Any, mesh: Mesh):
  """NamedShardings of a `TrainState` (arrays or ShapeDtypeStructs).

  Every leaf is placed by its path: params, the optimizer's moments and the
  critic's backbone by the decoder's logical axes; counts, learning rates,
  the step, norms and value heads are replicated.
  """
  return sharding_lib.param_shardings(spec.model_config, state, mesh)


def batch_shardings(batch: Any, mesh: Mesh):
  """The batch sharding for every leaf of `batch` (leading dim = batch)."""
  n = int(np.prod([mesh.shape[a] for a in sharding_lib.BATCH_AXES]))

  def one(path, x):
    shape = np.shape(x)
    if not shape or shape[0] % n:
      raise ValueError(
        f"batch leaf {jax.tree_util.keystr(path) or 'array'} has shape "
        f"{tuple(shape)}; its leading dim must be divisible by "
        f"data*fsdp={n}"
      )
    return sharding_lib.batch_sharding(mesh)

  return jax.tree_util.tree_map_with_path(one, batch)


def put_global(tree: Any, shardings: Any):
  """`tree` (host data, the same on every process) as global jax.Arrays.

  Each process fills only its addressable shards, so this works on one host
  and on many (where `jax.device_put` of a numpy array onto devices of other
  processes is not allowed)."""

  def put(x, s):
    if x is None:
      return None
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, s, lambda idx: host[idx])

  return jax.tree.map(put, tree, shardings)


def make_sharded_update_step(
  spec: update_lib.UpdateSpec,
  optimizer: optax.GradientTransformation,
  mesh: Mesh,
  state_example: Any,
  batch_example: Any,
  critic_optimizer: optax.GradientTransformation | None = None,
  frozen_example: Any = None,
  donate: bool = True,
):
  """`update.make_update_step` jitted over `mesh` with explicit shardings.

  Args:
    spec: the loss (as for `make_update_step`).
    optimizer: the policy's optax transformation.
    mesh: a ("data", "fsdp", "tensor") Mesh (`MeshConfig.build()`).
    state_example: a TrainState of arrays or ShapeDtypeStructs (only shapes
      and tree structure are read), e.g. `jax.eval_shape(init_train_state,
      ...)`.
    batch_example: a minibatch of the same kind; its leading dim must be
      divisible by data*fsdp. None: one batch sharding for the whole batch
      argument, whatever its fields (a pytree-prefix sharding).
    critic_optimizer: as for `make_update_step` (PPO).
    frozen_example: the frozen base params of a LoRA spec, or None.
    donate: donate the train state's buffers to the step.

  Returns:
    (step, shardings): `step(state, batch[, frozen]) -> (state, metrics)`
    with the state and metrics laid out as `shardings["state"]` and
    replicated; `shardings` = {"state", "batch", "frozen"} for placing
    inputs (`put_global`).
  """
  inner = update_lib.make_update_step(
    spec, optimizer, critic_optimizer, donate=False
  )
  s_state = state_shardings(spec, state_example, mesh)
  if batch_example is None:
    s_batch = sharding_lib.batch_sharding(mesh)
  else:
    s_batch = batch_shardings(batch_example, mesh)
  replicated = NamedSharding(mesh, P())
  in_shardings = (s_state, s_batch)
  s_frozen = None
  if frozen_example is not None:
    s_frozen = sharding_lib.param_shardings(
      spec.model_config, frozen_example, mesh
    )
    in_shardings += (s_frozen,)
  # The inner jit is inlined into this one; its own donation is off because
  # only the outermost jit's donation takes effect.
  step = jax.jit(
    inner,
    in_shardings=in_shardings,
    out_shardings=(s_state, replicated),
    donate_argnums=(0,) if donate else (),
  )
  return step, {"state": s_state, "batch": s_batch, "frozen": s_frozen}


def cast_params_transform(compute_dtype, inner=None):
  """An `UpdateSpec.param_transform` that runs the model in `compute_dtype`
  from master params in their own (float32) dtype: mixed precision.

  The Trainer sets `UpdateSpec.compute_dtype` instead (the same cast,
  `update.cast_floating`, also applied to the critic); this transform is for
  specs built by hand (the memory planner). The cast is differentiated like
  any op, so gradients reach the float32 master weights in float32, and the
  optimizer state stays float32. The LM head's dot accumulates in float32
  and the log-softmax runs in float32 (`logits_from_hidden`). `inner`
  composes with another transform (LoRA's merge runs first, in the master
  dtype, then the merged weights are cast).
  """

  def transform(frozen, params, rng):
    if inner is not None:
      params = inner(frozen, params, rng)
    return update_lib.cast_floating(params, compute_dtype)

  return transform
