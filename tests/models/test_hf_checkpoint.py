"""HF name mapping and safetensors dirs, checked against transformers."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.quant.qtensor import QTensor

LLAMA = models.tiny_config(
  rope_scaling={
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
  }
)
QWEN2 = models.tiny_config(
  arch="qwen2", tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6
)
forward = jax.jit(models.forward, static_argnums=0)


def _torch_logits(directory, tokens, mask=None):
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top

  model = AutoModelForCausalLM.from_pretrained(
    directory, dtype=torch.float32, attn_implementation="eager"
  ).eval()
  kwargs = {}
  if mask is not None:
    kwargs["attention_mask"] = torch.tensor(np.asarray(mask))
    kwargs["position_ids"] = torch.tensor(
      np.asarray(models.positions_from_mask(mask)), dtype=torch.long
    )
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(np.asarray(tokens), dtype=torch.long), **kwargs
    )
  return out.logits.numpy()


def _batch(config):
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, config.vocab_size, (2, 24)).astype(np.int32)
  mask = np.ones_like(tokens)
  tokens[0, :5], mask[0, :5] = 0, 0
  return jnp.asarray(tokens), jnp.asarray(mask)


@pytest.mark.parametrize("config", [LLAMA, QWEN2], ids=["llama", "qwen2"])
def test_transformers_loads_saved_dir(tmp_path, random_params, config):
  params = random_params(config)
  models.save_hf(config, params, tmp_path, dtype="float32")
  tokens, mask = _batch(config)
  theirs = _torch_logits(tmp_path, tokens, mask)
  ours = np.asarray(forward(config, params, tokens, mask))
  valid = np.asarray(mask, bool)
  np.testing.assert_allclose(ours[valid], theirs[valid], atol=1e-4)


def test_load_dir_written_by_transformers(tmp_path):
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import Qwen2Config, Qwen2ForCausalLM  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  hf_config = Qwen2Config(
    **{
      k: v
      for k, v in QWEN2.to_hf().items()
      if k not in ("architectures", "model_type")
    }
  )
  model = Qwen2ForCausalLM(hf_config).eval()
  with torch.no_grad():  # HF init zeroes biases and sets norms to 1
    for name, p in model.named_parameters():
      if name.endswith(("bias", "norm.weight", "layernorm.weight")):
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(tmp_path)
  config, params = models.load_hf(tmp_path)
  assert config == QWEN2
  tokens, _ = _batch(config)
  with torch.no_grad():
    theirs = model(
      input_ids=torch.tensor(np.asarray(tokens), dtype=torch.long)
    ).logits.numpy()
  np.testing.assert_allclose(forward(config, params, tokens), theirs, atol=1e-4)
  # load -> save -> load is the identity.
  models.save_hf(config, params, tmp_path / "again", dtype="float32")
  config2, params2 = models.load_hf(tmp_path / "again")
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params, params2)


@pytest.mark.parametrize("config", [LLAMA, QWEN2], ids=["llama", "qwen2"])
def test_state_dict_round_trip(random_params, config):
  params = random_params(config)
  sd = models.to_hf_state_dict(config, params)
  assert sd["model.layers.1.self_attn.q_proj.weight"].shape == (32, 32)
  assert sd["model.layers.0.mlp.down_proj.weight"].shape == (32, 64)
  np.testing.assert_array_equal(
    sd["model.layers.1.mlp.up_proj.weight"],
    np.asarray(params["layers"]["up_proj"]["kernel"][1]).T,
  )
  assert ("lm_head.weight" in sd) == (not config.tie_word_embeddings)
  back = models.from_hf_state_dict(config, sd)
  jax.tree.map(np.testing.assert_array_equal, params, back)


def test_sharded_save_and_bf16(tmp_path, random_params):
  params = random_params(LLAMA)
  models.save_hf(LLAMA, params, tmp_path, max_shard_bytes=20_000)
  with open(tmp_path / "model.safetensors.index.json") as f:
    index = json.load(f)
  files = set(index["weight_map"].values())
  assert len(files) > 1
  assert all(os.path.isfile(tmp_path / f) for f in files)
  assert not os.path.exists(tmp_path / "model.safetensors")
  sd = models.load_hf_state_dict(tmp_path)
  assert str(sd["model.embed_tokens.weight"].dtype) == "bfloat16"
  _, loaded = models.load_hf(tmp_path)
  rounded = jax.tree.map(
    lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params
  )
  jax.tree.map(np.testing.assert_array_equal, rounded, loaded)
  with open(tmp_path / "generation_config.json") as f:
    assert json.load(f)["eos_token_id"] == LLAMA.eos_token_id


def test_tokenizer_files_are_written(tmp_path, random_params):
  class FakeTokenizer:
    def save_pretrained(self, directory):
      with open(os.path.join(directory, "tokenizer.json"), "w") as f:
        f.write("{}")

  models.save_hf(LLAMA, random_params(LLAMA), tmp_path, FakeTokenizer())
  assert (tmp_path / "tokenizer.json").exists()


class TestStrictLoading:
  @pytest.fixture
  def sd(self, random_params):
    return models.to_hf_state_dict(LLAMA, random_params(LLAMA))

  def test_missing(self, sd):
    del sd["model.layers.1.mlp.gate_proj.weight"]
    with pytest.raises(KeyError, match=r"missing.*layers\.1\.mlp\.gate_proj"):
      models.from_hf_state_dict(LLAMA, sd)

  def test_unexpected(self, sd):
    sd["model.layers.2.mlp.gate_proj.weight"] = np.zeros((64, 32))
    with pytest.raises(KeyError, match=r"unexpected.*layers\.2\.mlp"):
      models.from_hf_state_dict(LLAMA, sd)

  def test_shape_mismatch(self, sd):
    sd["model.layers.0.self_attn.k_proj.weight"] = np.zeros((32, 32))
    with pytest.raises(
      ValueError, match=r"k_proj.weight.*\(32, 32\); expected \(16, 32\)"
    ):
      models.from_hf_state_dict(LLAMA, sd)

  def test_rotary_buffers_are_ignored(self, sd):
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.zeros(4)
    models.from_hf_state_dict(LLAMA, sd)

  def test_tied_lm_head_must_equal_embedding(self, random_params):
    sd = models.to_hf_state_dict(QWEN2, random_params(QWEN2))
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].copy()
    models.from_hf_state_dict(QWEN2, sd)  # a redundant copy is fine
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1
    with pytest.raises(ValueError, match="lm_head.weight"):
      models.from_hf_state_dict(QWEN2, sd)

  def test_bad_save_dtype(self, tmp_path, random_params):
    with pytest.raises(ValueError, match="dtype='int4'"):
      models.save_hf(LLAMA, random_params(LLAMA), tmp_path, dtype="int4")


def test_qtensor_exports_weight_scale(random_params):
  params = random_params(LLAMA)
  kernel = params["layers"]["q_proj"]["kernel"]
  scale = jnp.max(jnp.abs(kernel), axis=-2, keepdims=True) / 127
  q = QTensor(value=jnp.round(kernel / scale).astype(jnp.int8), scale=scale)
  params["layers"]["q_proj"]["kernel"] = q
  sd = models.to_hf_state_dict(LLAMA, params)
  w = sd["model.layers.1.self_attn.q_proj.weight"]
  s = sd["model.layers.1.self_attn.q_proj.weight_scale"]
  assert w.dtype == np.int8 and w.shape == (32, 32) and s.shape == (32, 1)
  np.testing.assert_allclose(
    w * s, np.asarray(kernel[1]).T, atol=float(scale.max()) / 2 + 1e-7
  )


def test_load_pretrained_dir_without_tokenizer(tmp_path, random_params):
  params = random_params(QWEN2)
  models.save_hf(QWEN2, params, tmp_path, dtype="float32")
  model = models.load_pretrained(str(tmp_path))
  assert model.config == QWEN2 and model.tokenizer is None
  jax.tree.map(np.testing.assert_array_equal, params, model.params)
  bf16 = models.load_pretrained(tmp_path, dtype=jnp.bfloat16)
  assert models.compute_dtype(bf16.params) == jnp.bfloat16


def test_non_finite_weights_are_named_at_load(tmp_path, random_params):
  params = random_params(LLAMA)
  sd = {
    k: np.array(v) for k, v in models.to_hf_state_dict(LLAMA, params).items()
  }
  sd["model.layers.0.self_attn.k_proj.weight"][0, 0] = np.nan
  sd["model.norm.weight"][:3] = np.inf
  params = models.from_hf_state_dict(LLAMA, sd, check_finite=False)
  models.save_hf(LLAMA, params, tmp_path, dtype="bfloat16")
  with pytest.raises(ValueError) as info:
    models.load_hf(tmp_path)
  message = str(info.value)
  assert str(tmp_path) in message and "2 tensor(s)" in message
  assert "'model.layers.0.self_attn.k_proj.weight': 1 NaN, 0 inf" in message
  assert "'model.norm.weight': 0 NaN, 3 inf of 32 values" in message


def test_training_from_a_dir_without_tokenizer_names_the_files(
  tmp_path, random_params
):
  from rljax.train import loop  # pylint: disable=g-import-not-at-top
  from rljax.train.config import apply_preset  # pylint: disable=g-import-not-at-top

  models.save_hf(QWEN2, random_params(QWEN2), tmp_path, dtype="float32")
  cfg = apply_preset(
    "grpo", {"model.name": str(tmp_path), "run.run_dir": str(tmp_path / "r")}
  )
  with pytest.raises(FileNotFoundError) as info:
    loop.load_policy(cfg, seed=0)
  message = str(info.value)
  assert str(tmp_path) in message and "has no tokenizer" in message
  assert "tokenizer.json" in message and "tokenizer_config.json" in message
  with pytest.raises(FileNotFoundError, match="has no tokenizer"):
    models.load_tokenizer(tmp_path)


class TestDamagedInputsAreNamed:
  """A damaged checkpoint file, an ambiguous directory or integer weights
  are refused with the file's name (never loaded as silent garbage)."""

  def test_a_truncated_safetensors_file_is_named(self, tmp_path, random_params):
    models.save_hf(QWEN2, random_params(QWEN2), tmp_path, dtype="float32")
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors.*truncated"):
      models.load_hf(tmp_path)
    path.write_bytes(data[:100])  # inside the JSON header
    with pytest.raises(ValueError, match=r"model\.safetensors"):
      models.load_hf(tmp_path)

  def test_a_broken_config_json_is_named(self, tmp_path, random_params):
    models.save_hf(QWEN2, random_params(QWEN2), tmp_path, dtype="float32")
    (tmp_path / "config.json").write_text('{"model_type": "qwen2",')
    with pytest.raises(ValueError, match=r"config\.json: not a valid JSON"):
      models.load_hf(tmp_path)

  def test_shards_beside_a_single_file_are_refused(
    self, tmp_path, random_params
  ):
    params = random_params(QWEN2)
    models.save_hf(QWEN2, params, tmp_path, max_shard_bytes=20_000)
    models.save_hf(QWEN2, params, tmp_path / "single", dtype="float32")
    os.replace(
      tmp_path / "single" / "model.safetensors", tmp_path / "model.safetensors"
    )
    with pytest.raises(ValueError) as e:
      models.load_hf(tmp_path)
    assert "model.safetensors.index.json" in str(e.value)
    assert "and model.safetensors" in str(e.value)

  def test_integer_weights_are_refused_by_name(self, random_params):
    sd = {
      k: np.array(v)
      for k, v in models.to_hf_state_dict(QWEN2, random_params(QWEN2)).items()
    }
    name = "model.layers.1.mlp.up_proj.weight"
    sd[name] = sd[name].astype(np.int32)
    with pytest.raises(ValueError, match=f"'{name}' holds int32"):
      models.from_hf_state_dict(QWEN2, sd, source="d")
