"""GGUF loading on small files written with gguf.GGUFWriter."""

import os

import gguf
import jax
import numpy as np
import pytest

from rljax import models
from rljax.models import gguf_io

_GGUF_NAMES = {  # HF suffix -> GGUF block name
  "input_layernorm.weight": "attn_norm.weight",
  "self_attn.q_proj.weight": "attn_q.weight",
  "self_attn.k_proj.weight": "attn_k.weight",
  "self_attn.v_proj.weight": "attn_v.weight",
  "self_attn.q_proj.bias": "attn_q.bias",
  "self_attn.k_proj.bias": "attn_k.bias",
  "self_attn.v_proj.bias": "attn_v.bias",
  "self_attn.o_proj.weight": "attn_output.weight",
  "post_attention_layernorm.weight": "ffn_norm.weight",
  "mlp.gate_proj.weight": "ffn_gate.weight",
  "mlp.up_proj.weight": "ffn_up.weight",
  "mlp.down_proj.weight": "ffn_down.weight",
}


def llama_cpp_permute(w, n_head):
  """llama.cpp convert_hf_to_gguf's q/k permutation (the forward direction)."""
  return (
    w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
    .swapaxes(1, 2)
    .reshape(w.shape)
  )


def write_gguf(path, config, sd, quant=None, arch=None, tensor_override=None):
  """A GGUF file holding HF state dict `sd` the way llama.cpp converts it."""
  w = gguf.GGUFWriter(str(path), arch or config.arch)
  w.add_block_count(config.num_layers)
  w.add_context_length(config.max_position_embeddings)
  w.add_embedding_length(config.hidden_size)
  w.add_feed_forward_length(config.intermediate_size)
  w.add_head_count(config.num_heads)
  w.add_head_count_kv(config.num_kv_heads)
  w.add_rope_freq_base(config.rope_theta)
  w.add_layer_norm_rms_eps(config.rms_norm_eps)
  w.add_vocab_size(config.vocab_size)
  w.add_bos_token_id(config.bos_token_id)
  w.add_eos_token_id(config.eos_token_id)
  w.add_pad_token_id(config.pad_token_id)
  for name, array in sd.items():
    array = np.asarray(array, np.float32)
    if name.startswith("model.layers."):
      _, _, i, suffix = name.split(".", 3)
      gname = f"blk.{i}.{_GGUF_NAMES[suffix]}"
    else:
      gname = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
      }[name]
    if config.arch == "llama" and ".attn_q." in gname:
      array = llama_cpp_permute(array, config.num_heads)
    elif config.arch == "llama" and ".attn_k." in gname:
      array = llama_cpp_permute(array, config.num_kv_heads)
    if tensor_override and gname in tensor_override:
      w.add_tensor(gname, tensor_override[gname])
    elif quant is not None and array.ndim == 2:
      w.add_tensor(gname, gguf.quants.quantize(array, quant), raw_dtype=quant)
    else:
      w.add_tensor(gname, array)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def test_unpermute_inverts_llama_cpp_permute():
  w = np.arange(8 * 3 * 4, dtype=np.float32).reshape(24, 4)
  for heads in (1, 3, 6):
    permuted = llama_cpp_permute(w, heads)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(gguf_io.unpermute_qk_rows(permuted, heads), w)


@pytest.mark.parametrize(
  "config",
  [
    models.tiny_config(),
    models.tiny_config(arch="qwen2", tie_word_embeddings=True),
  ],
  ids=["llama", "qwen2-tied"],
)
def test_f32_file_round_trips(tmp_path, random_params, config):
  params = random_params(config)
  path = write_gguf(
    tmp_path / "m.gguf", config, models.to_hf_state_dict(config, params)
  )
  loaded_config, loaded = models.load_gguf(path)
  assert loaded_config == config.replace(rope_scaling=None)
  jax.tree.map(np.testing.assert_array_equal, params, loaded)


def test_q8_0_file_is_dequantized(tmp_path, random_params):
  config = models.tiny_config()
  params = random_params(config)
  sd = models.to_hf_state_dict(config, params)
  path = write_gguf(
    tmp_path / "m.gguf", config, sd, quant=gguf.GGMLQuantizationType.Q8_0
  )
  _, loaded = models.load_gguf(path)
  q = np.asarray(loaded["layers"]["q_proj"]["kernel"][1]).T
  exact = sd["model.layers.1.self_attn.q_proj.weight"]
  # Q8_0: 32-value blocks scaled by max|x|/127, so error <= half a step.
  assert 0 < np.abs(q - exact).max() <= np.abs(exact).max() / 127
  np.testing.assert_array_equal(
    loaded["final_norm"]["scale"], params["final_norm"]["scale"]
  )  # F32 as is


