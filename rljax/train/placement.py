"""Where the Trainer's arrays live: one device, or a ("data", "fsdp",
"tensor") Mesh.

The `mesh` section (`--mesh.data/fsdp/tensor`) picks it. One device (the
default on CPU; see `Placement.from_config`) is the single-device trainer,
unchanged: every method here is then the identity and the plain
`update.make_update_step` runs. Any other shape builds a Mesh over
the first data*fsdp*tensor devices (under multi-host, `rljax.distributed`,
over every process's devices; the product must then be the global device
count) and:

  params, optimizer state, critic   -> `sharding.param_shardings` (the one
  reference params, LoRA base            table of logical-axis rules)
  update step                       -> `sharded.make_sharded_update_step`
                                       (explicit in/out shardings, donated
                                       state)
  minibatch, the tokens of the      -> leading dim over ("data", "fsdp")
  reference / proximal / value passes
  outputs of those passes           -> replicated (every process can read
                                       them on the host: advantages, GAE and
                                       the metrics are host code)

Sharding changes no number beyond float32 reassociation
(tests/parallel/test_trainer_mesh.py: a Trainer step on 8 fake devices for
three meshes equals the single-device step).

Every process holds the whole rollout batch (each generates the same
rollouts from the same seeds and weights) and feeds only its addressable
shards (`sharded.put_global`): simple, and right while rollout and the
host-side batch building are small next to the update.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rljax.models import sharding as sharding_lib
from rljax.quant import cpu as cpu_lib
from rljax.train import sharded

# Sharded update steps shared by the Trainers of a process (an ablation, the
# tests) so that equal configurations on the same mesh compile once; the
# optimizers are the cached objects of `init_state.compiled_update`, so
# identity is equality here.
_STEPS: dict = {}


def compute_dtype(cfg) -> str:
  """The dtype the forward passes run in: `cfg.model.compute_dtype`, with
  "auto" resolved here and nowhere else: "bfloat16" on an accelerator (GPU,
  TPU: bf16 matmuls run at the tensor-core rate and activations take half
  the memory) and on a CPU with bf16 dot units (AVX512-BF16 or AMX-BF16:
  bf16 x bf16 -> f32 dots ~1.7-5x the f32 dot, `quant.cpu`), "float32" on
  other CPUs. See docs/precision.md."""
  name = cfg.model.compute_dtype
  if name != "auto":
    return name
  if jax.default_backend() != "cpu":
    return "bfloat16"
  return "bfloat16" if cpu_lib.host_cpu().fast_bf16_dot else "float32"


def activation_dtype(cfg) -> str | None:
  """The activation dtype of the forward passes (`UpdateSpec.
  activation_dtype`); None = the compute dtype. Under bf16 compute on the
  CPU backend it is "float32": the weights are bf16 and every matmul a bf16
  x bf16 -> f32 dot (`quant.bf16_dot`, backward too), while norms, RoPE,
  attention scores and the residual stream stay float32, because CPUs run
  bf16 only in their dot units (elementwise bf16 is converted to f32 and
  back, slower than f32 throughout). The JAX sampler's bf16 format on CPUs
  runs the same way (`JaxSampler.activation_dtype`)."""
  return activation_dtype_for(compute_dtype(cfg))


def activation_dtype_for(compute: str) -> str | None:
  """`activation_dtype` of a resolved compute dtype on this backend, for
  specs built without a TrainConfig (`experiments/profile_update.py`).
  The memory planner leaves it None: it plans bf16 activations for an
  accelerator, even when it compiles on fake CPU devices."""
  if jnp.dtype(compute) == jnp.bfloat16 and jax.default_backend() == "cpu":
    return "float32"
  return None


def parse_mesh_shape(text: str) -> tuple[int, int, int]:
  """(data, fsdp, tensor) of a `mesh_shape` string such as "2,2,2"."""
  try:
    sizes = tuple(int(x) for x in str(text).split(","))
  except ValueError:
    sizes = ()
  if len(sizes) != 3 or min(sizes) < 1:
    raise ValueError(
      f"mesh_shape={text!r}; expected three positive ints "
      "'data,fsdp,tensor', e.g. '2,2,2'"
    )
  return sizes


def resolve_mesh_sizes(mesh) -> tuple[int, int, int]:
  """(data, fsdp, tensor) of a `MeshConfig`, its -1 size resolved: the
  devices left over, or 1 on the CPU backend (see `Placement.from_config`).
  """
  sizes = (mesh.data, mesh.fsdp, mesh.tensor)
  if -1 not in sizes:
    return sizes
  known = max(1, -int(np.prod(sizes)))  # the product of the other sizes
  if jax.default_backend() == "cpu" and jax.process_count() == 1:
    left = 1 if known == 1 else None
  else:
    left = None
  if left is None:
    n = jax.device_count()
    if n % known:
      raise ValueError(
        f"mesh={sizes}: {n} devices do not split into a multiple of {known}"
      )
    left = n // known
  return tuple(left if s == -1 else s for s in sizes)


def build_mesh(data: int, fsdp: int, tensor: int) -> Mesh | None:
  """The Mesh of (data, fsdp, tensor), or None for (1, 1, 1) on one process.

  One process may use fewer devices than it has (the first ones); a
  multi-process run must use all of them, since every process runs the same
  SPMD program.
  """
  n = data * fsdp * tensor
  if n == 1 and jax.process_count() == 1:
    return None
  devices = jax.devices()
  if jax.process_count() > 1 and n != len(devices):
    raise ValueError(
      f"mesh_shape={data},{fsdp},{tensor} covers {n} devices; a "
      f"{jax.process_count()}-process run has {len(devices)} and must use "
      "them all"
    )
  if n > len(devices):
    raise ValueError(
      f"mesh_shape={data},{fsdp},{tensor} needs {n} devices; "
      f"{len(devices)} are visible"
    )
  return sharding_lib.make_mesh(data, fsdp, tensor, devices=devices[:n])


class Placement:
  """The Trainer's layout: `mesh` None (one device) or a Mesh."""

  def __init__(self, mesh: Mesh | None):
    self.mesh = mesh

  @classmethod
  def from_config(cls, cfg) -> "Placement":
    """From the `mesh` section; checks that a minibatch splits over the mesh
    (its leading dim must be divisible by data*fsdp).

    A size of -1 takes the devices left over. On the CPU backend the
    default (-1, 1, 1) means one device: XLA's CPU "devices" (the tests'
    `--xla_force_host_platform_device_count`) share the same cores, so
    sharding over them costs compile time and gains nothing. Sizes given
    explicitly are always honoured.
    """
    data, fsdp, tensor = resolve_mesh_sizes(cfg.mesh)
    rows = (
      cfg.rollout.prompts_per_step
      * cfg.rollout.group_size
      // max(cfg.update.minibatches, 1)
    )
    if rows % (data * fsdp):
      raise ValueError(
        f"mesh={data},{fsdp},{tensor}: a minibatch of {rows} sequences "
        f"(rollout.prompts_per_step*rollout.group_size/update.minibatches) "
        f"must be divisible by data*fsdp={data * fsdp}"
      )
    return cls(build_mesh(data, fsdp, tensor))

  @property
  def sharded(self) -> bool:
    return self.mesh is not None

  @property
  def rollout_mesh(self) -> Mesh | None:
    """The mesh the JAX sampler runs on: the trainer's on one process;
    under multi-host each process samples on its own devices from gathered
    weights (`local`), since every process needs the whole rollout."""
    return self.mesh if jax.process_count() == 1 else None

  # -- placing arrays ---------------------------------------------------------

  def _put(self, tree, shardings):
    if jax.process_count() == 1:
      return jax.device_put(tree, shardings)
    # Other processes' devices cannot be written from here: each process
    # fills its own shards from the host copy they all hold.
    return sharded.put_global(tree, shardings)

  def put_params(self, model_config, params):
    """`params` (a decoder tree, a critic, a TrainState) on the mesh, laid
    out by the logical-axis rules; as given without a mesh."""
    if self.mesh is None or params is None:
      return params
    return self._put(
      params, sharding_lib.param_shardings(model_config, params, self.mesh)
    )

  def put_batch(self, tree):
    """Every array of `tree` split along its leading (batch) dim."""
    if self.mesh is None:
      return tree
    return self._put(tree, sharded.batch_shardings(tree, self.mesh))

  def gather(self, tree):
    """`tree` replicated on every device (readable on every host)."""
    if self.mesh is None:
      return tree
    return _replicate(self.mesh)(tree)

  def local(self, tree):
    """`tree` as this process's own arrays, for what runs outside the mesh
    (the rollout engine, evaluation, exports). On one process the mesh's
    arrays already are (as given); under multi-host each process gets the
    whole value, gathered, on its default device."""
    if self.mesh is None or jax.process_count() == 1 or tree is None:
      return tree
    return jax.tree.map(
      lambda x: jax.device_put(np.asarray(x)), self.gather(tree)
    )

  # -- the update step --------------------------------------------------------

  def update_step(
    self,
    spec,
    optimizer,
    critic_optimizer,
    state,
    frozen=None,
    plain: Callable | None = None,
  ) -> Callable:
    """`step(state, minibatch, frozen) -> (state, metrics)`: `plain` (the
    single-device step) without a mesh, else the sharded step, which places
    each minibatch over ("data", "fsdp") itself."""
    if self.mesh is None:
      return plain
    key = (spec, optimizer, critic_optimizer, self.mesh, frozen is not None)
    if key not in _STEPS:
      shapes = lambda t: jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), t
      )
      # batch_example=None: one sharding for the whole minibatch dict,
      # whatever fields this configuration's batch has.
      _STEPS[key] = sharded.make_sharded_update_step(
        spec,
        optimizer,
        self.mesh,
        shapes(state),
        None,
        critic_optimizer=critic_optimizer,
        frozen_example=None if frozen is None else shapes(frozen),
      )[0]
    inner = _STEPS[key]

    def step(state, minibatch, frozen=None):
      minibatch = self.put_batch(minibatch)
      if frozen is None:
        return inner(state, minibatch)
      return inner(state, minibatch, frozen)

    return step


_REPLICATE: dict = {}


def _replicate(mesh: Mesh):
  if mesh not in _REPLICATE:
    _REPLICATE[mesh] = jax.jit(
      lambda t: t, out_shardings=NamedSharding(mesh, P())
    )
  return _REPLICATE[mesh]
