"""LoRA through the trainer on the tiny model: a GRPO run with INT8 rollout
and the UAQ fold takes finite steps, trains only the adapters, checkpoints
only them, resumes, and exports merged HF weights plus a PEFT adapter."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models, quant
from rljax.models import lora as lora_lib
from rljax.train import export as export_lib
from tests.train.test_trainer import make_trainer, small_config


def _lora_config(tmp_path, **kw):
  base = dict(
    lora_rank=4,
    lora_alpha=8.0,
    lora_dropout=0.05,
    rollout_quant="int8",
    uaq_scale=1.5,
    learning_rate=1e-2,
  )
  base.update(kw)
  return small_config("grpo", tmp_path, **base)


def test_bad_lora_flags_name_the_field(tmp_path):
  with pytest.raises(ValueError, match="lora_rank=-1"):
    _lora_config(tmp_path, lora_rank=-1)
  with pytest.raises(ValueError, match="targets"):
    _lora_config(tmp_path, lora_targets="q,v")


@pytest.mark.slow  # a whole LoRA GRPO run (the other tests check its parts)
def test_lora_grpo_run(tmp_path):
  cfg = _lora_config(tmp_path, lora_targets="q_proj,v_proj,up_proj")
  trainer = make_trainer(cfg)
  try:
    frozen_before = jax.tree.map(np.asarray, trainer.frozen_params)
    assert sorted(trainer.state.params["layers"]) == [
      "q_proj",
      "up_proj",
      "v_proj",
    ]
    rows = trainer.run()
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
      assert np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"])
      assert r["applied"] == 1.0
    # Only the adapters moved; the frozen base is bit-identical.
    assert (
      float(jnp.abs(trainer.state.params["layers"]["q_proj"]["lora_b"]).max())
      > 0
    )
    jax.tree.map(
      np.testing.assert_array_equal,
      jax.tree.map(np.asarray, trainer.frozen_params),
      frozen_before,
    )
    # The optimizer state holds adapter-shaped leaves only.
    shapes = {x.shape for x in jax.tree.leaves(trainer.state.params)}
    assert all(
      x.ndim == 0 or x.shape in shapes
      for x in jax.tree.leaves(trainer.state.opt_state)
    )

    # The merged policy from the run directory (restore_policy: adapters
    # merged into the folded base, then UAQ unfolded).
    export_lib.export_run(trainer.cfg.run.run_dir, str(tmp_path / "hf"))
    export_lib.export_adapter(
      trainer.model_config,
      trainer.lora,
      trainer.state.params,
      str(tmp_path / "adapter"),
      trainer.cfg.model.name,
      trainer.uaq_scale,
    )
    merged = jax.tree.map(np.asarray, trainer.policy_params())
  finally:
    trainer.close()

  # Merged HF export = unfold_uaq(merged θ); the PEFT adapter rebuilds it
  # from the *unfolded* base.
  config, exported = models.load_hf(tmp_path / "hf")
  plain = quant.unfold_uaq(config, merged, scale=1.5)
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, atol=2e-2), exported, plain
  )  # bf16 export
  lora, adapters = lora_lib.load_peft_adapter(config, tmp_path / "adapter")
  base = quant.unfold_uaq(config, trainer.frozen_params, scale=1.5)
  rebuilt = lora_lib.merge(config, lora, base, adapters)
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5),
    rebuilt,
    plain,
  )
  meta = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
  assert meta["target_modules"] == ["q_proj", "up_proj", "v_proj"]

  # Checkpoints hold the adapters (and their optimizer state), not the base.
  ckpt_bytes = sum(
    os.path.getsize(os.path.join(d, f))
    for d, _, fs in os.walk(tmp_path / "checkpoints")
    for f in fs
  )
  base_bytes = sum(x.nbytes for x in jax.tree.leaves(frozen_before))
  assert ckpt_bytes < base_bytes

  # Resume continues from the adapters.
  resumed = make_trainer(
    _lora_config(
      tmp_path, steps=3, resume=True, lora_targets="q_proj,v_proj,up_proj"
    )
  )
  try:
    assert resumed.step_num == 2
    row = resumed.run()[-1]
    assert row["step"] == 3 and np.isfinite(row["loss"])
  finally:
    resumed.close()


@pytest.mark.parametrize("base_dtype", ["bfloat16", "int8"])
def test_low_precision_base_takes_finite_steps(tmp_path, base_dtype):
  trainer = make_trainer(
    _lora_config(
      tmp_path,
      steps=1,
      lora_base_dtype=base_dtype,
      rollout_quant="none",
      uaq_scale=1.0,
    )
  )
  try:
    row = trainer.run()[-1]
  finally:
    trainer.close()
  assert np.isfinite(row["loss"]) and row["applied"] == 1.0
