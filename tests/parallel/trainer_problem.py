"""A few Trainer steps of the tiny model on a mesh, in one process or many.

Shared by tests/parallel/test_trainer_mesh.py (in-process, 8 fake devices)
and, as a script, by tests/parallel/test_multiprocess_trainer.py (one
process of a multi-process run; see `main`):

  python tests/parallel/trainer_problem.py OUT.npz RUN_DIR DATA,FSDP,TENSOR \
      --coordinator_address=127.0.0.1:PORT --num_processes=2 --process_id=I \
      --cpu_devices_per_process=4

The run: GRPO with a KL-to-reference term (the reference log-prob pass), two
PPO epochs (the proximal log-prob pass) and INT8 rollouts, from fixed seeds,
so every process builds the same model, prompts and rollouts. The model is
`tiny_config` over the instrument's character tokenizer (`digit_task`):
what is checked is the layout, not the language.
"""

from __future__ import annotations

import sys

import numpy as np

STEPS = 2


VOCAB = 32  # the 20 characters of `CharTokenizer`, padded to split 8 ways


def digit_task(cfg):
  """Reward = share of odd digits among the completion's characters: it
  varies across a random model's samples, so the advantages are not 0.

  The prompts are bare expressions ('12+5-9=') in the instrument's
  character tokenizer (`rljax.instrument`): short sequences and a 32-token
  vocabulary keep the sharded programs small, and nothing has to load the
  49k-token SmolLM2 tokenizer (seconds per process)."""
  from rljax import data as data_lib  # pylint: disable=g-import-not-at-top
  from rljax import instrument
  from rljax.train.tasks import Task

  class DigitTask(Task):
    def score(self, completions, examples, n):
      scores = np.array(
        [sum(ch in "13579" for ch in c) / max(len(c), 1) for c in completions],
        np.float32,
      )
      return scores, {"odd_share": scores}

  examples = data_lib.generate_arithmetic(64, "easy", seed=cfg.run.seed)
  return DigitTask(
    examples[8:],
    examples[:8],
    instrument.CharTokenizer(),
    instrument.render_prompt,
    cfg.rollout.prompts_per_step,
    cfg.run.seed,
    cfg.task.max_prompt_tokens,
    reward_workers=0,
  )


def tiny_model(seed: int):
  """A random `tiny_config` decoder over the character tokenizer."""
  import jax  # pylint: disable=g-import-not-at-top
  from rljax import instrument, models

  config = models.tiny_config(vocab_size=VOCAB)
  # One compiled init rather than one compile per op (seconds per process).
  init = jax.jit(models.init_params, static_argnums=0)
  params = init(config, jax.random.PRNGKey(seed))
  return models.Model(
    config=config, params=params, tokenizer=instrument.CharTokenizer()
  )


def config(run_dir, mesh_shape, **overrides):
  from rljax.train.config import apply_preset  # pylint: disable=g-import-not-at-top

  base = dict(
    model="tiny",
    steps=10,  # STEPS are run: no final checkpoint unless asked
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=6,
    max_prompt_tokens=16,  # bare expressions: the sampler's buffers are small
    eval_size=0,
    reward_workers=0,
    run_dir=str(run_dir),
    checkpoint_every=100,
    tensorboard=False,
    learning_rate=1e-3,
    export_hf=False,
    kl_coef=0.05,
    ppo_epochs=2,
    mesh_shape=mesh_shape,
  )
  # float32 compute on every CPU: these tests compare sharded, multi-process
  # and resumed runs with the one-device run up to float32 reassociation,
  # and `auto` is bf16 on CPUs with bf16 dot units, where one reassociated
  # sum can move a bf16 rounding (docs/precision.md).
  base["model.compute_dtype"] = "float32"
  # The INT8 rollout's UAQ fold as these tests were calibrated (1.5, the old
  # default; the default is now 1.0): which activation codes sit at a
  # rounding boundary, and may flip under a sharded sum, depends on it.
  base["rollout.uaq_scale"] = 1.5
  algorithm = overrides.pop("algorithm", "grpo")
  base.update(overrides)
  return apply_preset(algorithm, **base)


def trainer(run_dir, mesh_shape, **overrides):
  from rljax.train import loop as loop_lib  # pylint: disable=g-import-not-at-top

  cfg = config(run_dir, mesh_shape, **overrides)
  return loop_lib.Trainer(
    cfg,
    model=tiny_model(cfg.run.seed),
    task=digit_task(cfg),
    show_progress=False,
  )


def host_params(t):
  """The trainer's params as numpy, gathered from every process."""
  import jax  # pylint: disable=g-import-not-at-top

  return jax.tree.map(np.asarray, t.placement.local(t.state.params))


