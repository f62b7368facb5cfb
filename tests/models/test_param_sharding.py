"""Sharding on 8 fake CPU devices gives the single-device numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rljax import models
from rljax.quant.qtensor import QTensor

CONFIG = models.tiny_config(arch="qwen2")

needs_8_devices = pytest.mark.skipif(
  jax.device_count() < 8, reason="needs 8 (fake) devices: see tests/conftest.py"
)


@pytest.fixture(scope="module")
def params(random_params):
  return random_params(CONFIG)


@pytest.fixture(scope="module")
def mesh():
  return models.make_mesh(data=2, fsdp=2, tensor=2)


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, CONFIG.vocab_size, (4, 10)).astype(np.int32)
  mask = np.ones_like(tokens)
  tokens[1, :3], mask[1, :3] = 0, 0
  return {"tokens": tokens, "mask": mask}


@needs_8_devices
def test_layout(params, mesh):
  s = models.param_shardings(CONFIG, params, mesh)
  assert s["layers"]["q_proj"]["kernel"].spec == P(None, "fsdp", "tensor")
  assert s["layers"]["q_proj"]["bias"].spec == P(None, "tensor")
  assert s["layers"]["o_proj"]["kernel"].spec == P(None, "tensor", "fsdp")
  assert s["layers"]["down_proj"]["kernel"].spec == P(None, "tensor", "fsdp")
  assert s["embed"]["embedding"].spec == P("tensor", "fsdp")
  assert s["lm_head"]["kernel"].spec == P("fsdp", "tensor")
  assert s["layers"]["attn_norm"]["scale"].spec == P(None, None)
  sharded = models.shard_params(CONFIG, params, mesh)
  shard_shape = (
    sharded["layers"]["gate_proj"]["kernel"].addressable_shards[0].data.shape
  )
  assert shard_shape == (2, 16, 32)  # [L, D/fsdp, F/tensor]


@needs_8_devices
def test_indivisible_dims_are_replicated():
  config = models.tiny_config(head_dim=6)  # k_proj out = 12
  params = jax.eval_shape(
    lambda: models.init_params(config, jax.random.PRNGKey(0))
  )
  mesh = models.make_mesh(data=1, fsdp=1, tensor=8)
  s = models.param_shardings(config, params, mesh)
  assert s["layers"]["k_proj"]["kernel"].spec == P(None, "fsdp", None)
  assert s["layers"]["gate_proj"]["kernel"].spec == P(None, "fsdp", "tensor")


@needs_8_devices
def test_qtensor_leaves(params, mesh):
  kernel = params["layers"]["up_proj"]["kernel"]
  scale = jnp.max(jnp.abs(kernel), axis=-2, keepdims=True) / 127
  q = QTensor(value=jnp.round(kernel / scale).astype(jnp.int8), scale=scale)
  qparams = dict(params, layers=dict(params["layers"], up_proj={"kernel": q}))
  s = models.param_shardings(CONFIG, qparams, mesh)
  assert s["layers"]["up_proj"]["kernel"].value.spec == P(
    None, "fsdp", "tensor"
  )
  assert s["layers"]["up_proj"]["kernel"].scale.spec == P(None, None, "tensor")


@needs_8_devices
def test_sharded_forward_and_logprobs_match_single_device(params, mesh):
  batch = _batch()
  fwd = jax.jit(models.forward, static_argnums=0)
  logp_fn = jax.jit(models.token_logprobs, static_argnums=(0, 5))
  ref_logits = fwd(CONFIG, params, batch["tokens"], batch["mask"])
  ref_logp = logp_fn(CONFIG, params, batch["tokens"], batch["mask"], 1.0, 4)

  sharded = models.shard_params(CONFIG, params, mesh)
  sbatch = models.shard_batch(batch, mesh)
  logits = fwd(CONFIG, sharded, sbatch["tokens"], sbatch["mask"])
  logp = logp_fn(CONFIG, sharded, sbatch["tokens"], sbatch["mask"], 1.0, 4)
  assert len(logits.sharding.device_set) == 8
  np.testing.assert_allclose(logits, ref_logits, atol=1e-5)
  for a, b in zip(logp, ref_logp):
    np.testing.assert_allclose(a, b, atol=1e-5)

  def loss(p, tokens, mask):
    return jnp.sum(
      models.token_logprobs(CONFIG, p, tokens, mask)[0] * mask[:, 1:]
    )

  grad = jax.jit(jax.grad(loss))
  g_ref = grad(params, batch["tokens"], batch["mask"])
  g = grad(sharded, sbatch["tokens"], sbatch["mask"])
  # Sharded reductions sum in another order: float32 rounding only.
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=5e-5, atol=1e-5),
    g,
    g_ref,
  )


@needs_8_devices
def test_cache_shardings(mesh):
  cache = models.init_cache(CONFIG, batch=4, max_len=8)
  s = models.cache_shardings(mesh, cache)
  assert s["k"].spec == P(None, ("data", "fsdp"), None, "tensor", None)


@needs_8_devices
@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"data": 3, "fsdp": 1}, "need 3 devices"),
    ({"data": 3}, "not divisible"),
    ({"data": -1, "fsdp": -1}, "only one axis"),
    ({"tensor": 0}, "tensor=0"),
  ],
)
def test_make_mesh_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    models.make_mesh(**kwargs)


@needs_8_devices
def test_make_mesh_fills_free_axis():
  mesh = models.make_mesh(data=2, tensor=2)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}


@needs_8_devices
def test_shard_batch_needs_divisible_batch(mesh):
  with pytest.raises(ValueError, match=r"\['tokens'\].*data\*fsdp=4"):
    models.shard_batch({"tokens": np.zeros((6, 3), np.int32)}, mesh)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_load_named_param_dtype(dtype):
  # The master weights' dtype (mixed precision's param_dtype) is chosen at
  # load time: the params come out of the loader in it, every leaf.
  model = models.load_named("tiny", 0, dtype=dtype)
  dtypes = {x.dtype for x in jax.tree.leaves(model.params)}
  assert dtypes == {jnp.dtype(dtype)}
