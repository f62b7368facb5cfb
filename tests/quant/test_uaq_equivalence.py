"""UAQ under Adam is a learning-rate change, in the trainer itself.

Two real `Trainer`s on the tiny model with INT8 rollout run the same GRPO
steps (rollout, proximal pass, two mini-batch updates, weight sync):

  * UAQ: `rollout.uaq_scale = s` (θ folded once, trained folded, the folded
    θ quantized for the engine);
  * plain: `rollout.uaq_scale = 1` with the per-tensor learning rates the
    fold amounts to: lr·s on the q/k/v/gate/up kernels, lr/s on the two norm
    gains (a leaf folded by s^k gets lr·s^(−k); rljax/quant/uaq.py).

With gradient clipping off, every sync's θ of the UAQ run, unfolded, is the
plain run's θ to float tolerance, the engine's INT8 codes are the same
(Q(W/s) = Q(W)/s: per-output-channel absmax), its scales are the plain
run's / s, and the rollouts are the same tokens. With a global-norm clip
that binds, the plain per-tensor-lr run is not the UAQ run (the fold
rescales the gradients the clip measures); the UAQ run is reproduced
exactly once the clip measures the gradient as the folded run sees it
(g·s^(−k)) before Adam.
"""

import jax
import numpy as np
import optax
import pytest

import quant_testing

from rljax import instrument
from rljax import models
from rljax import quant
from rljax.quant.qtensor import QTensor
from rljax.train import loop as loop_lib
from rljax.train import optim as optim_lib
from rljax.train.config import apply_preset

S = 2.0
STEPS = 3
# optax.adamw's ε, which the trainer's optimizer keeps (optim.make_optimizer).
_ADAM_EPS = 1e-8


def _powers(params):
  """k per leaf of `params`: the fold multiplies the leaf by s^k."""
  out = jax.tree.map(lambda _: 0, params)
  for (module, leaf), k in quant.uaq.uaq_powers().items():
    if leaf in out["layers"].get(module, {}):
      out["layers"][module][leaf] = k
  return out


def _scale_leaves(factors):
  """An optax stage multiplying each leaf by its own factor."""

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, m: u * m, updates, factors), state

  return optax.GradientTransformation(lambda p: optax.EmptyState(), update)


def _per_tensor(cfg, params, s, clip_in_folded_metric=False):
  """The trainer's optimizer (optim.make_optimizer: global-norm clip, AdamW
  on the schedule) with each leaf's learning rate × s^(−k) and its Adam ε
  × s^k, k the leaf's fold power: what Adam on the folded leaf does, in the
  plain coordinates (uaq.py). clip_in_folded_metric: the clip measures
  g·s^(−k), the gradient the folded run's clip sees."""
  powers = _powers(params)
  labels = jax.tree.map(str, powers)
  schedule = optim_lib.schedule(cfg)

  def adam(k):
    # Not inject_hyperparams: the trainer reads one learning rate back out
    # of the optimizer state, and three would be ambiguous.
    return optax.adamw(
      learning_rate=lambda count: schedule(count) * float(s) ** (-k),
      b1=cfg.b1,
      b2=cfg.b2,
      eps=_ADAM_EPS * float(s) ** k,
      weight_decay=cfg.weight_decay,
    )

  per_leaf = optax.multi_transform(
    {label: adam(int(label)) for label in set(jax.tree.leaves(labels))}, labels
  )
  clip = (
    optax.clip_by_global_norm(cfg.max_grad_norm)
    if cfg.max_grad_norm > 0
    else optax.identity()
  )
  if not clip_in_folded_metric:
    return optax.chain(clip, per_leaf)
  to_folded = jax.tree.map(lambda k: float(s) ** (-k), powers)
  back = jax.tree.map(lambda k: float(s) ** k, powers)
  return optax.chain(
    _scale_leaves(to_folded), clip, _scale_leaves(back), per_leaf
  )


