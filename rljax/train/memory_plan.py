"""The update step's memory plan on a mesh, from XLA's compiled program.

`plan` compiles (never runs) the sharded update step and one decode step
for abstract inputs (jax.ShapeDtypeStruct), so a 7B model can be planned on
fake CPU devices; the per-device bytes come from each array's sharding and
from `compiled.memory_analysis()`. Used by `experiments/profile_update.py
--aot`.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax import models
from rljax.core import objectives
from rljax.models import sharding as sharding_lib
from rljax.train import sharded
from rljax.train import optim as optim_lib
from rljax.train import update as update_lib


def random_batch(config, batch: int, seq: int, rng) -> dict:
  k = jax.random.split(rng, 4)
  tokens = jax.random.randint(
    k[0], (batch, seq), 0, config.vocab_size, jnp.int32
  )
  prompt = seq // 4
  mask = jnp.zeros((batch, seq - 1), jnp.float32).at[:, prompt:].set(1.0)
  logp = -jnp.abs(jax.random.normal(k[1], (batch, seq - 1))) - 1.0
  return {
    "tokens": tokens,
    "attention_mask": jnp.ones((batch, seq), jnp.int32),
    "loss_mask": mask,
    "prox_logp": logp,
    "behav_logp": logp + 0.01 * jax.random.normal(k[2], logp.shape),
    "advantages": jax.random.normal(k[3], (batch, seq - 1)) * mask,
  }


def _per_device_bytes(tree, shardings) -> int:
  """Bytes of `tree` on the most loaded device, from its shardings."""
  total = 0
  for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
    total += int(np.prod(s.shard_shape(x.shape))) * jnp.dtype(x.dtype).itemsize
  return total


def compiled_bytes(compiled) -> dict:
  """XLA's static memory plan of a compiled program, in bytes: arguments,
  outputs, donated (aliased) buffers, temporaries, and the peak
  = arguments + outputs − aliased + temporaries."""
  mem = compiled.memory_analysis()
  out = {
    "argument": int(mem.argument_size_in_bytes),
    "output": int(mem.output_size_in_bytes),
    "alias": int(mem.alias_size_in_bytes),
    "temp": int(mem.temp_size_in_bytes),
  }
  out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
  return out


def plan(
  config,
  mesh,
  batch: int,
  seq: int,
  micro_batches: int,
  remat: bool,
  logprob_chunk: int,
  param_dtype,
  compute_dtype,
  decode: bool,
  rollout_batch: int,
) -> dict:
  """Compiles (never runs) the sharded update step and one decode step;
  returns per-device bytes. Peak = arguments + outputs − donated + temps."""
  param_dtype, compute_dtype = jnp.dtype(param_dtype), jnp.dtype(compute_dtype)
  loss = objectives.PolicyLossConfig(
    surrogate="ppo",
    correction="acr",
    eps_low=0.2,
    eps_high=0.28,
    aggregation="token-mean",
  )
  spec = update_lib.UpdateSpec(
    model_config=config,
    loss=loss,
    micro_batches=micro_batches,
    remat=remat,
    logprob_chunk=logprob_chunk,
    param_transform=(
      sharded.cast_params_transform(compute_dtype)
      if compute_dtype != param_dtype
      else None
    ),
  )
  optimizer = optim_lib.make_optimizer(optim_lib.OptimConfig(1e-6, 100))
  params = jax.eval_shape(
    lambda: models.init_params(config, jax.random.PRNGKey(0), dtype=param_dtype)
  )
  state = jax.eval_shape(
    lambda p: update_lib.init_train_state(p, optimizer), params
  )
  batch_shapes = jax.eval_shape(
    lambda: random_batch(config, batch, seq, jax.random.PRNGKey(1))
  )
  step, shardings = sharded.make_sharded_update_step(
    spec, optimizer, mesh, state, batch_shapes
  )
  t0 = time.perf_counter()
  compiled = step.lower(state, batch_shapes).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled_bytes(compiled)
  s = shardings["state"]
  out = {
    "params": int(sum(x.size for x in jax.tree.leaves(params))),
    "update_compile_s": compile_s,
    "params_bytes": _per_device_bytes(state.params, s.params),
    "opt_state_bytes": _per_device_bytes(state.opt_state, s.opt_state),
    "batch_bytes": _per_device_bytes(batch_shapes, shardings["batch"]),
    "update_temp_bytes": mem["temp"],
    "update_peak_bytes": mem["peak"],
  }
  if decode:
    rb = rollout_batch or batch
    # Rollout weights in the compute dtype, laid out like the params.
    r_params = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, compute_dtype), params
    )
    cache = jax.eval_shape(
      lambda: models.init_cache(config, rb, seq, dtype=compute_dtype)
    )
    r_shard = sharding_lib.param_shardings(config, r_params, mesh)
    c_shard = sharding_lib.cache_shardings(mesh, cache)
    b_shard = sharding_lib.batch_sharding(mesh)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    tok = jax.ShapeDtypeStruct((rb, 1), jnp.int32)
    kv_mask = jax.ShapeDtypeStruct((rb, seq), jnp.bool_)
    idx = jax.ShapeDtypeStruct((), jnp.int32)
    fn = jax.jit(
      lambda p, t, pos, c, i, m: models.forward_with_cache(
        config, p, t, pos, c, i, m
      ),
      in_shardings=(r_shard, b_shard, b_shard, c_shard, rep, b_shard),
      out_shardings=(b_shard, c_shard),
      donate_argnums=(3,),
    )
    t0 = time.perf_counter()
    dec = fn.lower(r_params, tok, tok, cache, idx, kv_mask).compile()
    dmem = compiled_bytes(dec)
    out.update(
      decode_compile_s=time.perf_counter() - t0,
      rollout_batch=rb,
      rollout_params_bytes=_per_device_bytes(r_params, r_shard),
      kv_cache_bytes=_per_device_bytes(cache, c_shard),
      decode_temp_bytes=dmem["temp"],
      decode_peak_bytes=dmem["peak"],
    )
  return out
