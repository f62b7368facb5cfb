"""A Trainer on a mesh takes the single-device Trainer's steps (issue 14).

Two GRPO steps of the tiny model with a KL-to-reference term (the reference
log-prob pass), two PPO epochs (the proximal log-prob pass) and INT8
rollouts (`trainer_problem.py`), on 8 fake CPU devices (tests/conftest.py)
with `mesh_shape` (2,2,2), (1,8,1) and (8,1,1), against `mesh_shape="1,1,1"`
(one device, the default): the rollouts, the loss and every metric, and the
params after each step agree to float32 rounding, and the state really is
laid out over the mesh.
"""

import jax
import pytest

from parallel import trainer_problem
from rljax.train import placement as placement_lib

needs_8_devices = pytest.mark.skipif(
  jax.device_count() < 8, reason="needs 8 (fake) devices: tests/conftest.py"
)

MESHES = ["2,2,2", "1,8,1", "8,1,1"]
STEPS = trainer_problem.STEPS


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  rows, params, t = trainer_problem.run(tmp_path_factory.mktemp("one"), "1,1,1")
  assert t.placement.mesh is None  # the default is one device
  return rows, params


@needs_8_devices
@pytest.mark.parametrize("mesh_shape", MESHES)
def test_trainer_on_mesh_equals_one_device(reference, tmp_path, mesh_shape):
  ref_rows, ref_params = reference
  rows, params, trainer = trainer_problem.run(tmp_path, mesh_shape)
  trainer_problem.assert_rows_close(rows, ref_rows)
  for i in range(STEPS):
    trainer_problem.assert_params_close(
      params[i], ref_params[i], f"step {i + 1} "
    )
  assert rows[0]["loss"] != 0.0 and rows[0]["kl_to_ref"] >= 0.0
  assert rows[0]["loss"] != rows[1]["loss"]
  # Really laid out over the mesh, the reference params included, and kept
  # so from step to step.
  _, fsdp, tensor = placement_lib.parse_mesh_shape(mesh_shape)
  for tree in (trainer.state.params, trainer.ref_params):
    q = tree["layers"]["q_proj"]["kernel"]
    layers, d_in, d_out = q.shape
    assert len(q.sharding.device_set) == 8
    assert q.sharding.shard_shape(q.shape) == (
      layers,
      d_in // fsdp,
      d_out // tensor,
    )


@needs_8_devices
def test_minibatch_must_split_over_the_mesh(tmp_path):
  with pytest.raises(ValueError, match=r"mesh=2,4,1.*data\*fsdp=8"):
    placement_lib.Placement.from_config(
      trainer_problem.config(tmp_path, "2,4,1", group_size=2)
    )


def test_default_mesh_is_one_device():
  assert placement_lib.build_mesh(1, 1, 1) is None
  with pytest.raises(ValueError, match="mesh_shape='2,2'"):
    placement_lib.parse_mesh_shape("2,2")