def _model():
  """A small Llama decoder over the instrument's 20-token vocabulary (so a
  sampled token sits far from its neighbours' CDF boundaries, and float
  rounding cannot flip it), with random norm gains; the same for every
  run."""
  shape = instrument.InstrumentConfig(
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    max_len=32,
  )
  config = shape.model_config()
  return models.Model(
    config=config,
    params=quant_testing.randomized_params(config, seed=0),
    tokenizer=instrument.CharTokenizer(),
  )


def _config(tmp_path, name, uaq_scale, max_grad_norm, steps=STEPS):
  return apply_preset(
    "grpo",
    {
      "model.name": "tiny",
      "model.compute_dtype": "float32",
      "task.difficulty": "easy",
      "task.max_prompt_tokens": 16,
      "rollout.quant": "int8",
      "rollout.uaq_scale": uaq_scale,
      "rollout.prompts_per_step": 4,
      "rollout.group_size": 4,
      "rollout.max_new_tokens": 6,
      "rollout.temperature": 1.0,
      # A random policy scores 0: DAPO's soft overlong punishment gives its
      # groups reward variance, so the updates move θ.
      "advantage.overlong_shaping": True,
      "advantage.overlong_max_len": 6,
      "advantage.overlong_cache_len": 4,
      "update.minibatches": 2,
      "optim.learning_rate": 3e-3,
      "optim.max_grad_norm": max_grad_norm,
      "optim.weight_decay": 0.0,
      "run.steps": steps,
      "run.checkpoint_every": 100,
      "task.eval_size": 0,
      "task.reward_workers": 0,
      "run.run_dir": str(tmp_path / name),
      "run.tensorboard": False,
      "run.export_hf": False,
    },
  )


def _run(monkeypatch, cfg, make_optimizer=None):
  """Trains cfg; returns the (θ, engine weights) of every sync and the
  metric rows. make_optimizer(optim_cfg, params) replaces the trainer's
  optimizer (the update step and its cache are the trainer's own)."""
  model = _model()
  monkeypatch.setattr(loop_lib, "_UPDATE_STEPS", {})
  if make_optimizer is not None:
    monkeypatch.setattr(
      loop_lib.optim_lib,
      "make_optimizer",
      lambda optim_cfg: make_optimizer(optim_cfg, model.params),
    )
  task = instrument.build_task(cfg, model.tokenizer)
  trainer = loop_lib.Trainer(cfg, model=model, task=task, show_progress=False)
  syncs = []
  prepare = trainer.actor.prepare

  def spy(params, version):
    rparams, diag = prepare(params, version)
    syncs.append(jax.device_get((params, rparams)))
    return rparams, diag

  trainer.actor.prepare = spy
  try:
    rows = trainer.run()
  finally:
    trainer.close()
    monkeypatch.undo()
  return syncs, rows