def test_unsupported_tensor_type_is_named(tmp_path, random_params):
  config = models.tiny_config()
  sd = models.to_hf_state_dict(config, random_params(config))
  path = write_gguf(
    tmp_path / "m.gguf",
    config,
    sd,
    tensor_override={"blk.0.ffn_up.weight": np.zeros((64, 32), np.int8)},
  )
  with pytest.raises(ValueError, match=r"'blk\.0\.ffn_up\.weight' has type I8"):
    models.load_gguf(path)


def test_unsupported_architecture_is_named(tmp_path, random_params):
  config = models.tiny_config()
  sd = models.to_hf_state_dict(config, random_params(config))
  path = write_gguf(tmp_path / "m.gguf", config, sd, arch="gpt2")
  with pytest.raises(ValueError, match="general.architecture='gpt2'"):
    models.load_gguf(path)


def test_missing_tensor_is_named(tmp_path, random_params):
  config = models.tiny_config()
  sd = models.to_hf_state_dict(config, random_params(config))
  del sd["model.layers.1.mlp.down_proj.weight"]
  path = write_gguf(tmp_path / "m.gguf", config, sd)
  with pytest.raises(KeyError, match=r"layers\.1\.mlp\.down_proj"):
    models.load_gguf(path)


def test_missing_file():
  with pytest.raises(FileNotFoundError):
    models.load_pretrained("/nonexistent/model.gguf")


class TestDamagedFiles:
  """A cut or corrupted GGUF file is a ValueError naming the file and what is
  wrong, not a reshape/IndexError from inside gguf."""

  @pytest.fixture
  def gguf_bytes(self, tmp_path, random_params):
    config = models.tiny_config()
    sd = models.to_hf_state_dict(config, random_params(config))
    path = write_gguf(tmp_path / "whole.gguf", config, sd)
    return path.read_bytes()

  @pytest.mark.parametrize("fraction", [0.5, 0.9, 0.999])
  def test_file_cut_in_tensor_data_names_expected_bytes(
    self, tmp_path, gguf_bytes, fraction
  ):
    path = tmp_path / "cut.gguf"
    path.write_bytes(gguf_bytes[: int(len(gguf_bytes) * fraction)])
    with pytest.raises(ValueError) as info:
      models.load_gguf(path)
    message = str(info.value)
    assert str(path) in message and "truncated" in message
    assert f"expected at least {len(gguf_bytes)} bytes" in message
    assert f"found {path.stat().st_size}" in message

  @pytest.mark.parametrize("size", [10, 100, 600])
  def test_file_cut_in_metadata_names_the_file(
    self, tmp_path, gguf_bytes, size
  ):
    path = tmp_path / "cut.gguf"
    path.write_bytes(gguf_bytes[:size])
    with pytest.raises(ValueError, match="truncated or corrupt") as info:
      models.load_gguf(path)
    assert str(path) in str(info.value) and f"({size} bytes)" in str(info.value)

  def test_shipped_smollm2_file_cut_in_half(self, tmp_path):
    source = models.default_gguf_path()
    path = tmp_path / "half.gguf"
    with open(source, "rb") as f:
      path.write_bytes(f.read(os.path.getsize(source) // 2))
    with pytest.raises(
      ValueError,
      match=r"is truncated: expected at least "
      f"{os.path.getsize(source)} bytes",
    ):
      models.load_pretrained(str(path))

  def test_not_a_gguf_file(self, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(
      ValueError,
      match=r"not a GGUF file: it starts with "
      r"b'PK\\x03\\x04'",
    ):
      models.load_gguf(path)

  @pytest.mark.parametrize("bad", [np.nan, np.inf])
  def test_non_finite_weight_is_named_at_load(
    self, tmp_path, random_params, bad
  ):
    config = models.tiny_config()
    sd = models.to_hf_state_dict(config, random_params(config))
    name = "model.layers.1.mlp.up_proj.weight"
    sd[name] = np.array(sd[name])  # the export's arrays may be read-only
    sd[name][3, :2] = bad
    path = write_gguf(tmp_path / "m.gguf", config, sd)
    kind = "NaN" if np.isnan(bad) else "inf"
    counts = "2 NaN, 0 inf" if kind == "NaN" else "0 NaN, 2 inf"
    with pytest.raises(ValueError) as info:
      models.load_gguf(path)
    message = str(info.value)
    assert str(path) in message
    assert f"'model.layers.1.mlp.up_proj.weight': {counts}" in message
