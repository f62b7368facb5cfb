"""Export quantized params as a vLLM compressed-tensors checkpoint (W8A8).

The exported weights are exactly the `QTensor`s of `quantize_params`: the
integer (or e4m3) codes transposed to HF's `[out, in]`, and the float32
per-channel scales as `[out, 1]` (the dtype vLLM's W8A8 schemes allocate for
`weight_scale`), so the rollout engine samples from the same quantized model
the diagnostics measure. Activations are quantized dynamically per token by
vLLM, with the same absmax rule as `qtensor.quantize_activations_int8`.
Everything else (embeddings, norms, biases, the LM head) is written in the
model dtype (bf16 by default), and HF names come from `models.to_hf_state_dict`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import ml_dtypes
import numpy as np

from rljax.models import hf_io
from rljax.models import safetensors_io
from rljax.quant import params as qparams_lib
from rljax.quant.qtensor import QTensor

Params = dict[str, Any]

_NP_DTYPES = {
  "bfloat16": ml_dtypes.bfloat16,
  "float16": np.float16,
  "float32": np.float32,
}

_FORMATS = {
  "int8": ("int-quantized", "int"),
  "fp8": ("float-quantized", "float"),
}


def quantization_config(
  mode: str = "int8", per_tensor: bool = False, include_lm_head: bool = False
) -> dict[str, Any]:
  """The `quantization_config` entry of config.json for a W8A8 checkpoint.

  INT8: `format: int-quantized`, symmetric per-channel int8 weights, dynamic
  per-token int8 activations (docs: environment.md). FP8: the same with
  `format: float-quantized` and `type: float` (e4m3).
  """
  if mode not in _FORMATS:
    raise ValueError(
      f"quantization_config: mode={mode!r}; vLLM W8A8 export supports "
      f"{sorted(_FORMATS)}"
    )
  if per_tensor and mode != "fp8":
    raise ValueError("quantization_config: per_tensor=True is only for fp8")
  fmt, kind = _FORMATS[mode]
  return {
    "quant_method": "compressed-tensors",
    "format": fmt,
    "quantization_status": "compressed",
    "config_groups": {
      "group_0": {
        "targets": ["Linear"],
        "weights": {
          "num_bits": 8,
          "type": kind,
          "symmetric": True,
          "strategy": "tensor" if per_tensor else "channel",
          "dynamic": False,
        },
        "input_activations": {
          "num_bits": 8,
          "type": kind,
          "symmetric": True,
          "strategy": "token",
          "dynamic": True,
        },
      },
    },
    "ignore": [] if include_lm_head else ["lm_head"],
  }


def _check_qparams(
  qparams: Params, mode: str
) -> dict[tuple[str, ...], QTensor]:
  qts = dict(qparams_lib.iter_qtensors(qparams))
  if not qts:
    raise ValueError(
      "export: params hold no QTensor; pass quantize_params(...) output or "
      "full-precision params"
    )
  for path, q in qts.items():
    if q.mode != mode:
      raise ValueError(
        f"export: {'/'.join(path)} has QTensor.mode={q.mode!r}; this export "
        f"writes mode={mode!r}"
      )
  missing = [p for p in qparams_lib.kernel_paths(qparams) if p not in qts]
  if missing:
    raise ValueError(f"export: kernels {missing} are not quantized")
  return qts


def _as_qparams(config, params: Params, mode: str, per_tensor: bool) -> Params:
  if any(True for _ in qparams_lib.iter_qtensors(params)):
    return params
  return qparams_lib.quantize_params(
    config, params, mode=mode, per_tensor=per_tensor
  )


def compressed_tensors_state_dict(
  config: Any,
  qparams: Params,
  mode: str = "int8",
  dtype: str = "bfloat16",
  per_tensor: bool = False,
) -> dict[str, np.ndarray]:
  """HF name -> numpy array of a compressed-tensors W8A8 checkpoint.

  Args:
    config: `models.ModelConfig`.
    qparams: `quantize_params(config, params, mode)` output (exported as is),
      or full-precision params (quantized here with the same function).
    mode: "int8" or "fp8".
    dtype: dtype of the tensors that are not quantized.
    per_tensor: only used when `qparams` is full precision (fp8).

  Returns:
    `{"model.layers.0.self_attn.q_proj.weight": int8 [out, in],
      "model.layers.0.self_attn.q_proj.weight_scale": float32 [out, 1], ...,
      "model.embed_tokens.weight": bf16 [V, D], ...}`; the weight-sync path
    sends this without writing config.json.
  """
  if mode not in _FORMATS:
    raise ValueError(
      f"compressed_tensors_state_dict: mode={mode!r}; expected one of "
      f"{sorted(_FORMATS)}"
    )
  if dtype not in _NP_DTYPES:
    raise ValueError(
      f"compressed_tensors_state_dict: dtype={dtype!r}; expected one of "
      f"{sorted(_NP_DTYPES)}"
    )
  qparams = _as_qparams(config, qparams, mode, per_tensor)
  qts = _check_qparams(qparams, mode)
  per_tensor = _is_per_tensor(qts)
  # hf_io.to_hf_state_dict writes a QTensor kernel as its codes `.T` plus a
  # float32 `weight_scale` [out, 1]: the compressed-tensors layout.
  hf = hf_io.to_hf_state_dict(config, qparams)
  code_dtype = np.dtype(np.int8 if mode == "int8" else ml_dtypes.float8_e4m3fn)
  out: dict[str, np.ndarray] = {}
  for name, tensor in hf.items():
    if name.endswith(".weight_scale"):
      scale = np.asarray(tensor, np.float32)
      # Per-tensor scales were broadcast to [out, 1]; vLLM's tensor strategy
      # reads one value per matrix.
      out[name] = scale.reshape(-1)[:1].copy() if per_tensor else scale
    elif name + "_scale" in hf:
      if tensor.dtype != code_dtype:
        raise TypeError(
          f"export: {name} has dtype {tensor.dtype}; expected {code_dtype}"
        )
      out[name] = tensor
    else:
      out[name] = np.asarray(tensor).astype(_NP_DTYPES[dtype], copy=False)
  return out


def _is_per_tensor(qts) -> bool:
  return any(
    q.scale.shape[-1] == 1 and q.value.shape[-1] > 1 for q in qts.values()
  )


def _export(config, params, out_dir, tokenizer, mode, dtype, per_tensor):
  qparams = _as_qparams(config, params, mode, per_tensor)
  per_tensor = _is_per_tensor(dict(qparams_lib.iter_qtensors(qparams)))
  include_lm_head = any(
    p == ("lm_head", "kernel") for p, _ in qparams_lib.iter_qtensors(qparams)
  )
  tensors = compressed_tensors_state_dict(config, qparams, mode, dtype)
  os.makedirs(out_dir, exist_ok=True)
  safetensors_io.save_safetensors(
    os.path.join(out_dir, "model.safetensors"), tensors
  )
  hf_config = dict(config.to_hf())
  hf_config["torch_dtype"] = dtype
  hf_config["quantization_config"] = quantization_config(
    mode, per_tensor=per_tensor, include_lm_head=include_lm_head
  )
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  generation = {
    k: hf_config[k]
    for k in ("bos_token_id", "eos_token_id", "pad_token_id")
    if hf_config.get(k) is not None
  }
  with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
    json.dump(generation, f, indent=2)
  if tokenizer is not None:
    if not hasattr(tokenizer, "save_pretrained"):
      raise TypeError(
        f"export: tokenizer of type {type(tokenizer).__name__} has no "
        "save_pretrained(dir); pass an HF tokenizer or None"
      )
    tokenizer.save_pretrained(out_dir)
  return out_dir


def export_compressed_tensors_int8(
  config: Any,
  params: Params,
  out_dir: str | os.PathLike,
  tokenizer: Any = None,
  dtype: str = "bfloat16",
) -> str:
  """Writes a vLLM-loadable INT8 W8A8 compressed-tensors directory.

  `out_dir` gets `model.safetensors` (int8 `*.weight` [out, in], float32
  `*.weight_scale` [out, 1] for the seven projections of every block, the rest
  in `dtype`), `config.json` with the `quantization_config` of
  `quantization_config("int8")`, `generation_config.json`, and the tokenizer
  files when `tokenizer` is given.

  Args:
    config: `models.ModelConfig`.
    params: `quantize_params(config, params, "int8")` output (written exactly)
      or full-precision params (quantized here).
    out_dir: directory, created if needed.
    tokenizer: optional HF tokenizer (anything with `save_pretrained`).
    dtype: dtype of the unquantized tensors and `torch_dtype`.

  Returns:
    `out_dir`.
  """
  return os.fspath(
    _export(config, params, out_dir, tokenizer, "int8", dtype, per_tensor=False)
  )


def export_compressed_tensors_fp8(
  config: Any,
  params: Params,
  out_dir: str | os.PathLike,
  tokenizer: Any = None,
  dtype: str = "bfloat16",
  per_tensor: bool = False,
) -> str:
  """FP8 e4m3 twin of `export_compressed_tensors_int8` (for GPUs; vLLM has no
  FP8 path on CPU): float8_e4m3fn `*.weight`, float32 per-channel (or, with
  `per_tensor`, per-matrix `[1]`) `*.weight_scale`, `format: float-quantized`,
  dynamic per-token FP8 activations."""
  return os.fspath(
    _export(
      config, params, out_dir, tokenizer, "fp8", dtype, per_tensor=per_tensor
    )
  )