def _max_diff(a, b) -> float:
  return max(
    float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def _engine_kernels(rparams):
  return {
    f"{m}/{leaf}": v
    for m, leaves in rparams["layers"].items()
    for leaf, v in leaves.items()
    if isinstance(v, QTensor)
  }


@pytest.fixture(scope="module")
def uaq_run(tmp_path_factory):
  mp = pytest.MonkeyPatch()
  return _run(mp, _config(tmp_path_factory.mktemp("uaq"), "run", S, 0.0))


def test_uaq_is_a_per_tensor_learning_rate_step_for_step(
  uaq_run, tmp_path, monkeypatch
):
  (uaq_syncs, uaq_rows) = uaq_run
  cfg = _config(tmp_path, "plain", 1.0, 0.0)
  syncs, rows = _run(monkeypatch, cfg, lambda o, p: _per_tensor(o, p, S))
  assert len(syncs) == len(uaq_syncs) == STEPS + 1
  moved = _max_diff(syncs[-1][0], syncs[0][0])
  assert moved > 1e-3  # several lr-sized steps were taken
  for step, ((theta_u, engine_u), (theta_p, engine_p)) in enumerate(
    zip(uaq_syncs, syncs)
  ):
    unfolded = quant.unfold_uaq(_model().config, theta_u, scale=S)
    # The policy: θ of the UAQ run, unfolded, is the plain run's θ, to
    # float tolerance: a thousandth of one Adam step (lr) per step taken.
    # The two runs round their forward and backward passes differently, and
    # Adam's m̂/(√v̂ + ε) turns a gradient entry near 0, where that rounding
    # is a large relative error, into a visible (still tiny) step.
    tol = 1e-3 * cfg.optim.learning_rate * max(step, 1)
    worst = 0.0
    for path, a, b in zip(
      jax.tree_util.tree_leaves_with_path(unfolded),
      jax.tree.leaves(unfolded),
      jax.tree.leaves(theta_p),
    ):
      np.testing.assert_allclose(
        a,
        b,
        rtol=1e-5,
        atol=tol,
        err_msg=f"sync {step} {jax.tree_util.keystr(path[0])}",
      )
      worst = max(worst, float(np.max(np.abs(np.asarray(a) - b))))
    print(
      f"sync {step}: max |θ_UAQ unfolded − θ_per-tensor| = {worst:.1e} "
      f"({worst / cfg.optim.learning_rate:.1e} of one step)"
    )
    # The engine: the same INT8 codes, scales the plain run's / s on the
    # folded kernels (Q(W/s) = Q(W)/s), the same elsewhere.
    ku, kp = _engine_kernels(engine_u), _engine_kernels(engine_p)
    assert ku.keys() == kp.keys() and ku
    folded = {f"{m}/{leaf}" for (m, leaf) in quant.uaq.uaq_powers()}
    for name in ku:
      codes_u, codes_p = np.asarray(ku[name].value), np.asarray(kp[name].value)
      flipped = codes_u != codes_p
      # A code on a rounding boundary may flip by one under float rounding.
      assert flipped.mean() <= 2e-3, (step, name, flipped.mean())
      assert np.all(np.abs(codes_u.astype(int) - codes_p)[flipped] == 1)
      ratio = S if name in folded else 1.0
      np.testing.assert_allclose(
        np.asarray(ku[name].scale) * ratio,
        np.asarray(kp[name].scale),
        rtol=1e-4,
        err_msg=f"sync {step} {name} scale",
      )
  # The rollouts those engines sampled: the same tokens, the same rewards.
  for key in ("reward_mean", "response_length_mean"):
    assert [r[key] for r in rows] == [r[key] for r in uaq_rows], key


def test_a_binding_clip_breaks_the_equivalence_unless_it_sees_the_fold(
  tmp_path, monkeypatch
):
  """max_grad_norm 1e-3 binds on every update. The fold rescales the
  gradient the clip measures (×s^(−k) per leaf), so the plain run with the
  per-tensor learning rates is clipped by another factor than the UAQ run
  and moves elsewhere; clipping g·s^(−k) instead gives the UAQ run's θ."""
  mcfg = _model().config
  mp = pytest.MonkeyPatch()
  # Two steps: a third step's rollout can already sample another token in
  # one run (θ then differs by float rounding, and a clip of 1e-3 leaves
  # steps of that size), after which the runs train on different data.
  lr, steps = 3e-3, 2
  uaq, uaq_rows = _run(mp, _config(tmp_path, "uaq_clip", S, 1e-3, steps))
  plain, _ = _run(
    monkeypatch,
    _config(tmp_path, "plain_clip", 1.0, 1e-3, steps),
    lambda o, p: _per_tensor(o, p, S),
  )
  folded_metric, rows = _run(
    monkeypatch,
    _config(tmp_path, "folded_clip", 1.0, 1e-3, steps),
    lambda o, p: _per_tensor(o, p, S, clip_in_folded_metric=True),
  )
  for key in ("reward_mean", "response_length_mean"):
    assert [r[key] for r in rows] == [r[key] for r in uaq_rows], key
  want = [quant.unfold_uaq(mcfg, theta, scale=S) for theta, _ in uaq]
  assert _max_diff(want[1], want[0]) > 1e-3  # the clipped run moved
  tol = [1e-3 * lr * max(step, 1) for step in range(steps + 1)]
  for step, ((theta, _), w) in enumerate(zip(folded_metric, want)):
    assert _max_diff(theta, w) <= tol[step], step
  # The plain clip: another factor, another θ, far outside float tolerance.
  assert _max_diff(plain[-1][0], want[-1]) > 50 * tol[-1]