def run(run_dir, mesh_shape, **overrides):
  """(rows, params after each step, the closed trainer)."""
  t = trainer(run_dir, mesh_shape, **overrides)
  rows, params = [], []
  try:
    t.actor.sync(*t._theta())
    for _ in range(STEPS):
      rows.append(t.train_step())
      params.append(host_params(t))
  finally:
    t.close()
  return rows, params, t


def numbers(row):
  """The row without wall times and rates (they differ run to run)."""
  return {
    k: v
    for k, v in row.items()
    if not k.startswith("time_") and not k.endswith("_per_s")
  }


def flat(tree) -> dict[str, np.ndarray]:
  import jax  # pylint: disable=g-import-not-at-top

  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def assert_rows_close(got_rows, want_rows):
  for i, (got, want) in enumerate(zip(got_rows, want_rows)):
    got, want = numbers(got), numbers(want)
    assert got.keys() == want.keys()
    for k in want:
      # Sharded reductions add in another order: float32 rounding only. The
      # quantizer's diagnostics count INT8 codes that moved; rounding in θ
      # may move a code across a boundary: 1e-3 of the codes.
      atol = 1e-3 if k.startswith("quant/") else 2e-6
      np.testing.assert_allclose(
        got[k], want[k], rtol=2e-5, atol=atol, err_msg=f"step {i + 1} {k}"
      )


def assert_params_close(got, want, what=""):
  assert_params_close_flat(flat(got), want, what)


def assert_params_close_flat(got, want, what=""):
  """`got` as {keystr: array} against the params tree `want`."""
  want = flat(want)
  assert got.keys() == want.keys()
  for k in want:
    # Adam's first steps are ≈ lr·g/(|g| + eps): float32 rounding in a
    # near-zero gradient moves a param by a visible fraction of lr (1e-3),
    # so single elements get 0.1·lr; the typical element must agree to
    # rounding.
    np.testing.assert_allclose(
      got[k], want[k], rtol=2e-5, atol=1e-4, err_msg=what + k
    )
    assert np.mean(np.abs(got[k] - want[k])) < 1e-6, what + k


def layout(t) -> dict[str, np.ndarray]:
  """How the trainer's q_proj kernel (params and reference params) is laid
  out: the number of devices it spans and the shape of one shard."""
  out = {}
  for name, tree in (("params", t.state.params), ("ref", t.ref_params)):
    q = tree["layers"]["q_proj"]["kernel"]
    out[f"layout/{name}/devices"] = np.asarray(len(q.sharding.device_set))
    out[f"layout/{name}/shard_shape"] = np.asarray(
      q.sharding.shard_shape(q.shape)
    )
  return out


def read_result(path, steps=STEPS):
  """(rows, flat params after each step, flat restored params, arrays) of an
  OUT.npz that `main` wrote."""
  got = np.load(path)
  rows = [
    {
      k.split("/row/", 1)[1]: float(got[k])
      for k in got.files
      if k.startswith(f"{i}/row/")
    }
    for i in range(steps)
  ]
  params = [
    {
      k[len(f"{i}/params") :]: got[k]
      for k in got.files
      if k.startswith(f"{i}/params")
    }
    for i in range(steps)
  ]
  restored = {
    k[len("restored") :]: got[k] for k in got.files if k.startswith("restored")
  }
  return rows, params, restored, got


def main(argv):
  """One process of a multi-process run (or, without the distributed
  flags, a whole run on this process's devices): STEPS steps with a
  checkpoint each, then a resume from the last checkpoint; process 0 writes
  OUT.npz (`read_result` reads it)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  import jax
  from rljax import distributed  # defines the flags

  out, run_dir, mesh_shape = flags.FLAGS(argv)[1:4]
  distributed.initialize_from_flags()
  rows, params, _ = run(run_dir, mesh_shape, checkpoint_every=1)
  # Every process restores its shards of the last checkpoint.
  resumed = trainer(run_dir, mesh_shape, checkpoint_every=1, resume=True)
  restored = host_params(resumed)
  resumed_step = resumed.step_num
  resumed.close()
  if distributed.is_main_process():
    arrays = {"process_count": np.asarray(jax.process_count())}
    arrays["device_count"] = np.asarray(jax.device_count())
    arrays["resumed_step"] = np.asarray(resumed_step)
    arrays.update(layout(resumed))
    for i, (row, p) in enumerate(zip(rows, params)):
      arrays.update({f"{i}/row/{k}": np.asarray(v) for k, v in row.items()})
      arrays.update({f"{i}/params{k}": v for k, v in flat(p).items()})
    arrays.update({f"restored{k}": v for k, v in flat(restored).items()})
    np.savez(out, **arrays)
  distributed.shutdown()


if __name__ == "__main__":
  main(sys.argv)
