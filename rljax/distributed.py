"""Multi-host start-up: JAX's multi-controller runtime, nothing home-made.

Every process runs the same program; `initialize` connects them through
`jax.distributed.initialize` *before* anything touches a device, after which
`jax.devices()` lists the devices of all processes and a Mesh built from it
(`rljax.models.sharding.MeshConfig.build`) spans the hosts. jit-compiled steps
then run SPMD over the global mesh; each process feeds and reads only its
addressable shards.

  python experiments/SCRIPT.py --coordinator_address=10.0.0.1:1234 \\
      --num_processes=2 --process_id=0      # on host 0, and =1 on host 1

With none of the three flags, `initialize(auto=True)` lets JAX detect the
cluster (SLURM, Open MPI, TPU pods, GKE; `jax._src.clusters`) and does nothing
on a single machine. On the CPU backend the processes talk through gloo
(`jax_cpu_collectives_implementation`), which is how the tests run two
processes on 127.0.0.1.

Only process 0 writes metrics, logs and exports (`is_main_process`); orbax
checkpoints are written and restored by every process (orbax coordinates
them itself).
"""

from __future__ import annotations

import os

from absl import flags
import jax

_COORDINATOR = flags.DEFINE_string(
  "coordinator_address",
  None,
  "host:port of process 0's coordinator (multi-host runs). With "
  "--num_processes and --process_id; none of them = auto-detect.",
)
_NUM_PROCESSES = flags.DEFINE_integer(
  "num_processes", None, "Number of processes of a multi-host run."
)
_PROCESS_ID = flags.DEFINE_integer(
  "process_id", None, "This process's index in [0, num_processes)."
)
_LOCAL_DEVICES = flags.DEFINE_integer(
  "cpu_devices_per_process",
  None,
  "CPU backend only: fake devices per process (tests, dry runs).",
)

# Environment variables through which JAX's cluster detection finds a job.
_CLUSTER_ENV = (
  "SLURM_JOB_ID",
  "OMPI_COMM_WORLD_SIZE",
  "TPU_WORKER_ID",
  "TPU_WORKER_HOSTNAMES",
  "MEGASCALE_COORDINATOR_ADDRESS",
  "JOB_COMPLETION_INDEX",
)

_initialized = False


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  *,
  auto: bool = True,
  cpu_devices_per_process: int | None = None,
) -> bool:
  """Connects this process to the others; call before building the mesh.

  Args:
    coordinator_address: "host:port" of process 0 (it listens there).
    num_processes: how many processes the run has.
    process_id: this one's index.
    auto: with no explicit arguments, call `jax.distributed.initialize()`
      without arguments when the environment looks like a cluster JAX
      detects (SLURM, Open MPI, TPU pods); on a plain machine do nothing.
    cpu_devices_per_process: CPU backend only, fake devices per process.

  Returns:
    True if this is a multi-process run (initialized now or before).
  """
  global _initialized
  if _initialized:
    return True
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    missing = [
      n
      for n, v in zip(
        ("coordinator_address", "num_processes", "process_id"), explicit
      )
      if v is None
    ]
    if missing:
      raise ValueError(
        f"multi-host flags: {missing} missing; give "
        "--coordinator_address, --num_processes and "
        "--process_id together (or none, to auto-detect)"
      )
    if not 0 <= process_id < num_processes:
      raise ValueError(
        f"--process_id={process_id}; expected 0 <= process_id "
        f"< num_processes={num_processes}"
      )
  elif not (auto and any(k in os.environ for k in _CLUSTER_ENV)):
    return False
  if cpu_devices_per_process is not None:
    jax.config.update("jax_num_cpu_devices", cpu_devices_per_process)
  # The CPU backend has no cross-process collectives unless told which
  # implementation to use; GPUs (NCCL) and TPUs (ICI/DCN) ignore this.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address, num_processes, process_id)
  _initialized = True
  return True


def initialize_from_flags() -> bool:
  """`initialize` with --coordinator_address, --num_processes, --process_id.

  Flags not parsed (a library call, a test): as if none was given, so only a
  cluster JAX detects is joined. Every script that trains reaches this
  through `rljax.train.driver.run_experiment` (or calls it in `main`).
  """
  if not flags.FLAGS.is_parsed():
    return initialize()
  return initialize(
    _COORDINATOR.value,
    _NUM_PROCESSES.value,
    _PROCESS_ID.value,
    cpu_devices_per_process=_LOCAL_DEVICES.value,
  )


def is_main_process() -> bool:
  """True on process 0, the one that writes metrics, logs and exports."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (a no-op on a
  single-process run)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    multihost_utils.sync_global_devices(name)


def shutdown() -> None:
  """Disconnects cleanly (a no-op on a single-process run)."""
  global _initialized
  if _initialized:
    jax.distributed.shutdown()
    _initialized = False
