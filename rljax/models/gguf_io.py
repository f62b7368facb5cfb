"""Reading llama.cpp GGUF files (Llama/Qwen2) into rljax params.

Weights are dequantized to float32 with the `gguf` package (the same routine
transformers' GGUF loader uses, so both sides see identical values). For the
Llama architecture llama.cpp's converter permutes the rows of q/k so that
RoPE pairs are interleaved (GPT-J layout); the HF/rljax rotate-half layout
needs that permutation undone.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import jax.numpy as jnp
import numpy as np

from rljax.models import hf_io
from rljax.models.config import ARCHS, ModelConfig

# Tensor types this loader dequantizes (gguf.GGMLQuantizationType names).
SUPPORTED_TENSOR_TYPES = (
  "F32",
  "F16",
  "BF16",
  "Q4_0",
  "Q4_1",
  "Q5_0",
  "Q5_1",
  "Q8_0",
  "Q2_K",
  "Q3_K",
  "Q4_K",
  "Q5_K",
  "Q6_K",
)

# GGUF name -> HF name suffix (after "model.layers.{i}."), per block.
_BLOCK_NAMES = {
  "attn_norm.weight": "input_layernorm.weight",
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_q.bias": "self_attn.q_proj.bias",
  "attn_k.bias": "self_attn.k_proj.bias",
  "attn_v.bias": "self_attn.v_proj.bias",
  "attn_output.weight": "self_attn.o_proj.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}


class _TruncatedError(ValueError):
  """Tensor data past the end of the file: (bytes needed, tensor names)."""

  def __init__(self, needed: int, names: list[str], total: int):
    super().__init__(needed, names, total)
    self.needed, self.names, self.total = needed, names, total


def _check_tensor_extents(ends: list[tuple[int, str]], size: int) -> None:
  short = [name for end, name in ends if end > size]
  if short:
    raise _TruncatedError(max(end for end, _ in ends), short, len(ends))


def _checked_reader_class():
  import gguf  # pylint: disable=g-import-not-at-top

  class CheckedReader(gguf.GGUFReader):
    """Checks that every tensor lies inside the file before gguf slices its
    data (gguf's memory map slices past the end without a word and then
    fails in a reshape)."""

    def _build_tensors(self, start_offs, fields):
      ends = []
      for field in fields:
        _, name_data, _, dims, raw_dtype, offset_tensor = field.parts
        block, type_size = gguf.GGML_QUANT_SIZES[
          gguf.GGMLQuantizationType(raw_dtype[0])
        ]
        n_bytes = int(np.prod(dims)) * type_size // block
        ends.append(
          (
            int(start_offs + offset_tensor[0]) + n_bytes,
            bytes(name_data).decode("utf-8", "replace"),
          )
        )
      _check_tensor_extents(ends, len(self.data))
      super()._build_tensors(start_offs, fields)

  return CheckedReader


def _reader(path: str):
  """A GGUFReader whose every tensor lies inside the file.

  A cut or corrupt file is a ValueError naming the path, its size and, when
  tensor data is missing, how many bytes the tensors need.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no GGUF file at {path!r}")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != b"GGUF":
    raise ValueError(
      f"{path!r} is not a GGUF file: it starts with "
      f"{magic!r}, expected b'GGUF' ({size} bytes)"
    )
  try:
    reader = _checked_reader_class()(path)
    # Again on the result, should a gguf version build tensors elsewhere.
    _check_tensor_extents(
      [(t.data_offset + t.n_bytes, t.name) for t in reader.tensors], size
    )
  except _TruncatedError as e:
    shown = ", ".join(repr(n) for n in e.names[:4])
    more = f" and {len(e.names) - 4} more" if len(e.names) > 4 else ""
    raise ValueError(
      f"GGUF file {path!r} is truncated: expected at least {e.needed} "
      f"bytes (where its last tensor ends), found {size}; {len(e.names)} "
      f"of {e.total} tensors extend past the end ({shown}{more})"
    ) from None
  except (
    ValueError,
    IndexError,
    KeyError,
    OverflowError,
    UnicodeDecodeError,
    struct.error,
  ) as e:
    raise ValueError(
      f"GGUF file {path!r} ({size} bytes) is truncated or corrupt: its "
      f"header/metadata cannot be parsed ({type(e).__name__}: {e})"
    ) from None
  return reader


def read_metadata(reader) -> dict[str, Any]:
  """GGUF key/value metadata as plain Python values (token lists skipped)."""
  out = {}
  for key, field in reader.fields.items():
    if key in (
      "tokenizer.ggml.tokens",
      "tokenizer.ggml.merges",
      "tokenizer.ggml.token_type",
      "tokenizer.ggml.scores",
    ):
      continue
    out[key] = field.contents()
  return out


def _f32_value(x) -> float:
  """GGUF stores floats as float32: 1e-5 reads back as 9.9999997e-06. The
  shortest decimal that rounds to the same float32 recovers the intended
  value (identical once cast to float32 for compute)."""
  return float(str(np.float32(x)))


