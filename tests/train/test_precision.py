"""Mixed precision (issue 14, docs/precision.md): master weights in
`model.param_dtype`, forward passes in `model.compute_dtype`, log-probs and
the loss in float32, the default float32 program unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax import data as data_lib
from rljax import models
from rljax import quant
from rljax.core import objectives
from rljax.train import loop as loop_lib
from rljax.train import optim as optim_lib
from rljax.train import placement as placement_lib
from rljax.train import testing
from rljax.train import update as update_lib
from rljax.train.config import ConfigError, TrainConfig, apply_preset
from rljax.train.tasks import Task

B, T, PROMPT = 4, 12, 4


@pytest.fixture(scope="module")
def tiny():
  config = models.tiny_config()
  params = models.init_params(config, jax.random.PRNGKey(0))
  return config, params


def make_batch(config, seed=1):
  k = jax.random.split(jax.random.PRNGKey(seed), 4)
  tokens = jax.random.randint(k[0], (B, T), 0, config.vocab_size)
  mask = np.zeros((B, T - 1), np.float32)
  mask[:, PROMPT:] = 1.0
  logp = -jnp.abs(jax.random.normal(k[1], (B, T - 1))) - 0.5
  return dict(
    tokens=tokens,
    attention_mask=jnp.ones((B, T), jnp.int32),
    loss_mask=jnp.asarray(mask),
    prox_logp=logp,
    behav_logp=logp + 0.1 * jax.random.normal(k[2], logp.shape),
    advantages=jax.random.normal(k[3], (B, T - 1)) * mask,
    ref_logp=logp,
  )


def float_dtypes(tree):
  return {
    x.dtype
    for x in jax.tree.leaves(tree)
    if jnp.issubdtype(x.dtype, jnp.floating)
  }


def spec_of(config, compute_dtype):
  loss = objectives.PolicyLossConfig(surrogate="ppo", correction="acr")
  return update_lib.UpdateSpec(
    model_config=config,
    loss=loss,
    kl_coef=0.05,
    entropy_coef=0.01,
    micro_batches=2,
    compute_dtype=compute_dtype,
  )


class TestCastFloating:
  def test_casts_floats_keeps_ints_and_qtensors(self):
    q = quant.quantize_int8(jnp.ones((4, 4), jnp.float32), axis=0)
    tree = {
      "w": jnp.ones((2,), jnp.float32),
      "step": jnp.zeros((), jnp.int32),
      "q": q,
    }
    out = update_lib.cast_floating(tree, "bfloat16")
    assert out["w"].dtype == jnp.bfloat16
    assert out["step"].dtype == jnp.int32
    assert out["q"] is q  # codes and scales stay together, untouched

  def test_same_dtype_and_none_are_the_identity(self):
    x = jnp.ones((2,), jnp.float32)
    assert update_lib.cast_floating({"x": x}, "float32")["x"] is x
    assert update_lib.cast_floating({"x": x}, None)["x"] is x


class TestUpdateStepPrecision:
  def test_float32_compute_traces_the_same_program(self, tiny):
    # The default CPU job is bit-identical to the code before compute_dtype:
    # an explicit float32 compute dtype traces the very same jaxpr.
    config, params = tiny
    batch = make_batch(config)
    opt = optax.adam(1e-3)
    state = update_lib.init_train_state(params, opt)
    texts = []
    for dtype in (None, "float32"):
      step = update_lib.make_update_step(spec_of(config, dtype), opt)
      texts.append(str(jax.make_jaxpr(step)(state, batch)))
    assert texts[0] == texts[1]

  def test_bfloat16_compute_keeps_float32_master_and_moments(self, tiny):
    config, params = tiny
    batch = make_batch(config)
    opt = optax.adam(1e-3)
    out = {}
    for dtype in ("float32", "bfloat16"):
      step = update_lib.make_update_step(
        spec_of(config, dtype), opt, donate=False
      )
      state = update_lib.init_train_state(params, opt)
      out[dtype] = step(state, batch)
    state, metrics = out["bfloat16"]
    for leaf in jax.tree.leaves((state.params, state.opt_state)):
      if jnp.issubdtype(leaf.dtype, jnp.floating):
        assert leaf.dtype == jnp.float32
    assert metrics["loss"].dtype == jnp.float32
    assert metrics["applied"] == 1.0
    f32 = out["float32"][1]
    # bf16 activations: ~3 significant digits on loss and gradient norm.
    np.testing.assert_allclose(metrics["loss"], f32["loss"], rtol=0.05)
    np.testing.assert_allclose(metrics["grad_norm"], f32["grad_norm"], rtol=0.1)
    assert metrics["loss"] != f32["loss"]  # really ran in bf16

  def test_bfloat16_params_step_with_the_trainers_optimizer(self, tiny):
    # optim.make_optimizer injects float32 hyperparameters: in the params'
    # bfloat16, b2 = 0.999 rounds to 1 and every update was NaN.
    config, params = tiny
    bf16 = update_lib.cast_floating(params, "bfloat16")
    opt = optim_lib.make_optimizer(TrainConfig().optim_config())
    step = update_lib.make_update_step(spec_of(config, None), opt, donate=False)
    state, metrics = step(
      update_lib.init_train_state(bf16, opt), make_batch(config)
    )
    assert metrics["applied"] == 1.0
    # Params and Adam's moments stay bfloat16 (the jitted step and the
    # checkpoints see one tree from step to step).
    assert float_dtypes(state.params) == {np.dtype(jnp.bfloat16)}
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim >= 2]
    assert {x.dtype for x in moments} == {np.dtype(jnp.bfloat16)}
    moved = jax.tree.map(lambda a, b: jnp.any(a != b), state.params, bf16)
    assert any(jax.tree.leaves(moved))

  def test_chunked_logprobs_float32_without_full_float32_logits(self, tiny):
    config, params = tiny
    bf16 = update_lib.cast_floating(params, "bfloat16")
    tokens = make_batch(config)["tokens"]
    chunk = 4

    def f(p):
      return models.token_logprobs(config, p, tokens, chunk_size=chunk)

    logp, entropy = f(bf16)
    assert logp.dtype == entropy.dtype == jnp.float32
    ref, _ = f(params)
    np.testing.assert_allclose(logp, ref, atol=0.05)
    # No [B, T-1, V] array anywhere in the program (forward and backward):
    # a vocabulary-wide array has at most `chunk` positions.
    grad = jax.grad(lambda p: f(p)[0].sum())
    shapes = []

    def walk(jaxpr):
      for eqn in jaxpr.eqns:
        shapes.extend(v.aval.shape for v in eqn.outvars)
        for sub in jax.core.jaxprs_in_params(eqn.params):
          walk(sub)

    walk(jax.make_jaxpr(grad)(bf16).jaxpr)
    vocab_wide = [s for s in shapes if s and s[-1] == config.vocab_size]
    assert vocab_wide  # the head is in there...
    assert max(int(np.prod(s[:-1])) for s in vocab_wide) <= max(
      B * chunk, config.hidden_size
    )  # ...one chunk (or the [D, V] kernel) at a time


class LetterTask(Task):
  def score(self, completions, examples, n):
    scores = np.array(
      [c.count("e") / max(len(c), 1) for c in completions], np.float32
    )
    return scores, {"e_share": scores}


def small_config(run_dir, **model):
  cfg = apply_preset(
    "grpo",
    model="tiny",
    steps=1,
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=6,
    eval_size=0,
    reward_workers=0,
    run_dir=str(run_dir),
    checkpoint_every=100,
    tensorboard=False,
    learning_rate=1e-3,
    export_hf=False,
    kl_coef=0.05,
    ppo_epochs=2,  # the proximal pass runs
  )
  return cfg.replace({f"model.{k}": v for k, v in model.items()})


def make_trainer(cfg):
  tokenizer = testing.tiny_tokenizer()
  examples = data_lib.generate_arithmetic(16, "easy", seed=cfg.run.seed)
  task = LetterTask(
    examples[8:],
    examples[:8],
    tokenizer,
    data_lib.ChatTemplate(tokenizer),
    cfg.rollout.prompts_per_step,
    cfg.run.seed,
    cfg.task.max_prompt_tokens,
    reward_workers=0,
  )
  return loop_lib.Trainer(cfg, task=task, show_progress=False)


def one_step(cfg):
  t = make_trainer(cfg)
  try:
    t.actor.sync(*t._theta())
    return t.train_step(), t
  finally:
    t.close()


class TestTrainerPrecision:
  def test_default_is_float32_on_cpu(self, tmp_path):
    cfg = small_config(tmp_path)
    assert (cfg.model.param_dtype, cfg.model.compute_dtype) == (
      "float32",
      "auto",
    )
    assert placement_lib.compute_dtype(cfg) == "float32"

  def test_auto_is_bfloat16_on_accelerators(self, tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert placement_lib.compute_dtype(small_config(tmp_path)) == "bfloat16"
    cfg = small_config(tmp_path, compute_dtype="float32")
    assert placement_lib.compute_dtype(cfg) == "float32"

  def test_bad_dtype_is_named(self, tmp_path):
    with pytest.raises(ConfigError, match=r"model.compute_dtype='fp16'"):
      small_config(tmp_path, compute_dtype="fp16")
    with pytest.raises(ConfigError, match=r"model.param_dtype='int8'"):
      TrainConfig().replace({"model.param_dtype": "int8"})

  def test_bfloat16_compute_step_near_float32_step(self, tmp_path):
    row32, _ = one_step(small_config(tmp_path / "f32"))
    row16, t = one_step(
      small_config(tmp_path / "bf16", compute_dtype="bfloat16")
    )
    assert t.spec.compute_dtype == "bfloat16"
    assert float_dtypes(t.state.params) == {np.dtype("float32")}
    assert float_dtypes(t.state.opt_state) == {np.dtype("float32")}
    assert float_dtypes(t.ref_params) == {np.dtype(jnp.bfloat16)}
    # Same rollouts (the actor runs the master weights): only the
    # reference, proximal and update passes changed precision.
    assert row16["reward_mean"] == row32["reward_mean"]
    assert np.isfinite(row16["loss"]) and row16["applied"] == 1.0
    np.testing.assert_allclose(
      row16["loss"], row32["loss"], rtol=0.1, atol=1e-3
    )
    np.testing.assert_allclose(
      row16["kl_to_ref"], row32["kl_to_ref"], atol=1e-3
    )

  def test_bfloat16_params(self, tmp_path):
    # Construction only: the bfloat16 update itself is
    # TestUpdateStepPrecision.test_bfloat16_params_step_with_the_trainers_...
    t = make_trainer(small_config(tmp_path, param_dtype="bfloat16"))
    t.close()
    assert float_dtypes(t.state.params) == {np.dtype(jnp.bfloat16)}
    moments = [x for x in jax.tree.leaves(t.state.opt_state) if x.ndim >= 2]
    assert moments and {x.dtype for x in moments} == {np.dtype(jnp.bfloat16)}
    assert t.spec.compute_dtype == "float32"  # auto, on CPU
