"""`--remat` of experiments/profile_update.py (UpdateSpec.remat) reaches
the decoder's per-layer remat (issue 12, defect 10), instead of wrapping
the whole loss in one jax.checkpoint that keeps every activation."""
import jax
import numpy as np
import pytest

from rljax import models
from rljax.core import objectives
from rljax.models import decoder
from rljax.train import update as update_lib


@pytest.mark.parametrize("remat", [False, True])
def test_remat_flag_reaches_the_decoder(remat, monkeypatch):
  seen = []
  original = decoder.final_hidden_states

  def recording(*args, **kwargs):
    seen.append(kwargs.get("remat", False))
    return original(*args, **kwargs)
  monkeypatch.setattr(decoder, "final_hidden_states", recording)
  config = models.tiny_config()
  params = models.init_params(config, jax.random.PRNGKey(0))
  spec = update_lib.UpdateSpec(
      model_config=config, remat=remat,
      loss=objectives.PolicyLossConfig(surrogate="ppo", correction="acr",
                                       aggregation="token-mean"))
  optimizer = update_lib.make_optimizer(1e-6, 10)
  state = update_lib.init_train_state(params, optimizer)
  b, t = 2, 8
  rng = np.random.default_rng(0)
  batch = {
      "tokens": rng.integers(0, config.vocab_size, (b, t)).astype(np.int32),
      "attention_mask": np.ones((b, t), np.int32),
      "loss_mask": np.ones((b, t - 1), np.float32),
      "advantages": rng.normal(size=(b, t - 1)).astype(np.float32),
      "behav_logp": np.full((b, t - 1), -3.0, np.float32),
      "prox_logp": np.full((b, t - 1), -3.0, np.float32),
  }
  step = update_lib.make_update_step(spec, optimizer)
  jaxpr = str(jax.make_jaxpr(step)(state, batch))
  assert seen and all(r == remat for r in seen)
  # Per-layer: the checkpoint sits inside the layer scan, once per block.
  assert ("checkpoint" in jaxpr or "remat" in jaxpr) == remat
