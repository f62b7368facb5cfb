"""The jitted update step: micro-batch exactness, NaN safety, critic."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax import models
from rljax.core import aggregation as agg_lib
from rljax.core import kl as kl_lib
from rljax.core import objectives
from rljax.core.aggregation import AGGREGATION_MODES
from rljax.train import optim as optim_lib
from rljax.train import update as update_lib

B, T, PROMPT = 8, 20, 6


@pytest.fixture(scope="module")
def tiny():
  config = models.tiny_config()
  params = models.init_params(config, jax.random.PRNGKey(0))
  return config, params


@pytest.fixture(scope="module")
def shallow():
  """One layer, for the tests that run the step eagerly: they check the
  loss's algebra (corrections, aggregation, micro-batches, the response
  columns), and an eager pass costs in proportion to the model's depth."""
  config = models.tiny_config(num_layers=1)
  return config, models.init_params(config, jax.random.PRNGKey(0))


def make_batch(config, seed=1, uneven=True):
  k = jax.random.split(jax.random.PRNGKey(seed), 4)
  tokens = jax.random.randint(k[0], (B, T), 0, config.vocab_size)
  mask = np.zeros((B, T - 1), np.float32)
  for b in range(B):  # uneven response lengths make seq-mean ≠ token-mean
    mask[b, PROMPT : PROMPT + (3 + 2 * b if uneven else 8)] = 1.0
  mask = jnp.asarray(mask)
  logp = -jnp.abs(jax.random.normal(k[1], (B, T - 1))) - 0.5
  return dict(
    tokens=tokens,
    attention_mask=jnp.ones((B, T), jnp.int32),
    loss_mask=mask,
    prox_logp=logp,
    behav_logp=logp + 0.2 * jax.random.normal(k[2], logp.shape),
    advantages=jax.random.normal(k[3], (B, T - 1)) * mask,
  )


def run_sgd(config, params, batch, aggregation, micro):
  loss = objectives.PolicyLossConfig(
    surrogate="ppo", correction="acr", aggregation=aggregation, norm_const=16.0
  )
  spec = update_lib.UpdateSpec(
    model_config=config, loss=loss, micro_batches=micro
  )
  opt = optax.sgd(1.0)
  fn = update_lib.make_update_step(spec, opt, donate=False)
  state = update_lib.init_train_state(params, opt)
  new_state, metrics = fn(state, batch)
  grads = jax.tree.map(lambda a, b: a - b, params, new_state.params)  # lr = 1
  return grads, metrics


class TestMicroBatchAccumulation:
  # Every mode's (sum, denominator) algebra is property-tested in
  # tests/core; here two modes check the wiring through the model.
  @pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
  def test_accumulated_gradient_equals_full_batch(self, tiny, aggregation):
    config, params = tiny
    batch = make_batch(config)
    g_full, m_full = run_sgd(config, params, batch, aggregation, 1)
    g_micro, m_micro = run_sgd(config, params, batch, aggregation, 4)
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_micro)):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(m_full["loss"], m_micro["loss"], rtol=1e-5)
    np.testing.assert_allclose(
      m_full["clip_fraction"], m_micro["clip_fraction"], rtol=1e-5
    )

  def test_gradient_matches_direct_autodiff(self, tiny):
    """The step's gradient is ∇ of policy_loss(token_logprobs(θ)) itself."""
    config, params = tiny
    batch = make_batch(config)
    loss_cfg = objectives.PolicyLossConfig(
      surrogate="ppo", correction="tis", aggregation="seq-mean-token-mean"
    )

    def direct(p):
      logp, _ = models.token_logprobs(
        config, p, batch["tokens"], attention_mask=batch["attention_mask"]
      )
      loss, _ = objectives.policy_loss(
        logp,
        batch["prox_logp"],
        batch["behav_logp"],
        batch["advantages"],
        batch["loss_mask"],
        loss_cfg,
      )
      return loss

    g_direct = jax.grad(direct)(params)
    spec = update_lib.UpdateSpec(
      model_config=config, loss=loss_cfg, micro_batches=2
    )
    opt = optax.sgd(1.0)
    state = update_lib.init_train_state(params, opt)
    new_state, _ = update_lib.make_update_step(spec, opt, donate=False)(
      state, batch
    )
    g_step = jax.tree.map(lambda a, b: a - b, params, new_state.params)
    for a, b in zip(jax.tree.leaves(g_direct), jax.tree.leaves(g_step)):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)


