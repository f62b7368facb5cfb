"""The update step logs ACR's exposure (rljax.core.exposure) for every
correction, from the same tokens its loss sees (so the exposure describes the
batch the run actually trained on), and the run's summary line reports it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax import models
from rljax.core import exposure, objectives
from rljax.train import driver
from rljax.train import update as update_lib

B, T, PROMPT = 4, 12, 4


@pytest.fixture(scope="module")
def tiny():
  config = models.tiny_config()
  params = models.init_params(config, jax.random.PRNGKey(0))
  return config, params


def _batch(config, params):
  """prox ≠ π_θ (R leaves 1) and behav ≠ prox (ρ > C on many tokens)."""
  k = jax.random.split(jax.random.PRNGKey(3), 4)
  tokens = jax.random.randint(k[0], (B, T), 0, config.vocab_size)
  attention = jnp.ones((B, T), jnp.int32)
  mask = np.zeros((B, T - 1), np.float32)
  mask[:, PROMPT:] = 1.0
  mask = jnp.asarray(mask)
  logp, _ = models.token_logprobs(
    config, params, tokens, attention_mask=attention
  )
  prox = logp - 0.4 * jnp.abs(jax.random.normal(k[1], logp.shape))
  behav = prox - (0.5 + jax.random.normal(k[2], logp.shape))
  batch = dict(
    tokens=tokens,
    attention_mask=attention,
    loss_mask=mask,
    prox_logp=prox,
    behav_logp=behav,
    advantages=jax.random.normal(k[3], (B, T - 1)) * mask,
  )
  return batch, logp


# naive: the exposure is logged under a correction that is not ACR (what ACR
# would change); the acr case is the next test's spec with prox ≠ π_θ.
@pytest.mark.parametrize("correction", ["naive"])
def test_update_logs_the_kernels_exposure(tiny, correction):
  config, params = tiny
  batch, logp = _batch(config, params)
  loss = objectives.PolicyLossConfig(correction=correction, tis_cap=2.0)
  spec = update_lib.UpdateSpec(model_config=config, loss=loss)
  opt = optax.sgd(0.0)
  state = update_lib.init_train_state(params, opt)
  _, metrics = update_lib.make_update_step(spec, opt, donate=False)(
    state, batch
  )
  want = exposure.exposure_metrics(
    exposure.acr_exposure(
      logp,
      batch["prox_logp"],
      batch["behav_logp"],
      batch["advantages"],
      batch["loss_mask"] > 0,
      eps_low=loss.eps_low,
      eps_high=loss.eps_high,
      cap=loss.tis_cap,
    )
  )
  assert float(want["acr_would_change_fraction"]) > 0  # the batch exposes ACR
  for name, value in want.items():
    np.testing.assert_allclose(
      float(metrics[name]), float(value), rtol=1e-4, atol=1e-7, err_msg=name
    )


def test_one_update_per_rollout_logs_zero_exposure(tiny):
  """π_prox = sg(π_θ): R ≡ 1 at the gradient, ACR cannot act."""
  config, params = tiny
  batch, _ = _batch(config, params)
  loss = objectives.PolicyLossConfig(correction="acr", tis_cap=2.0)
  spec = update_lib.UpdateSpec(
    model_config=config, loss=loss, prox_is_current=True
  )
  opt = optax.sgd(0.0)
  state = update_lib.init_train_state(params, opt)
  _, m = update_lib.make_update_step(spec, opt, donate=False)(state, batch)
  assert float(m["acr_eligible_fraction"]) > 0.05
  assert float(m["acr_grad_share"]) == 0.0
  assert float(m["acr_would_change_fraction"]) == 0.0


def test_summary_line():
  rows = [
    {"acr_grad_share": 2e-3, "acr_would_change_fraction": 1e-3},
    {"acr_grad_share": 0.0, "acr_would_change_fraction": 0.0},
  ]
  summary = driver.acr_exposure_summary(rows)
  assert summary["acr_grad_share"] == pytest.approx(1e-3)
  assert summary["acr_eligible_fraction"] is None
  rows = [{k: 0.0 for k in exposure.METRIC_NAMES.values()}]
  line = driver.exposure_line(driver.acr_exposure_summary(rows))
  assert "acr_grad_share 0.00e+00" in line
  assert "ACR acted as TIS" in line
  assert "not logged" in driver.exposure_line(driver.acr_exposure_summary([]))
