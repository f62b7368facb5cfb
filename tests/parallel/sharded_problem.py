"""One RL update problem on the tiny random model, run on any mesh.

Shared by tests/parallel/test_sharded_update.py (in-process, 8 fake devices)
and, as a script, by tests/parallel/test_multiprocess.py (one process of a
multi-process run; see `main`):

  python tests/parallel/sharded_problem.py OUT.npz DATA,FSDP,TENSOR STEPS KIND \
      --coordinator_address=127.0.0.1:PORT --num_processes=2 --process_id=I

KIND is "critic" (PPO with a critic) or "policy" (the policy loss alone).

Everything is built from fixed seeds with numpy or on the host, so every
process holds the same global batch and initial params.
"""

from __future__ import annotations

import sys

import numpy as np

B, T, PROMPT = 16, 12, 4


def adamw():
  """`optim.make_optimizer`'s layout (clip, then AdamW with injected
  hyperparameters) with a large eps: Adam's first step is ≈ lr·sign(g), which
  would turn float32 rounding in a near-zero gradient into an lr-sized param
  difference; with eps = 1e-4 the update is smooth in g."""
  import optax  # pylint: disable=g-import-not-at-top

  return optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.inject_hyperparams(optax.adamw)(
      learning_rate=1e-2, eps=1e-4, weight_decay=0.01
    ),
  )


def problem(critic: bool = True):
  """(spec, optimizer, critic_optimizer, state0, batch): host (numpy) data.

  critic=False: the policy loss alone (no critic, one micro-batch), which
  compiles in about half the time."""
  import jax  # pylint: disable=g-import-not-at-top
  from rljax import models
  from rljax.core import objectives
  from rljax.train import update as update_lib

  config = models.tiny_config()
  rng = np.random.default_rng(0)
  shapes = jax.eval_shape(
    lambda: models.init_params(config, jax.random.PRNGKey(0))
  )

  # Random norms and weights (numpy: no eager per-shape compiles).
  def draw(path, s):
    noise = rng.standard_normal(s.shape)
    scale = "norm" in jax.tree_util.keystr(path)
    return (1.0 + 0.1 * noise if scale else 0.2 * noise).astype(np.float32)

  params = jax.tree_util.tree_map_with_path(draw, shapes)
  critic_params = {
    "backbone": jax.tree.map(lambda x: x.copy(), params),
    "head": {
      "kernel": (0.1 * rng.standard_normal((config.hidden_size, 1))).astype(
        np.float32
      ),
      "bias": np.zeros((1,), np.float32),
    },
  }
  tokens = rng.integers(3, config.vocab_size, (B, T)).astype(np.int32)
  attention = np.ones((B, T), np.int32)
  attention[1, :3] = 0  # a left-padded row
  mask = np.zeros((B, T - 1), np.float32)
  for b in range(B):  # uneven response lengths
    mask[b, PROMPT : PROMPT + 2 + b % 6] = 1.0
  logp = (-np.abs(rng.standard_normal((B, T - 1))) - 0.5).astype(np.float32)
  batch = dict(
    tokens=tokens,
    attention_mask=attention,
    loss_mask=mask,
    prox_logp=logp,
    behav_logp=(logp + 0.2 * rng.standard_normal(logp.shape)).astype(
      np.float32
    ),
    ref_logp=(logp + 0.1 * rng.standard_normal(logp.shape)).astype(np.float32),
    advantages=(rng.standard_normal((B, T - 1)) * mask).astype(np.float32),
    returns=(rng.standard_normal((B, T - 1)) * mask).astype(np.float32),
    old_values=(0.1 * rng.standard_normal((B, T - 1))).astype(np.float32),
  )
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
    kl_coef=0.05,
    entropy_coef=0.01,
    micro_batches=2 if critic else 1,
    uses_critic=critic,
    value_clip=0.5,
  )
  optimizer = adamw()
  critic_optimizer = adamw() if critic else None
  state = update_lib.TrainState(
    step=np.zeros((), np.int32),
    params=params,
    opt_state=jax.tree.map(np.asarray, optimizer.init(params)),
  )
  if critic:
    state = state.replace(
      critic_params=critic_params,
      critic_opt_state=jax.tree.map(
        np.asarray, critic_optimizer.init(critic_params)
      ),
    )
  return spec, optimizer, critic_optimizer, state, batch


def run(mesh_shape, steps: int, critic: bool = True):
  """`steps` update steps on `mesh_shape` = (data, fsdp, tensor), or on one
  device with the plain `make_update_step` when None. Returns (states,
  metrics): per step, host numpy copies (gathered from every process)."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils
  from rljax.models.sharding import MeshConfig
  from rljax.train import sharded
  from rljax.train import update as update_lib

  spec, opt, copt, state0, batch = problem(critic)
  if mesh_shape is None:
    step = update_lib.make_update_step(spec, opt, copt, donate=False)
    state = jax.tree.map(jax.numpy.asarray, state0)
    fetch = lambda tree: jax.tree.map(np.asarray, tree)
  else:
    mesh = MeshConfig(*mesh_shape).build()
    step, shardings = sharded.make_sharded_update_step(
      spec, opt, mesh, state0, batch, critic_optimizer=copt
    )
    state = sharded.put_global(state0, shardings["state"])
    batch = sharded.put_global(batch, shardings["batch"])
    # One gather for the whole tree (one small compile), only when some
    # shards live in other processes.
    fetch = lambda tree: jax.tree.map(
      np.asarray,
      (
        tree
        if all(x.is_fully_addressable for x in jax.tree.leaves(tree))
        else multihost_utils.process_allgather(tree, tiled=True)
      ),
    )
  states, metrics = [], []
  for _ in range(steps):
    state, m = step(state, batch)
    states.append(fetch(state))
    metrics.append(fetch(m))
  return states, metrics, state


def flat(tree) -> dict[str, np.ndarray]:
  """{keystr: array} of every leaf (for npz files and comparisons)."""
  import jax  # pylint: disable=g-import-not-at-top

  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def main(argv):
  """One process of a multi-process run; process 0 writes OUT.npz."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from rljax import distributed  # defines the flags

  out, mesh_text, steps, kind = flags.FLAGS(argv)[1:5]
  distributed.initialize_from_flags()
  shape = tuple(int(x) for x in mesh_text.split(","))
  states, metrics, _ = run(shape, int(steps), critic=kind == "critic")
  if distributed.is_main_process():
    arrays = {}
    for i, (s, m) in enumerate(zip(states, metrics)):
      arrays.update({f"{i}/state{k}": v for k, v in flat(s).items()})
      arrays.update({f"{i}/metrics{k}": v for k, v in flat(m).items()})
    arrays["process_count"] = np.asarray(jax.process_count())
    arrays["device_count"] = np.asarray(jax.device_count())
    np.savez(out, **arrays)
  distributed.shutdown()


if __name__ == "__main__":
  main(sys.argv)
