"""A model's starting checkpoint for vLLM, and the engine that serves it."""

from __future__ import annotations

import dataclasses
from typing import Any

from rljax.rollout.vllm.config import ATTACH_HEALTH_TIMEOUT_S
from rljax.rollout.vllm.config import VLLMSidecarConfig
from rljax.rollout.vllm.pool import VLLMSidecarPool
from rljax.rollout.vllm.process import is_cpu_build
from rljax.rollout.vllm.sidecar import VLLMSidecar

EXPORT_MODES = ("none", "bf16", "int8", "fp8")


def export_checkpoint(
  model_config: Any,
  params: Any,
  out_dir: str,
  quant: str = "none",
  tokenizer: Any = None,
) -> None:
  """Writes the HF checkpoint a vLLM server starts from to `out_dir`.

  bf16 for "none"/"bf16", the INT8 W8A8 compressed-tensors export for
  "int8", FP8 for "fp8" (CUDA only: vLLM's CPU build has no FP8 kernels).
  """
  from rljax import models  # pylint: disable=g-import-not-at-top

  if quant in ("none", "bf16", "f32"):
    models.save_hf(
      model_config, params, out_dir, tokenizer=tokenizer, dtype="bfloat16"
    )
  elif quant == "int8":
    models.export_compressed_tensors_int8(
      model_config, params, out_dir, tokenizer=tokenizer
    )
  elif quant == "fp8":
    if is_cpu_build():
      raise ValueError(
        "quant='fp8' with engine='vllm' needs CUDA: vLLM's CPU "
        "build has no FP8 kernels; use --rollout.engine=jax (FP8 "
        "emulation) or --rollout.quant=int8"
      )
    models.export_compressed_tensors_fp8(
      model_config, params, out_dir, tokenizer=tokenizer
    )
  else:
    raise ValueError(
      f"quant={quant!r} is not supported by the vLLM engine; "
      f"expected one of {EXPORT_MODES}"
    )


def engine_for_model(
  model_config: Any,
  params: Any,
  out_dir: str,
  quant: str = "none",
  tokenizer: Any = None,
  urls: str = "",
  config: VLLMSidecarConfig | None = None,
):
  """A vLLM engine (one sidecar, or a pool over `urls`) serving `params`.

  Writes the starting checkpoint to `out_dir` (`export_checkpoint`); the
  trainer then pushes the weights it quantized at every sync. With `urls`
  (comma-separated), attaches to those running servers instead of
  launching one.
  """
  export_checkpoint(model_config, params, out_dir, quant, tokenizer)
  if urls:
    # A running server answers at once or never: bound the health wait.
    config = config or VLLMSidecarConfig()
    config = dataclasses.replace(
      config,
      startup_timeout_s=min(config.startup_timeout_s, ATTACH_HEALTH_TIMEOUT_S),
    )
    sidecars = [
      VLLMSidecar.attach(
        u.strip(), model_dir=out_dir, config=config, model_config=model_config
      )
      for u in urls.split(",")
      if u.strip()
    ]
    return sidecars[0] if len(sidecars) == 1 else VLLMSidecarPool(sidecars)
  return VLLMSidecar(out_dir, config, model_config=model_config)
