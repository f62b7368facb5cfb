"""The sharded update step computes the single-device step.

One PPO step with a critic, KL and entropy terms and two micro-batches of the
tiny model, on 8 fake CPU devices (tests/conftest.py) over three meshes,
against the plain `make_update_step` on one device: the loss, every metric,
the gradients (Adam's first moment after step 1 is (1 − b1)·g), the params
and the whole optimizer state after each of two steps agree to float32 rounding.
"""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from parallel import sharded_problem
from rljax.models import sharding as sharding_lib
from rljax.train import sharded

needs_8_devices = pytest.mark.skipif(
  jax.device_count() < 8, reason="needs 8 (fake) devices: tests/conftest.py"
)

MESHES = [(2, 2, 2), (1, 8, 1), (8, 1, 1)]


@pytest.fixture(scope="module")
def reference():
  states, metrics, _ = sharded_problem.run(None, steps=2)
  return states, metrics


def _assert_close(got, want, what):
  got, want = sharded_problem.flat(got), sharded_problem.flat(want)
  assert got.keys() == want.keys()
  for k in want:
    # Sharded reductions add in another order: float32 rounding only.
    np.testing.assert_allclose(
      got[k], want[k], rtol=2e-5, atol=2e-6, err_msg=f"{what}{k}"
    )


@needs_8_devices
@pytest.mark.parametrize("mesh_shape", MESHES)
def test_sharded_step_equals_single_device(reference, mesh_shape):
  ref_states, ref_metrics = reference
  states, metrics, last = sharded_problem.run(mesh_shape, steps=2)
  for i in range(2):
    _assert_close(metrics[i], ref_metrics[i], f"step {i} metrics")
    _assert_close(states[i], ref_states[i], f"step {i} state")
  assert float(metrics[0]["applied"]) == 1.0
  # The state compared above includes Adam's first moment after step 1,
  # (1 − b1)·clip(g): the gradients agree, not only the params they moved.
  mu = states[0].opt_state[1].inner_state[0].mu
  assert max(float(np.abs(x).max()) for x in jax.tree.leaves(mu)) > 1e-4
  assert float(metrics[0]["loss"]) != 0.0
  # The state keeps its layout from step to step (explicit out_shardings).
  data, fsdp, tensor = mesh_shape
  q = last.params["layers"]["q_proj"]["kernel"].sharding.spec
  assert q == P(
    None, "fsdp" if fsdp > 1 else None, "tensor" if tensor > 1 else None
  ) or q == P(None, "fsdp", "tensor")
  mu = last.opt_state[1].inner_state[0].mu["layers"]["q_proj"]["kernel"]
  assert mu.sharding.spec == q
  backbone = last.critic_params["backbone"]["layers"]["up_proj"]["kernel"]
  assert backbone.sharding.spec == q


@needs_8_devices
def test_param_size_per_device_falls_as_one_over_fsdp():
  spec, _, _, state, batch = sharded_problem.problem()
  per_device = {}
  for fsdp in (1, 2, 4, 8):
    mesh = sharding_lib.MeshConfig(data=8 // fsdp, fsdp=fsdp).build()
    s = sharded.state_shardings(spec, state, mesh)
    kernel = state.params["layers"]["gate_proj"]["kernel"]
    shard = s.params["layers"]["gate_proj"]["kernel"].shard_shape(kernel.shape)
    per_device[fsdp] = int(np.prod(shard))
  assert per_device == {f: per_device[1] // f for f in (1, 2, 4, 8)}


@needs_8_devices
def test_batch_must_divide_data_times_fsdp():
  mesh = sharding_lib.MeshConfig(data=4, fsdp=2).build()
  with pytest.raises(ValueError, match=r"\['tokens'\].*data\*fsdp=8"):
    sharded.batch_shardings({"tokens": np.zeros((6, 3), np.int32)}, mesh)


def test_mesh_config():
  assert sharding_lib.MeshConfig.parse("2,-1,1") == sharding_lib.MeshConfig(
    2, -1, 1
  )
  with pytest.raises(ValueError, match="mesh='2,2'"):
    sharding_lib.MeshConfig.parse("2,2")
  assert sharding_lib.mesh_axes(("embed", "heads", None)) == (
    "fsdp",
    "tensor",
    None,
  )
  with pytest.raises(ValueError, match="'hidden' has no rule"):
    sharding_lib.mesh_axes(("hidden",))