# Caps that leave a sizeable share of tokens / sequences on both sides of the
# rejection threshold on `off_policy_batch` (ρ per token ~ e^N(0.5, 1)).
CAPS = {"seq_tis": 20.0, "seq_mis": 20.0, "geo_rs": 1.8}


# Every correction runs under token-mean; the other aggregations, whose
# micro-batch normalizers are what differs, run with one correction of each
# kind the step weights a token by: a per-token weight (tis), a per-token
# rejection (mis), a per-sequence weight (seq_tis) and a per-sequence
# rejection (seq_mis). The full cross product (40 eager steps) cost ~110 s of
# a 2-core CI for no extra code path.
CROSS_CHECKED = ("tis", "mis", "seq_tis", "seq_mis")


def correction_configs(aggregation):
  everything = aggregation == "token-mean"
  for correction in objectives.CORRECTIONS:
    if not everything and correction not in CROSS_CHECKED:
      continue
    yield objectives.PolicyLossConfig(
      surrogate="ppo",
      correction=correction,
      aggregation=aggregation,
      tis_cap=CAPS.get(correction, 2.0),
      norm_const=16.0,
    )
  if not everything:
    return
  yield objectives.PolicyLossConfig(
    surrogate="ppo",
    correction="tis",
    aggregation=aggregation,
    veto_threshold=0.3,
    norm_const=16.0,
  )


def off_policy_batch(config, seed=2):
  """make_batch with a trainer/engine mismatch large enough that mis drops
  ~40% of the tokens (log ρ ~ N(0.5, 1), C = 2)."""
  batch = make_batch(config, seed)
  noise = 0.5 + jax.random.normal(
    jax.random.PRNGKey(seed + 100), batch["prox_logp"].shape
  )
  batch["behav_logp"] = batch["prox_logp"] - noise
  return batch


def step_grads(config, params, batch, loss_cfg, micro, **spec_kw):
  spec = update_lib.UpdateSpec(
    model_config=config, loss=loss_cfg, micro_batches=micro, **spec_kw
  )
  opt = optax.sgd(1.0)
  state = update_lib.init_train_state(params, opt)
  new_state, metrics = update_lib.make_update_step(spec, opt, donate=False)(
    state, batch
  )
  grads = jax.tree.map(lambda a, b: a - b, params, new_state.params)  # lr = 1
  return grads, metrics


