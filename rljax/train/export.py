"""Export of a trained policy: HF weights (UAQ unfolded) and, for LoRA
runs, the adapters alone in PEFT layout. From a run directory
(`restore.restore_policy`) or from params in hand."""

from __future__ import annotations

from typing import Any

from rljax import models
from rljax import quant
from rljax.models import lora as lora_lib
from rljax.train import restore as restore_lib


def export_policy(
  model: models.Model, out_dir: str, dtype: str = "bfloat16"
) -> str:
  """HF weights of `model` (in its own parametrisation: UAQ unfolded) in
  `models.save_hf`'s float `dtype`."""
  models.save_hf(
    model.config, model.params, out_dir, tokenizer=model.tokenizer, dtype=dtype
  )
  return out_dir


def export_run(run_dir: str, out_dir: str, dtype: str = "bfloat16") -> str:
  """HF weights of a run's latest verified checkpoint."""
  return export_policy(restore_lib.restore_policy(run_dir), out_dir, dtype)


def unfolded_policy(
  model_config: Any, params: Any, tokenizer: Any, uaq_scale: float
) -> models.Model:
  """θ as trained (maybe folded with UAQ's s) → the model's own θ."""
  if uaq_scale != 1.0:
    params = quant.unfold_uaq(model_config, params, scale=uaq_scale)
  return models.Model(config=model_config, params=params, tokenizer=tokenizer)


def export_adapter(
  model_config: Any,
  lora: lora_lib.LoraConfig,
  adapters: Any,
  out_dir: str,
  base_model: str,
  uaq_scale: float = 1.0,
) -> str:
  """LoRA adapters alone, PEFT layout, for the *unfolded* base: trained on
  a base folded with s, A ← A·s^-k undoes UAQ (models/lora.py)."""
  if uaq_scale != 1.0:
    factors = lora_lib.uaq_kernel_factors(1.0 / uaq_scale)
    adapters = lora_lib.fold_adapters(lora, adapters, factors)
  return lora_lib.save_peft_adapter(
    model_config, lora, adapters, out_dir, base_model
  )
