"""Mixed precision (docs/precision.md): master weights in
`model.param_dtype`, forward passes in `model.compute_dtype`, log-probs and
the loss in float32, the default float32 program unchanged."""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxpr_util
from parallel import trainer_problem
from rljax import models
from rljax import quant
from rljax.core import objectives
from rljax.train import loop as loop_lib
from rljax.train import optim as optim_lib
from rljax.train import placement as placement_lib
from rljax.train import update as update_lib
from rljax.train.config import ConfigError, TrainConfig

B, T, PROMPT = 4, 12, 4
# float32 dots of RMSNorm's sums of squares in an update step's jaxpr: a
# forward and a backward dot for each of the layer body's two norms and
# for the final norm.
_NORM_DOTS = 6


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


def _dot_kinds(jaxpr):
  """(lhs dtype, rhs dtype) of every dot_general, nested jaxprs included."""
  return [
    tuple(str(a.dtype) for a in ops) for ops in jaxpr_util.dot_operands(jaxpr)
  ]


def spec_of(config, compute_dtype, full=False):
  """The update's loss; `full` adds KL, entropy and two micro-batches (for
  the traced-program comparison, which does not compile)."""
  loss = objectives.PolicyLossConfig(surrogate="ppo", correction="acr")
  return update_lib.UpdateSpec(
    model_config=config,
    loss=loss,
    kl_coef=0.05 if full else 0.0,
    entropy_coef=0.01 if full else 0.0,
    micro_batches=2 if full else 1,
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
      step = update_lib.make_update_step(spec_of(config, dtype, True), opt)
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

  def test_mixed_bfloat16_runs_every_projection_as_a_bf16_dot(self, tiny):
    # CPU mixed precision (activation_dtype float32 under bf16 compute):
    # the forward and both backward dots of every linear layer and of the
    # LM head take bf16 operands; attention scores stay float32.
    config, params = tiny
    batch = make_batch(config)
    opt = optax.adam(1e-3)
    spec = dataclasses.replace(
      spec_of(config, "bfloat16"), activation_dtype="float32"
    )
    step = update_lib.make_update_step(spec, opt, donate=False)
    state = update_lib.init_train_state(params, opt)
    jaxpr = jax.make_jaxpr(step)(state, batch).jaxpr
    kinds = collections.Counter(_dot_kinds(jaxpr))
    # The layer loop's body is traced once: 7 projections and the head,
    # 3 dots each (y, dx, dw); the float32 ones are attention's 2 + 4 and
    # RMSNorm's sums of squares (`layers.rms_norm`), a forward and a
    # backward dot for each of the layer's two norms and the final one.
    assert kinds == {
      ("bfloat16", "bfloat16"): 24,
      ("float32", "float32"): 6 + _NORM_DOTS,
    }
    state, metrics = step(state, batch)
    f32_step = update_lib.make_update_step(
      spec_of(config, "float32"), opt, donate=False
    )
    _, f32 = f32_step(update_lib.init_train_state(params, opt), batch)
    # Only the dot operands are rounded: closer to float32 than the
    # all-bf16 path's 5% (test above).
    np.testing.assert_allclose(metrics["loss"], f32["loss"], rtol=0.02)
    assert metrics["applied"] == 1.0

  def test_scanned_decoder_recomputes_no_bf16_projection(self):
    # Past 4 layers the layer loop is a scan under `decoder.SCAN_SAVES`,
    # which recomputes what it does not save. The projections' bf16 dots
    # (a custom VJP) must stay saved: the same 24 bf16 dots as above. Only
    # float32 attention scores are recomputed, one more dot.
    config = models.tiny_config(num_layers=5)
    params = models.init_params(config, jax.random.PRNGKey(0))
    spec = dataclasses.replace(
      spec_of(config, "bfloat16"), activation_dtype="float32"
    )
    opt = optax.adam(1e-3)
    step = update_lib.make_update_step(spec, opt, donate=False)
    state = update_lib.init_train_state(params, opt)
    jaxpr = jax.make_jaxpr(step)(state, make_batch(config)).jaxpr
    kinds = collections.Counter(_dot_kinds(jaxpr))
    assert kinds == {
      ("bfloat16", "bfloat16"): 24,
      ("float32", "float32"): 7 + _NORM_DOTS,
    }

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
    shapes = [
      v.aval.shape
      for eqn in jaxpr_util.equations(jax.make_jaxpr(grad)(bf16).jaxpr)
      for v in eqn.outvars
    ]
    vocab_wide = [s for s in shapes if s and s[-1] == config.vocab_size]
    assert vocab_wide  # the head is in there...
    assert max(int(np.prod(s[:-1])) for s in vocab_wide) <= max(
      B * chunk, config.hidden_size
    )  # ...one chunk (or the [D, V] kernel) at a time


def small_config(run_dir, **model):
  """The mesh tests' GRPO problem (KL to the reference, two epochs: the
  reference and proximal passes run) on one device."""
  cfg = trainer_problem.config(run_dir, "1,1,1")
  model = {"compute_dtype": "auto", **model}  # the default, not the pin
  return cfg.replace({f"model.{k}": v for k, v in model.items()})


def make_trainer(cfg):
  # The tiny decoder over the character tokenizer: seconds cheaper than the
  # 49k-token SmolLM2 vocabulary, and dtypes are what is checked here.
  return loop_lib.Trainer(
    cfg,
    model=trainer_problem.tiny_model(cfg.run.seed),
    task=trainer_problem.digit_task(cfg),
    show_progress=False,
  )


def _host_flags(monkeypatch, *flags):
  info = quant.cpu.CpuInfo(model="test CPU", flags=tuple(flags))
  monkeypatch.setattr(quant.cpu, "host_cpu", lambda: info)


class TestTrainerPrecision:
  def test_auto_on_a_cpu_without_bf16_dot_units_is_float32(
    self, tmp_path, monkeypatch
  ):
    _host_flags(monkeypatch, "avx512f", "avx512_vnni")
    cfg = small_config(tmp_path)
    assert (cfg.model.param_dtype, cfg.model.compute_dtype) == (
      "float32",
      "auto",
    )
    assert placement_lib.compute_dtype(cfg) == "float32"
    assert placement_lib.activation_dtype(cfg) is None

  @pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
  def test_auto_on_a_cpu_with_bf16_dot_units_is_mixed_bfloat16(
    self, tmp_path, monkeypatch, flag
  ):
    # bf16 weights, float32 activations: bf16 x bf16 -> f32 dots only.
    _host_flags(monkeypatch, "avx512f", flag)
    cfg = small_config(tmp_path)
    assert placement_lib.compute_dtype(cfg) == "bfloat16"
    assert placement_lib.activation_dtype(cfg) == "float32"
    cfg = small_config(tmp_path, compute_dtype="float32")
    assert placement_lib.compute_dtype(cfg) == "float32"
    assert placement_lib.activation_dtype(cfg) is None

  def test_auto_is_bfloat16_on_accelerators(self, tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert placement_lib.compute_dtype(small_config(tmp_path)) == "bfloat16"
    # bf16 activations throughout: the tensor-core path.
    assert placement_lib.activation_dtype(small_config(tmp_path)) is None
    cfg = small_config(tmp_path, compute_dtype="float32")
    assert placement_lib.compute_dtype(cfg) == "float32"

  def test_bad_dtype_is_named(self, tmp_path):
    with pytest.raises(ConfigError, match=r"model.compute_dtype='fp16'"):
      small_config(tmp_path, compute_dtype="fp16")
    with pytest.raises(ConfigError, match=r"model.param_dtype='int8'"):
      TrainConfig().replace({"model.param_dtype": "int8"})

  def test_bfloat16_compute_trainer_step(self, tmp_path):
    # One step; its loss against float32's is TestUpdateStepPrecision's.
    t = make_trainer(small_config(tmp_path, compute_dtype="bfloat16"))
    try:
      t.actor.sync(*t._theta())
      row = t.train_step()
    finally:
      t.close()
    assert t.spec.compute_dtype == "bfloat16"
    assert t.spec.activation_dtype == "float32"  # CPU: mixed bf16 dots
    assert float_dtypes(t.state.params) == {np.dtype("float32")}
    assert float_dtypes(t.state.opt_state) == {np.dtype("float32")}
    assert float_dtypes(t.ref_params) == {np.dtype(jnp.bfloat16)}
    assert np.isfinite(row["loss"]) and row["applied"] == 1.0
    # The mean over both epochs' updates: θ moved by one Adam step of
    # lr 1e-3 at most, plus bf16 rounding.
    assert 0.0 <= row["kl_to_ref"] < 0.01

  def test_bfloat16_params(self, tmp_path):
    # Construction only: the bf16 update itself is TestUpdateStepPrecision's.
    t = make_trainer(small_config(tmp_path, param_dtype="bfloat16"))
    t.close()
    assert float_dtypes(t.state.params) == {np.dtype(jnp.bfloat16)}
    moments = [x for x in jax.tree.leaves(t.state.opt_state) if x.ndim >= 2]
    assert moments and {x.dtype for x in moments} == {np.dtype(jnp.bfloat16)}
    assert t.spec.compute_dtype == placement_lib.compute_dtype(t.cfg)


class TestReferenceArm:
  """`rollout.quant=none` under bf16 compute is a reference: the sampler runs
  the function the trainer's proximal pass runs, after every sync. Sampling
  the float32 weights instead let updates below a bf16 ulp reach the sampler
  but not the bf16 proximal pass: SmolLM2's behav_prox_kl went 1e-4 -> 1e-2
  in 3 steps (recorded 2026-11-27, commit 5f0f3b3)."""

  def test_none_samples_the_compute_dtype_weights(self, tmp_path):
    from rljax.train import actor as actor_lib

    cfg = small_config(tmp_path, compute_dtype="bfloat16")
    cfg = cfg.replace({"rollout.quant": "none"})
    assert actor_lib.rollout_mode(cfg) == "bf16"
    assert (
      actor_lib.rollout_mode(cfg.replace({"model.compute_dtype": "float32"}))
      == "none"
    )
    assert actor_lib.rollout_mode(cfg.replace({"rollout.quant": "int8"})) == (
      "int8"
    )

  def test_behaviour_equals_proximal_after_each_sync(self, tmp_path):
    # Two PPO epochs: the proximal log-probs come from the trainer's own
    # pass over θ_old, not from the update step's first forward.
    cfg = small_config(tmp_path, compute_dtype="bfloat16")
    cfg = cfg.replace({"rollout.quant": "none", "kl.coef": 0.0})
    t = make_trainer(cfg)
    rows = []
    try:
      t.actor.sync(*t._theta())
      for _ in range(3):
        rows.append(t.train_step())  # each step ends with a sync
    finally:
      t.close()
    for i, row in enumerate(rows):
      assert row["applied"] == 1.0
      # A reference arm's behaviour is its proximal policy: KL below 1e-3,
      # and ρ = π_prox/π_behav is 1 up to float32 accumulation order (a
      # float32 sampler gave max ρ 1.0015-1.0025 from step 2 on, a bf16
      # weight rounding; recorded 2026-11-27, commit 5f0f3b3).
      assert row["behav_prox_kl"] < 1e-3, (i, row["behav_prox_kl"])
      assert abs(row["max_prox_behav_ratio"] - 1.0) < 2e-4, (i, row)