class TestStepEqualsKernel:
  """The update step's loss and gradient are those of
  `objectives.policy_loss` on the whole minibatch, for every correction and
  aggregation mode, micro-batched. The reference is computed independently:
  the kernel's gradient w.r.t. log-probs, pulled back through the model's
  VJP, on the full batch at once."""

  @pytest.fixture(scope="class")
  def reference(self, shallow):
    config, params = shallow
    batch = off_policy_batch(config)
    logp_fn = lambda p: models.token_logprobs(
      config, p, batch["tokens"], attention_mask=batch["attention_mask"]
    )[0]
    logp, vjp = jax.vjp(logp_fn, params)
    return batch, logp, jax.jit(lambda ct: vjp(ct)[0])

  @pytest.mark.parametrize("aggregation", AGGREGATION_MODES)
  def test_every_correction(self, shallow, reference, aggregation):
    config, params = shallow
    batch, logp, pullback = reference
    # Eager (the same Python code the jitted step traces): 22 configurations
    # compile in minutes on a small CPU, run eagerly in seconds. Two jitted
    # cases follow below. Two micro-batches of unequal token counts (24 and
    # 56 here) test the accumulation as well as four do, at half the eager
    # passes through the model.
    with jax.disable_jit():
      for loss_cfg in correction_configs(aggregation):
        loss, g_logp = jax.value_and_grad(
          lambda lp: objectives.policy_loss(
            lp,
            batch["prox_logp"],
            batch["behav_logp"],
            batch["advantages"],
            batch["loss_mask"],
            loss_cfg,
          )[0]
        )(logp)
        g_ref = pullback(g_logp)
        g_step, metrics = step_grads(config, params, batch, loss_cfg, micro=2)
        msg = (
          f"{loss_cfg.correction} veto={loss_cfg.veto_threshold} {aggregation}"
        )
        np.testing.assert_allclose(
          metrics["loss"], loss, rtol=2e-5, atol=1e-7, err_msg=msg
        )
        for a, b in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g_step)):
          np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6, err_msg=msg)

  def test_rejections_are_substantial(self, reference):
    """The batch really exercises rejection (else the test above is vacuous)."""
    batch, _, _ = reference
    for loss_cfg in correction_configs("token-mean"):
      if loss_cfg.rejects:
        keep = objectives.policy_loss_keep(
          batch["prox_logp"], batch["behav_logp"], batch["loss_mask"], loss_cfg
        )
        kept = float(keep.sum() / batch["loss_mask"].sum())
        assert 0.2 < kept < 0.8, (loss_cfg.correction, kept)

  @pytest.mark.parametrize(
    "correction,aggregation",
    [("mis", "token-mean"), ("seq_mis", "seq-mean-token-mean")],
  )
  def test_jitted_mis_step_matches_hand_computed_kernel(
    self, shallow, reference, correction, aggregation
  ):
    config, params = shallow
    batch, logp, pullback = reference
    loss_cfg = objectives.PolicyLossConfig(
      correction=correction,
      aggregation=aggregation,
      tis_cap=CAPS.get(correction, 2.0),
    )
    loss, g_logp = jax.value_and_grad(
      lambda lp: objectives.policy_loss(
        lp,
        batch["prox_logp"],
        batch["behav_logp"],
        batch["advantages"],
        batch["loss_mask"],
        loss_cfg,
      )[0]
    )(logp)
    g_step, metrics = step_grads(config, params, batch, loss_cfg, micro=2)
    np.testing.assert_allclose(metrics["loss"], loss, rtol=2e-5)
    for a, b in zip(jax.tree.leaves(pullback(g_logp)), jax.tree.leaves(g_step)):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)

  def test_prox_is_current_with_mis(self, tiny):
    """One epoch, one minibatch: θ_prox = θ, so ρ = π_θ/π_behav and the keep
    mask needs log π_θ; the step must still match the kernel."""
    config, params = tiny
    batch = make_batch(config, seed=3)
    logp_fn = lambda p: models.token_logprobs(
      config, p, batch["tokens"], attention_mask=batch["attention_mask"]
    )[0]
    logp, vjp = jax.vjp(logp_fn, params)
    noise = 0.5 + jax.random.normal(jax.random.PRNGKey(7), logp.shape)
    batch["behav_logp"] = logp - noise
    batch["prox_logp"] = batch["behav_logp"]  # what the trainer passes: unused
    loss_cfg = objectives.PolicyLossConfig(
      correction="mis", tis_cap=2.0, aggregation="token-mean"
    )
    loss, g_logp = jax.value_and_grad(
      lambda lp: objectives.policy_loss(
        lp,
        jax.lax.stop_gradient(lp),
        batch["behav_logp"],
        batch["advantages"],
        batch["loss_mask"],
        loss_cfg,
      )[0]
    )(logp)
    g_step, metrics = step_grads(
      config, params, batch, loss_cfg, micro=2, prox_is_current=True
    )
    np.testing.assert_allclose(metrics["loss"], loss, rtol=2e-5)
    for a, b in zip(jax.tree.leaves(vjp(g_logp)[0]), jax.tree.leaves(g_step)):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)

  def test_kl_and_entropy_terms_are_the_core_kernels(self, tiny):
    """L = policy_loss + β·kl_loss(k) − β_H·aggregate(entropy), and garbage
    reference log-probs at padding (cleaned by kl_loss_terms) change nothing."""
    config, params = tiny
    batch = off_policy_batch(config, seed=4)
    ref = batch["prox_logp"] - 0.3 * jax.random.normal(
      jax.random.PRNGKey(5), batch["prox_logp"].shape
    )
    batch["ref_logp"] = jnp.where(batch["loss_mask"] > 0, ref, jnp.nan)
    loss_cfg = objectives.PolicyLossConfig(
      correction="mis", tis_cap=2.0, aggregation="seq-mean-token-mean"
    )

    def direct(p):
      logp, ent = models.token_logprobs(
        config, p, batch["tokens"], attention_mask=batch["attention_mask"]
      )
      pg, _ = objectives.policy_loss(
        logp,
        batch["prox_logp"],
        batch["behav_logp"],
        batch["advantages"],
        batch["loss_mask"],
        loss_cfg,
      )
      kl = kl_lib.kl_loss(
        logp,
        jnp.where(batch["loss_mask"] > 0, ref, 0.0),
        batch["loss_mask"],
        "k2",
        "seq-mean-token-mean",
      )
      h = agg_lib.aggregate_mean(ent, batch["loss_mask"], "seq-mean-token-mean")
      return pg + 0.1 * kl - 0.01 * h

    loss, g_direct = jax.value_and_grad(direct)(params)
    g_step, metrics = step_grads(
      config,
      params,
      batch,
      loss_cfg,
      micro=4,
      kl_coef=0.1,
      kl_estimator="k2",
      entropy_coef=0.01,
    )
    np.testing.assert_allclose(metrics["loss"], loss, rtol=2e-5)
    assert np.isfinite(float(metrics["kl_to_ref"]))
    for a, b in zip(jax.tree.leaves(g_direct), jax.tree.leaves(g_step)):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)


