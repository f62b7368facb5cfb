"""VAPO's positive-example NLL in the jitted update step
(`--loss.positive_nll_coef`): the step's loss is the policy loss + μ·L_NLL
of `core.nll` on the model's own log-probs, exactly across micro-batches,
and `positive_nll` is in the metrics."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rljax import models
from rljax.core import nll, objectives
from rljax.train import update as update_lib
from tests.train.test_update import make_batch


def _step(config, params, batch, coef, micro):
  loss = objectives.PolicyLossConfig(
    surrogate="ppo", aggregation="token-mean", positive_nll_coef=coef
  )
  spec = update_lib.UpdateSpec(
    model_config=config, loss=loss, micro_batches=micro
  )
  opt = optax.sgd(1.0)
  fn = update_lib.make_update_step(spec, opt, donate=False)
  new_state, metrics = fn(update_lib.init_train_state(params, opt), batch)
  grads = jax.tree.map(lambda a, b: a - b, params, new_state.params)  # lr = 1
  return grads, metrics


def test_loss_adds_mu_times_the_positive_nll_exactly():
  config = models.tiny_config()
  params = models.init_params(config, jax.random.PRNGKey(0))
  batch = make_batch(config)
  # Responses 0, 3, 4 and 6 have positive reward; the rest 0 or below.
  batch = dict(
    batch, rewards=jnp.array([1.0, 0.0, -1.0, 0.5, 2.0, 0.0, 1.0, 0.0])
  )
  logp, _ = models.token_logprobs(
    config, params, batch["tokens"], attention_mask=batch["attention_mask"]
  )
  want = float(nll.positive_nll(logp, batch["loss_mask"], batch["rewards"]))
  assert want > 0
  _, base = _step(config, params, batch, 0.0, 1)
  assert "positive_nll" not in base
  g_full, full = _step(config, params, batch, 0.5, 1)
  g_micro, micro = _step(config, params, batch, 0.5, 4)
  for m in (full, micro):
    np.testing.assert_allclose(m["positive_nll"], want, rtol=1e-5)
    np.testing.assert_allclose(
      m["loss"], base["loss"] + 0.5 * want, rtol=1e-5, atol=1e-6
    )
  for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_micro)):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)


def test_coefficient_is_checked():
  import pytest

  with pytest.raises(ValueError, match="positive_nll_coef"):
    objectives.PolicyLossConfig(positive_nll_coef=-0.1)
  cfg = objectives.PolicyLossConfig(positive_nll_coef=1)
  assert dataclasses.replace(cfg).positive_nll_coef == 1.0