def config_from_gguf_metadata(
  metadata: dict[str, Any], tensor_names: set[str]
) -> ModelConfig:
  """ModelConfig from GGUF metadata keys (`{arch}.block_count`, ...)."""
  arch = metadata.get("general.architecture")
  if arch not in ARCHS:
    raise ValueError(f"GGUF general.architecture={arch!r}; supported: {ARCHS}")

  def get(key, default=None, required=False):
    full = f"{arch}.{key}"
    if full not in metadata:
      if required:
        raise ValueError(f"GGUF metadata lacks required field {full!r}")
      return default
    return metadata[full]

  hidden = int(get("embedding_length", required=True))
  num_heads = int(get("attention.head_count", required=True))
  vocab = get("vocab_size")
  if vocab is None:
    raise ValueError(f"GGUF metadata lacks {arch}.vocab_size")
  rope_scaling = None
  scaling_type = get("rope.scaling.type", "none")
  if scaling_type == "linear":
    rope_scaling = {
      "rope_type": "linear",
      "factor": _f32_value(get("rope.scaling.factor", required=True)),
    }
  elif scaling_type not in ("none", None):
    raise ValueError(
      f"GGUF {arch}.rope.scaling.type={scaling_type!r}; "
      "supported: 'none', 'linear'"
    )
  if "rope_freqs.weight" in tensor_names:
    raise ValueError(
      "GGUF tensor 'rope_freqs.weight' (llama3 rope scaling "
      "factors) is not supported; load the HF safetensors "
      "checkpoint instead"
    )
  return ModelConfig(
    arch=arch,
    vocab_size=int(vocab),
    hidden_size=hidden,
    intermediate_size=int(get("feed_forward_length", required=True)),
    num_layers=int(get("block_count", required=True)),
    num_heads=num_heads,
    num_kv_heads=int(get("attention.head_count_kv", num_heads)),
    head_dim=int(get("attention.key_length", hidden // num_heads)),
    rope_theta=_f32_value(get("rope.freq_base", 10000.0)),
    rope_scaling=rope_scaling,
    rms_norm_eps=_f32_value(get("attention.layer_norm_rms_epsilon", 1e-5)),
    tie_word_embeddings="output.weight" not in tensor_names,
    attention_bias="blk.0.attn_q.bias" in tensor_names,
    max_position_embeddings=int(get("context_length", 4096)),
    bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
    eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
    pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
  )


def unpermute_qk_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's q/k row permutation for the Llama architecture.

  llama.cpp stores, within each head, rows in interleaved pair order
  (r0, r_{h/2}, r1, r_{h/2+1}, ...); rotate-half wants the first half of the
  head's rows, then the second. Works on [out, in] weights and [out] biases.
  """
  rows = weight.shape[0]
  if rows % (2 * num_heads):
    raise ValueError(
      f"q/k weight with {rows} rows cannot be split into "
      f"{num_heads} heads of pairs"
    )
  half = rows // num_heads // 2
  w = weight.reshape(num_heads, half, 2, *weight.shape[1:])
  return np.swapaxes(w, 1, 2).reshape(weight.shape)


def _dequantize(tensor) -> np.ndarray:
  import gguf  # pylint: disable=g-import-not-at-top

  type_name = tensor.tensor_type.name
  if type_name not in SUPPORTED_TENSOR_TYPES:
    raise ValueError(
      f"GGUF tensor {tensor.name!r} has type {type_name}; "
      f"supported: {', '.join(SUPPORTED_TENSOR_TYPES)}"
    )
  array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
  shape = tuple(int(n) for n in reversed(tensor.shape))
  return np.asarray(array, dtype=np.float32).reshape(shape)


def gguf_to_hf_state_dict(reader, config: ModelConfig) -> dict[str, np.ndarray]:
  """Dequantized tensors under HF names, q/k un-permuted for Llama.

  Unknown GGUF tensor names are an error that names them.
  """
  state_dict = {}
  for tensor in reader.tensors:
    name = tensor.name
    if name in _GLOBAL_NAMES:
      hf_name = _GLOBAL_NAMES[name]
    else:
      parts = name.split(".", 2)
      if (
        len(parts) != 3
        or parts[0] != "blk"
        or not parts[1].isdigit()
        or parts[2] not in _BLOCK_NAMES
      ):
        raise KeyError(f"GGUF tensor {name!r} has no rljax counterpart")
      hf_name = f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}"
    array = _dequantize(tensor)
    if config.arch == "llama":
      if name.endswith((".attn_q.weight", ".attn_q.bias")):
        array = unpermute_qk_rows(array, config.num_heads)
      elif name.endswith((".attn_k.weight", ".attn_k.bias")):
        array = unpermute_qk_rows(array, config.num_kv_heads)
    state_dict[hf_name] = array
  return state_dict


def load_gguf(
  path: str | os.PathLike, dtype=jnp.float32
) -> tuple[ModelConfig, dict[str, Any]]:
  """(config, params) from a Llama/Qwen2 GGUF file, dequantized to `dtype`."""
  reader = _reader(os.fspath(path))
  metadata = read_metadata(reader)
  names = {t.name for t in reader.tensors}
  vocab_key = f"{metadata.get('general.architecture')}.vocab_size"
  if vocab_key not in metadata and "token_embd.weight" in names:
    # Older converters omit the key; the embedding's row count is the vocab.
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    metadata[vocab_key] = int(embd.shape[-1])
  config = config_from_gguf_metadata(metadata, names)
  state_dict = gguf_to_hf_state_dict(reader, config)
  return config, hf_io.from_hf_state_dict(
    config, state_dict, dtype, source=os.fspath(path)
  )
