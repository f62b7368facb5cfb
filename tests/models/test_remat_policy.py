"""The decoder's remat policies change what the backward pass recomputes,
never what it computes: `remat=True` (every layer re-run) and `remat="dots"`
(projection outputs saved) give the loss and gradients of no remat."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import logprobs as logprobs_lib


def _loss_and_grad(config, params, tokens, remat):
  def loss(p):
    logp, _ = logprobs_lib.token_logprobs(config, p, tokens, remat=remat)
    return logp.mean()

  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("remat", [True, "dots"])
def test_remat_policies_match_no_remat(remat):
  # 6 layers: past the unrolled size, so the layer loop is a scan as in the
  # real models.
  config = models.tiny_config().replace(num_layers=6)
  params = models.init_params(config, jax.random.PRNGKey(0))
  tokens = jax.random.randint(
    jax.random.PRNGKey(1), (2, 12), 0, config.vocab_size
  )
  want_loss, want_grad = _loss_and_grad(config, params, tokens, False)
  got_loss, got_grad = _loss_and_grad(config, params, tokens, remat)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
  chex.assert_trees_all_close(got_grad, want_grad, rtol=1e-5, atol=1e-7)
  assert jnp.isfinite(got_loss)


def test_the_trainer_flag_takes_only_known_policies():
  from rljax.train import config as config_lib  # pylint: disable=g-import-not-at-top

  cfg = config_lib.TrainConfig()
  assert cfg.replace({"update.remat_policy": "dots"}).update.remat_policy == (
    "dots"
  )
  with pytest.raises(config_lib.ConfigError, match="--update.remat_policy"):
    cfg.replace({"update.remat_policy": "some"})