class TestResponseLen:
  """UpdateSpec.response_len: the head runs on the response columns only
  (`token_logprobs(start=...)`); the loss masks the prompt, so the step is
  the same."""

  RESPONSE = T - 1 - PROMPT  # make_batch's mask starts at column PROMPT

  def test_logprob_start(self, tiny):
    config, _ = tiny
    spec = lambda n: update_lib.UpdateSpec(
      model_config=config, loss=objectives.PolicyLossConfig(), response_len=n
    )
    assert spec(None).logprob_start(T) == 0
    assert spec(self.RESPONSE).logprob_start(T) == PROMPT
    assert spec(T + 5).logprob_start(T) == 0  # longer than the batch: all

  @pytest.mark.parametrize(
    "correction, extra",
    [
      ("mis", {}),
      ("acr", {"prox_is_current": True}),
      (
        "tis",
        {"kl_coef": 0.1, "kl_estimator": "k3", "entropy_coef": 0.01},
      ),
    ],
  )
  def test_same_loss_gradient_and_metrics(self, shallow, correction, extra):
    config, params = shallow
    batch = off_policy_batch(config, seed=6)
    if "kl_coef" in extra:
      batch["ref_logp"] = batch["prox_logp"] - 0.1
    loss_cfg = objectives.PolicyLossConfig(
      correction=correction, tis_cap=2.0, aggregation="seq-mean-token-mean"
    )
    # Eager, as in test_every_correction (compiling 6 steps takes minutes);
    # token_logprobs(start=...) itself is checked jitted in its own tests.
    with jax.disable_jit():
      g_all, m_all = step_grads(config, params, batch, loss_cfg, 2, **extra)
      g_resp, m_resp = step_grads(
        config, params, batch, loss_cfg, 2, response_len=self.RESPONSE, **extra
      )
    assert set(m_all) == set(m_resp)
    for k in m_all:
      np.testing.assert_allclose(m_resp[k], m_all[k], rtol=2e-5, err_msg=k)
    for a, b in zip(jax.tree.leaves(g_all), jax.tree.leaves(g_resp)):
      np.testing.assert_allclose(b, a, rtol=2e-4, atol=1e-6)

  def test_one_column_too_few_changes_the_loss(self, shallow):
    # The check above can fail: a start one column late drops every
    # response's first token from the loss.
    config, params = shallow
    batch = off_policy_batch(config, seed=6)
    loss_cfg = objectives.PolicyLossConfig(correction="mis", tis_cap=2.0)
    with jax.disable_jit():
      _, m_all = step_grads(config, params, batch, loss_cfg, 2)
      _, m_short = step_grads(
        config, params, batch, loss_cfg, 2, response_len=self.RESPONSE - 1
      )
    assert abs(float(m_short["loss"]) - float(m_all["loss"])) > 1e-4


