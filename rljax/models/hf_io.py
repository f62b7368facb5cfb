"""HF Llama/Qwen2 checkpoints: the name mapping, and safetensors dirs in/out.

HF stores `nn.Linear` weights as [out, in] per layer
(`model.layers.{i}.self_attn.q_proj.weight`); rljax stores Flax kernels
[in, out] stacked over layers (docs/CONTRACTS.md). `to_hf_state_dict` and
`from_hf_state_dict` convert between the two, strictly: a missing, unexpected
or mis-shaped tensor is an error that names it.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open

from rljax.models import decoder
from rljax.models import safetensors_io
from rljax.models.config import ModelConfig
from rljax.quant.qtensor import QTensor

# Per-layer HF names: rljax layer leaf -> suffix after "model.layers.{i}.".
_LAYER_NAMES = {
  ("attn_norm", "scale"): "input_layernorm.weight",
  ("q_proj", "kernel"): "self_attn.q_proj.weight",
  ("q_proj", "bias"): "self_attn.q_proj.bias",
  ("k_proj", "kernel"): "self_attn.k_proj.weight",
  ("k_proj", "bias"): "self_attn.k_proj.bias",
  ("v_proj", "kernel"): "self_attn.v_proj.weight",
  ("v_proj", "bias"): "self_attn.v_proj.bias",
  ("o_proj", "kernel"): "self_attn.o_proj.weight",
  ("mlp_norm", "scale"): "post_attention_layernorm.weight",
  ("gate_proj", "kernel"): "mlp.gate_proj.weight",
  ("up_proj", "kernel"): "mlp.up_proj.weight",
  ("down_proj", "kernel"): "mlp.down_proj.weight",
  ("q_norm", "scale"): "self_attn.q_norm.weight",  # Qwen3 only
  ("k_norm", "scale"): "self_attn.k_norm.weight",  # Qwen3 only
}
_QK_NORMS = (("q_norm", "scale"), ("k_norm", "scale"))
_EMBED = "model.embed_tokens.weight"
_FINAL_NORM = "model.norm.weight"
_LM_HEAD = "lm_head.weight"

# Buffers some older checkpoints carry that are not parameters.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

_SAVE_DTYPES = {
  "bfloat16": ml_dtypes.bfloat16,
  "float32": np.float32,
  "float16": np.float16,
}


def _layer_leaves(config: ModelConfig) -> list[tuple[str, str]]:
  leaves = [k for k in _LAYER_NAMES if k[1] != "bias" and k not in _QK_NORMS]
  if config.qk_norm:
    leaves += list(_QK_NORMS)
  if config.has_qkv_bias:
    leaves += [(p, "bias") for p in ("q_proj", "k_proj", "v_proj")]
  return leaves


def expected_hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  """HF tensor name -> shape, for every tensor a checkpoint must hold."""
  d, v = config.hidden_size, config.vocab_size
  kernels = decoder.layer_kernel_shapes(config)
  shapes = {_EMBED: (v, d), _FINAL_NORM: (d,)}
  if not config.tie_word_embeddings:
    shapes[_LM_HEAD] = (v, d)
  for i in range(config.num_layers):
    for proj, kind in _layer_leaves(config):
      name = f"model.layers.{i}.{_LAYER_NAMES[(proj, kind)]}"
      if kind == "kernel":
        d_in, d_out = kernels[proj]
        shapes[name] = (d_out, d_in)
      elif kind == "bias":
        shapes[name] = (kernels[proj][1],)
      elif (proj, kind) in _QK_NORMS:
        shapes[name] = (config.head_dim,)
      else:
        shapes[name] = (d,)
  return shapes


# ------------------------------------------------------------------- export
def _split_kernel(kernel: Any) -> tuple[Any, Any]:
  """(codes or weights, scale or None) of a kernel."""
  if isinstance(kernel, QTensor):
    return kernel.value, kernel.scale
  return kernel, None


@jax.jit
def _out_in(kernels: Any) -> Any:
  """Every [..., in, out] kernel of `kernels` (a QTensor: its codes) as
  [..., out, in], its scale [..., 1, out] kept: {key: (weights, scale)}.

  One compiled transpose on the device, so that each layer's HF [out, in]
  slice of the result is a contiguous view: numpy's strided `.T` copy of
  every layer was most of a vLLM sync's `prepare` phase (SmolLM2-135M on 2
  CPU cores; docs/performance.md).
  """

  def one(kernel):
    value, scale = _split_kernel(kernel)
    return jnp.swapaxes(value, -1, -2), scale

  return {k: one(v) for k, v in kernels.items()}


def _kernel_to_hf(
  name: str, value: Any, scale: Any, out: dict[str, np.ndarray]
):
  """HF [out, in] `value` (transposed by `_out_in`); a quantized kernel's
  `scale` adds `weight_scale` [out, 1] (the compressed-tensors / vLLM
  per-channel layout)."""
  out[name] = np.ascontiguousarray(np.asarray(value))
  if scale is not None:
    scale = np.asarray(scale, np.float32).reshape(-1)
    if scale.size == 1:
      scale = np.broadcast_to(scale, (value.shape[-2],))
    out[name + "_scale"] = np.ascontiguousarray(scale.reshape(-1, 1))


def to_hf_state_dict(
  config: ModelConfig, params: Mapping[str, Any]
) -> dict[str, np.ndarray]:
  """HF name -> numpy array ([out, in] for linear weights), in the params'
  dtypes. A QTensor kernel exports its quantized `weight` plus
  `weight_scale` [out, 1]; tied embeddings export no `lm_head.weight`.
  The arrays may be read-only views of the device's buffers (copy one to
  change it)."""
  leaves = _layer_leaves(config)
  kernels = {
    proj: params["layers"][proj][kind]
    for proj, kind in leaves
    if kind == "kernel"
  }
  if not config.tie_word_embeddings:
    kernels[_LM_HEAD] = decoder.lm_head_kernel(config, params)
  kernels = jax.device_get(_out_in(kernels))
  params = jax.device_get(params)
  out: dict[str, np.ndarray] = {
    _EMBED: np.asarray(params["embed"]["embedding"]),
    _FINAL_NORM: np.asarray(params["final_norm"]["scale"]),
  }
  if not config.tie_word_embeddings:
    _kernel_to_hf(_LM_HEAD, *kernels[_LM_HEAD], out)
  for proj, kind in leaves:
    for i in range(config.num_layers):
      name = f"model.layers.{i}.{_LAYER_NAMES[(proj, kind)]}"
      if kind == "kernel":
        value, scale = kernels[proj]
        _kernel_to_hf(name, value[i], None if scale is None else scale[i], out)
      else:
        out[name] = np.asarray(params["layers"][proj][kind][i])
  return out


# ------------------------------------------------------------------- import
def _format_names(names) -> str:
  names = sorted(names)
  shown = ", ".join(names[:8])
  return shown + (f", ... ({len(names)} in all)" if len(names) > 8 else "")


def _shape_of(state_dict: Mapping[str, Any], name: str) -> tuple[int, ...]:
  if isinstance(state_dict, LazyStateDict):
    return state_dict.shape(name)
  return tuple(np.shape(state_dict[name]))


def count_non_finite(array: Any) -> tuple[int, int]:
  """(NaN count, +-inf count) of a float array; (0, 0) for integer codes."""
  a = np.asarray(array)
  if a.dtype.kind not in "fc" and "float" not in a.dtype.name:
    return 0, 0
  a = a.astype(np.float32, copy=False) if a.dtype.kind != "f" else a
  nan = int(np.count_nonzero(np.isnan(a)))
  inf = int(np.count_nonzero(np.isinf(a)))
  return nan, inf


def _non_finite_error(
  bad: list[tuple[str, int, int, int]], source: str | None
) -> ValueError:
  where = f"checkpoint {source!r}" if source else "checkpoint"
  shown = "; ".join(
    f"{name!r}: {nan} NaN, {inf} inf of {size} values"
    for name, nan, inf, size in bad[:6]
  )
  more = f"; and {len(bad) - 6} more tensors" if len(bad) > 6 else ""
  return ValueError(
    f"{where} has non-finite weights in {len(bad)} tensor(s) "
    f"({shown}{more}); expected finite values (the file is "
    "corrupt, or was saved from a diverged run)"
  )


def from_hf_state_dict(
  config: ModelConfig,
  state_dict: Mapping[str, Any],
  dtype=None,
  *,
  source: str | None = None,
  check_finite: bool = True,
) -> dict[str, Any]:
  """HF state dict (numpy/torch-free arrays, [out, in]) -> rljax params.

  Strict: raises KeyError naming missing or unexpected tensors and ValueError
  naming a tensor whose shape differs from the config's, or (check_finite)
  every tensor holding NaN/inf with its counts: a bad weight is caught at
  load, not as a NaN loss at step 1. A tied checkpoint may carry an
  `lm_head.weight` equal to the embedding (it is dropped).

  Args:
    config: the architecture the tensors must match.
    state_dict: name -> array.
    dtype: params dtype; default the embedding's dtype.
    source: the file or dir the tensors come from, for error messages.
    check_finite: refuse NaN/inf values.
  """
  expected = expected_hf_shapes(config)
  present = {k for k in state_dict if not k.endswith(_IGNORED_SUFFIXES)}
  if config.tie_word_embeddings and _LM_HEAD in present:
    if not np.array_equal(
      np.asarray(state_dict[_LM_HEAD]), np.asarray(state_dict.get(_EMBED))
    ):
      raise ValueError(
        f"tensor {_LM_HEAD!r} differs from {_EMBED!r} but "
        "config.tie_word_embeddings=True"
      )
    present.discard(_LM_HEAD)
  missing = set(expected) - present
  if missing:
    raise KeyError(f"checkpoint is missing tensors: {_format_names(missing)}")
  unexpected = present - set(expected)
  if unexpected:
    raise KeyError(
      f"checkpoint has unexpected tensors: {_format_names(unexpected)}"
    )
  for name, shape in expected.items():
    got = _shape_of(state_dict, name)
    if got != shape:
      raise ValueError(
        f"tensor {name!r} has shape {got}; expected {shape} "
        f"for {config.arch} config"
      )
  bad: list[tuple[str, int, int, int]] = []

  def read(name: str) -> np.ndarray:
    # Each tensor is read once (lazily from disk) and checked as it is read.
    array = np.asarray(state_dict[name])
    if array.dtype.kind in "iub":  # cast to float, it would mean nothing
      raise ValueError(
        f"{source or 'state dict'}: tensor {name!r} holds {array.dtype} "
        "values; expected floating-point weights (a quantized checkpoint "
        "needs its own loader)"
      )
    if check_finite:
      nan, inf = count_non_finite(array)
      if nan or inf:
        bad.append((name, nan, inf, int(array.size)))
    return array

  embed = read(_EMBED)
  if dtype is None:
    dtype = embed.dtype
  as_param = lambda x: jnp.asarray(np.asarray(x), dtype=dtype)

  layers: dict[str, dict[str, jax.Array]] = {}
  for proj, kind in _layer_leaves(config):
    per_layer = [
      read(f"model.layers.{i}.{_LAYER_NAMES[(proj, kind)]}")
      for i in range(config.num_layers)
    ]
    if kind == "kernel":
      per_layer = [w.T for w in per_layer]
    layers.setdefault(proj, {})[kind] = as_param(np.stack(per_layer))
  params = {
    "embed": {"embedding": as_param(embed)},
    "layers": layers,
    "final_norm": {"scale": as_param(read(_FINAL_NORM))},
  }
  if not config.tie_word_embeddings:
    params["lm_head"] = {"kernel": as_param(read(_LM_HEAD).T)}
  if bad:
    raise _non_finite_error(bad, source)
  return params


# ---------------------------------------------------------- safetensors dir
@contextlib.contextmanager
def _named(file: str, action: str):
  """Errors of the safetensors reader (a truncated or damaged file) name
  the file and what was being read; they do not by themselves."""
  try:
    yield
  except Exception as e:  # safetensors raises its own SafetensorError
    raise ValueError(
      f"{file}: not a readable safetensors file ({action}: {e}); the file is "
      "truncated or damaged: copy or export it again"
    ) from e


class LazyStateDict(Mapping):
  """Tensors of safetensors files, read from disk on access.

  Loading a large checkpoint converts one tensor at a time instead of holding
  every file in memory next to the converted params.
  """

  def __init__(self, files: list[str]):
    self._where: dict[str, str] = {}
    for file in files:
      with _named(file, "reading its header"):
        with safe_open(file, framework="np") as f:
          names = list(f.keys())
      for name in names:
        if name in self._where:
          raise ValueError(
            f"tensor {name!r} appears in two files "
            f"({self._where[name]}, {file})"
          )
        self._where[name] = file

  def shape(self, name: str) -> tuple[int, ...]:
    file = self._where[name]
    with _named(file, f"reading tensor {name!r}"):
      with safe_open(file, framework="np") as f:
        return tuple(f.get_slice(name).get_shape())

  def __getitem__(self, name: str) -> np.ndarray:
    file = self._where[name]
    with _named(file, f"reading tensor {name!r}"):
      with safe_open(file, framework="np") as f:
        return f.get_tensor(name)

  def __iter__(self):
    return iter(self._where)

  def __len__(self):
    return len(self._where)


def load_hf_state_dict(path: str | os.PathLike) -> Mapping[str, np.ndarray]:
  """All tensors of an HF safetensors dir (single file or sharded index),
  as a lazily-read mapping name -> numpy array."""
  return LazyStateDict(safetensors_io.checkpoint_files(path))


def load_hf(
  path: str | os.PathLike, dtype=jnp.float32
) -> tuple[ModelConfig, dict[str, Any]]:
  """(config, params) from an HF Llama/Qwen2 safetensors dir."""
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"not a directory: {path!r}")
  config = ModelConfig.from_hf(path)
  return config, from_hf_state_dict(
    config, load_hf_state_dict(path), dtype, source=path
  )


def save_hf(
  config: ModelConfig,
  params: Mapping[str, Any],
  out_dir: str | os.PathLike,
  tokenizer=None,
  dtype: str = "bfloat16",
  max_shard_bytes: int = 2 * 2**30,
) -> str:
  """Writes an HF checkpoint dir that `AutoModelForCausalLM` and vLLM load.

  Float tensors are cast to `dtype` ("bfloat16", "float16" or "float32");
  quantized (QTensor) weights keep their dtype. Above `max_shard_bytes` the
  weights are split into `model-0000k-of-0000n.safetensors` files with a
  `model.safetensors.index.json`. Also writes config.json,
  generation_config.json and, if given, the tokenizer files.

  Returns:
    out_dir.
  """
  if dtype not in _SAVE_DTYPES:
    raise ValueError(f"dtype={dtype!r}; expected one of {sorted(_SAVE_DTYPES)}")
  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  target = _SAVE_DTYPES[dtype]
  tensors = {}
  for name, array in to_hf_state_dict(config, params).items():
    # Quantized weights (1-byte) and their float32 scales keep their dtype.
    is_float = jnp.issubdtype(array.dtype, jnp.floating)
    if is_float and array.dtype.itemsize > 1 and not name.endswith("_scale"):
      array = array.astype(target)
    tensors[name] = np.ascontiguousarray(array)

  for stale in os.listdir(out_dir):
    if stale.endswith(".safetensors") or stale == safetensors_io.INDEX_FILE:
      os.remove(os.path.join(out_dir, stale))
  safetensors_io.write_checkpoint(
    tensors, out_dir, max_shard_bytes, single_file=True
  )

  hf_config = config.to_hf()
  hf_config["torch_dtype"] = dtype
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  generation = {
    "bos_token_id": config.bos_token_id,
    "eos_token_id": hf_config["eos_token_id"],
  }
  if config.pad_token_id is not None:
    generation["pad_token_id"] = config.pad_token_id
  with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
    json.dump(generation, f, indent=2)
  if tokenizer is not None:
    tokenizer.save_pretrained(out_dir)
  return out_dir
