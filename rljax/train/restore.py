"""The policy a training run's checkpoint holds, without building a Trainer.

`restore_policy(run_dir)` reads `config.json` and one checkpoint, nothing
else: nothing in the run directory is written (no config.json rewrite, no
metrics row, no lock) and no rollout engine starts. Evaluation and export
use it.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp

from rljax import models
from rljax import quant
from rljax.models import lora as lora_lib
from rljax.train.checkpoint import RunCheckpointer
from rljax.train import config as config_lib
from rljax.train.config import TrainConfig


def read_config(run_dir: str) -> TrainConfig:
  """The TrainConfig a run recorded in `config.json`."""
  with open(os.path.join(run_dir, "config.json")) as f:
    saved = json.load(f)
  # Nested, or flat from an older rljax (`config.LEGACY_KEYS`); fields
  # another rljax version had are ignored: only the model matters here.
  return config_lib.from_dict(saved, source=run_dir)


def read_checkpoint(run_dir: str, step: int | None = None):
  """(step, saved state tree, meta) of the latest verified (or `step`)
  checkpoint, as saved (no target: independent of the run's optimizer)."""
  # A reader, not the owner: it never cleans up a save a live run is making.
  ckpt = RunCheckpointer(
    os.path.join(run_dir, "checkpoints"), 1, 1_000_000, owner=False
  )
  try:
    if step is None:
      # The newest checkpoint whose files match their manifest.
      step, damaged = ckpt.latest_verified_step()
      for bad_step, reason in damaged:
        print(f"[rljax] {run_dir}: skipping checkpoint {bad_step} ({reason})")
    if step is None:
      raise FileNotFoundError(f"run directory {run_dir!r} has no checkpoint")
    state, meta = ckpt.restore(step, None)
  finally:
    ckpt.close()
  return step, state, meta


def _as_like(saved, ref, what: str):
  if jax.tree.structure(saved) != jax.tree.structure(ref):
    raise ValueError(what)
  return jax.tree.map(lambda x, r: jnp.asarray(x, r.dtype), saved, ref)


def restore_policy(run_dir: str, step: int | None = None) -> models.Model:
  """The policy of a training run at its latest (or `step`) checkpoint.

  The params are returned in the model's own parametrisation: a run trained
  with update-aware quantization (QuRL §4.3) stores θ folded with its scale
  s, which is unfolded here with the scale the checkpoint records. A LoRA
  run stores its adapters only; they are merged into the (folded) base of
  `config.json`'s model, as the trainer ran them, before the unfold.
  """
  cfg = read_config(run_dir)
  step, state, meta = read_checkpoint(run_dir, step)
  skeleton = models.load_named(cfg.model.name, cfg.run.seed)
  quantized = quant.is_quantized(cfg.rollout.quant)
  scale = float(
    meta.get("uaq_scale", cfg.rollout.uaq_scale if quantized else 1.0)
  )
  mismatch = (
    f"{run_dir}: checkpoint {step} holds params of another structure than "
    f"model={cfg.model.name!r} of its config.json"
  )
  lora = cfg.lora_config()
  if lora is None:
    params = _as_like(state["params"], skeleton.params, mismatch)
  else:
    base = skeleton.params
    if scale != 1.0:
      base = quant.fold_uaq(skeleton.config, base, scale=scale)
    like = lora_lib.init_adapters(skeleton.config, lora, jax.random.PRNGKey(0))
    adapters = _as_like(state["params"], like, mismatch)
    params = jax.jit(lora_lib.LoraTransform(skeleton.config, lora))(
      lora_lib.freeze_base(skeleton.config, base, lora), adapters
    )
  if scale != 1.0:
    params = quant.unfold_uaq(skeleton.config, params, scale=scale)
  return models.Model(
    config=skeleton.config, params=params, tokenizer=skeleton.tokenizer
  )
