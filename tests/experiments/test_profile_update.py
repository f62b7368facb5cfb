"""`--remat` of experiments/profile_update.py (UpdateSpec.remat) reaches
the decoder's per-layer remat (what the trainer uses), instead of wrapping
the whole loss in one jax.checkpoint that keeps every activation."""

import jax
import numpy as np
import pytest

from rljax import models
from rljax.core import objectives
from rljax.models import decoder
from rljax.train import optim as optim_lib
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
    model_config=config,
    remat=remat,
    loss=objectives.PolicyLossConfig(
      surrogate="ppo", correction="acr", aggregation="token-mean"
    ),
  )
  optimizer = optim_lib.make_optimizer(optim_lib.OptimConfig(1e-6, 10))
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


def test_aot_plan_splits_params_and_optimizer_over_fsdp():
  """--aot's planner compiles the sharded step (nothing runs) and reports
  per-device bytes; with fsdp=2 each device holds half of every kernel and
  of Adam's moments (only the small norms are replicated)."""
  # The planner lives in the library (importing the script would define its
  # absl flags a second time in a worker that already ran another script).
  from rljax.train import memory_plan as profile  # pylint: disable=g-import-not-at-top

  if jax.device_count() < 2:
    pytest.skip("needs 2 (fake) devices: tests/conftest.py")
  config = models.tiny_config()
  mesh = models.make_mesh(data=1, fsdp=2, tensor=1, devices=jax.devices()[:2])
  # The smallest program (no micro-batches, remat or chunks): compile time.
  out = profile.plan(
    config,
    mesh,
    batch=4,
    seq=16,
    micro_batches=1,
    remat=False,
    logprob_chunk=0,
    param_dtype="float32",
    compute_dtype="bfloat16",
    decode=True,
    rollout_batch=4,
  )
  full = 4 * config.num_params()
  norms = 4 * (2 * config.num_layers + 1) * config.hidden_size
  assert out["params_bytes"] == (full - norms) // 2 + norms
  # Adam: mu and nu, like the params, plus a few replicated scalars.
  assert (
    2 * out["params_bytes"]
    <= out["opt_state_bytes"]
    < (2 * out["params_bytes"] + 64)
  )
  assert out["update_temp_bytes"] > 0
  # Rollout weights in the compute dtype: half the float32 bytes.
  assert out["rollout_params_bytes"] == out["params_bytes"] // 2
  assert (
    out["kv_cache_bytes"]
    == 2
    * 2
    * (config.num_layers * 4 * 16 * config.num_kv_heads * config.head_dim)
    // 2
  )
