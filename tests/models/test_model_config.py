"""ModelConfig: HF config.json in/out, presets, validation."""

import json

import jax
import pytest

from rljax import models


class TestPresets:
  @pytest.mark.parametrize(
    "name, expected",
    [
      # Parameter counts that the model cards report.
      ("smollm2-135m", 134_515_008),
      ("qwen2.5-0.5b", 494_032_768),
      ("qwen2.5-7b", 7_615_616_512),
      ("llama-3.2-1b", 1_235_814_400),
      ("deepseek-r1-distill-qwen-1.5b", 1_777_088_000),
    ],
  )
  def test_num_params_matches_model_card(self, name, expected):
    assert models.preset(name).num_params() == expected

  def test_num_params_counts_init_params(self):
    config = models.tiny_config(arch="qwen2", tie_word_embeddings=True)
    params = jax.eval_shape(
      lambda: models.init_params(config, jax.random.PRNGKey(0))
    )
    assert sum(x.size for x in jax.tree.leaves(params)) == config.num_params()

  def test_lookup_is_case_insensitive_and_ignores_org(self):
    assert models.preset("Qwen/Qwen2.5-1.5B") is models.PRESETS["qwen2.5-1.5b"]

  def test_unknown_preset_names_known_ones(self):
    with pytest.raises(ValueError, match="unknown preset 'gpt2'.*smollm2-135m"):
      models.preset("gpt2")

  def test_overrides(self):
    assert models.preset("smollm2-135m", num_layers=2).num_layers == 2

  @pytest.mark.parametrize("name", sorted(models.PRESETS))
  def test_hf_round_trip(self, name):
    config = models.PRESETS[name]
    assert models.ModelConfig.from_hf(config.to_hf()) == config


class TestFromHf:
  def test_llama3_rope_scaling_and_eos_list(self):
    hf = {
      "model_type": "llama",
      "vocab_size": 128256,
      "hidden_size": 2048,
      "intermediate_size": 8192,
      "num_hidden_layers": 16,
      "num_attention_heads": 32,
      "num_key_value_heads": 8,
      "rope_theta": 500000.0,
      "rms_norm_eps": 1e-5,
      "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
      },
      "tie_word_embeddings": True,
      "max_position_embeddings": 131072,
      "bos_token_id": 128000,
      "eos_token_id": [128001, 128008, 128009],
    }
    config = models.ModelConfig.from_hf(hf)
    assert config == models.preset("llama-3.2-1b-instruct")
    assert config.head_dim == 64
    assert config.eos_token_ids == (128001, 128008, 128009)
    hash(config)  # static jit argument

  def test_transformers5_rope_parameters(self):
    hf = models.preset("qwen2.5-0.5b").to_hf()
    del hf["rope_theta"], hf["rope_scaling"]
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    config = models.ModelConfig.from_hf(hf)
    assert config.rope_theta == 1e6 and config.rope_scaling is None

  def test_legacy_linear_type_key(self):
    hf = models.tiny_config().to_hf()
    hf["rope_scaling"] = {"type": "linear", "factor": 2.0}
    assert models.ModelConfig.from_hf(hf).rope_scaling_dict == {
      "rope_type": "linear",
      "factor": 2.0,
    }

  def test_reads_dir_and_file(self, tmp_path):
    config = models.tiny_config(arch="qwen2")
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf()))
    assert models.ModelConfig.from_hf(tmp_path) == config
    assert models.ModelConfig.from_hf(tmp_path / "config.json") == config

  def test_qwen2_has_bias(self):
    assert models.tiny_config(arch="qwen2").has_qkv_bias
    assert not models.tiny_config().has_qkv_bias

  @pytest.mark.parametrize(
    "field, value, message",
    [
      ("model_type", "gpt2", "model_type='gpt2'"),
      ("hidden_act", "gelu", "hidden_act='gelu'"),
      ("use_sliding_window", True, "use_sliding_window"),
      ("mlp_bias", True, "mlp_bias"),
    ],
  )
  def test_unsupported_fields_are_named(self, field, value, message):
    hf = models.tiny_config().to_hf()
    hf[field] = value
    with pytest.raises(ValueError, match=message):
      models.ModelConfig.from_hf(hf)

  def test_missing_required_field(self):
    hf = models.tiny_config().to_hf()
    del hf["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
      models.ModelConfig.from_hf(hf)


class TestValidation:
  @pytest.mark.parametrize(
    "overrides, message",
    [
      ({"arch": "mistral"}, "arch='mistral'"),
      ({"num_kv_heads": 3}, "num_kv_heads=3"),
      ({"head_dim": 7}, "head_dim=7"),
      ({"hidden_size": 0}, "hidden_size=0"),
      ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn'"),
      ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
    ],
  )
  def test_bad_values_are_named(self, overrides, message):
    with pytest.raises(ValueError, match=message):
      models.tiny_config(**overrides)

  def test_bad_token_id_type(self):
    with pytest.raises(TypeError, match="bos_token_id"):
      models.tiny_config(bos_token_id="<s>")
