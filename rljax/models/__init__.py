"""rljax.models: the Llama/Qwen2 decoder in JAX, its checkpoints and layout.

Pure functions over a params dict (docs/CONTRACTS.md); see `decoder`.
"""

from rljax.models.config import ModelConfig
from rljax.models.decoder import (
  Decoder,
  check_params,
  compute_dtype,
  final_hidden_states,
  forward,
  forward_with_cache,
  init_cache,
  init_decode_cache,
  init_params,
  logits_from_hidden,
  param_shapes,
  positions_from_mask,
)
from rljax.models.gguf_io import load_gguf
from rljax.models.hf_io import (
  from_hf_state_dict,
  load_hf,
  load_hf_state_dict,
  save_hf,
  to_hf_state_dict,
)
from rljax.models.logprobs import logprobs_from_logits, token_logprobs
from rljax.models.presets import PRESETS, preset, tiny_config
from rljax.models.pretrained import (
  DEFAULT_MODEL,
  Model,
  default_gguf_path,
  load_named,
  load_pretrained,
)
from rljax.models.quant_export import (
  compressed_tensors_state_dict,
  export_compressed_tensors_fp8,
  export_compressed_tensors_int8,
  quantization_config,
)
from rljax.models.sharding import (
  batch_sharding,
  cache_shardings,
  make_mesh,
  param_shardings,
  shard_batch,
  shard_params,
)
from rljax.models.tokenizer import load_tokenizer
from rljax.models.value import init_critic, init_value_head, value_forward

__all__ = [
  "DEFAULT_MODEL",
  "Decoder",
  "Model",
  "ModelConfig",
  "PRESETS",
  "batch_sharding",
  "cache_shardings",
  "check_params",
  "compressed_tensors_state_dict",
  "compute_dtype",
  "default_gguf_path",
  "export_compressed_tensors_fp8",
  "export_compressed_tensors_int8",
  "final_hidden_states",
  "forward",
  "forward_with_cache",
  "from_hf_state_dict",
  "init_cache",
  "init_decode_cache",
  "init_critic",
  "init_params",
  "init_value_head",
  "load_gguf",
  "load_hf",
  "load_hf_state_dict",
  "load_named",
  "load_pretrained",
  "load_tokenizer",
  "logits_from_hidden",
  "logprobs_from_logits",
  "make_mesh",
  "param_shapes",
  "param_shardings",
  "positions_from_mask",
  "preset",
  "quantization_config",
  "save_hf",
  "shard_batch",
  "shard_params",
  "tiny_config",
  "to_hf_state_dict",
  "token_logprobs",
  "value_forward",
]