class TestNonFinite:
  def test_nan_advantage_leaves_params_untouched(self, tiny):
    config, params = tiny
    batch = make_batch(config)
    batch["advantages"] = batch["advantages"].at[0, PROMPT].set(jnp.nan)
    loss_cfg = objectives.PolicyLossConfig(surrogate="ppo", correction="acr")
    spec = update_lib.UpdateSpec(model_config=config, loss=loss_cfg)
    opt = optim_lib.make_optimizer(optim_lib.OptimConfig(1e-3, 10))
    state = update_lib.init_train_state(params, opt)
    new_state, metrics = update_lib.make_update_step(spec, opt, donate=False)(
      state, batch
    )
    assert not np.isfinite(float(metrics["loss"]))
    assert float(metrics["applied"]) == 0.0
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new_state.params)):
      np.testing.assert_array_equal(a, b)


class TestCritic:
  def test_value_loss_decreases_on_fixed_targets(self, tiny):
    config, params = tiny
    batch = make_batch(config)
    batch["returns"] = batch["loss_mask"] * 1.0
    critic = models.init_critic(config, params, jax.random.PRNGKey(3))
    values = models.value_forward(
      config, params, critic["head"], batch["tokens"], batch["attention_mask"]
    )
    batch["old_values"] = values[:, :-1]
    loss_cfg = objectives.PolicyLossConfig(surrogate="ppo", correction="acr")
    spec = update_lib.UpdateSpec(
      model_config=config, loss=loss_cfg, uses_critic=True, value_clip=10.0
    )
    opt = optim_lib.make_optimizer(optim_lib.OptimConfig(1e-4, 10))
    copt = optim_lib.make_optimizer(optim_lib.OptimConfig(3e-3, 10))
    state = update_lib.init_train_state(params, opt, critic, copt)
    fn = update_lib.make_update_step(spec, opt, copt, donate=False)
    losses = []
    for _ in range(4):
      state, m = fn(state, batch)
      losses.append(float(m["value_loss"]))
    assert losses[-1] < losses[0]


class TestOptimizer:
  def test_warmup_then_cosine(self):
    opt = optim_lib.make_optimizer(
      optim_lib.OptimConfig(1e-3, steps=10, warmup_steps=2, schedule="cosine")
    )
    params = {"w": jnp.ones(3)}
    state = opt.init(params)
    lrs = []
    for _ in range(10):
      _, state = opt.update({"w": jnp.ones(3)}, state, params)
      lrs.append(float(update_lib.current_learning_rate(state)))
    assert lrs[0] < lrs[1] <= 1e-3 + 1e-12
    assert lrs[-1] < lrs[2]
