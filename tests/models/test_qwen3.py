"""Qwen3 (dense): config, presets, HF checkpoints, parity with transformers.

Parity is against PyTorch `transformers.Qwen3ForCausalLM` on small random
configs (every leaf random, q/k norms included), both tied and untied heads,
prompt logits and greedy continuations through the KV cache.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import hf_parity

# head_dim 16 != hidden / heads = 8, as in real Qwen3 (head_dim 128 with
# hidden 1024 and 16 heads), so a decoder that derives head_dim would fail.
QWEN3_UNTIED = models.tiny_config(
  arch="qwen3",
  head_dim=16,
  rope_theta=1e6,
  rms_norm_eps=1e-6,
  tie_word_embeddings=False,
)
QWEN3_TIED = QWEN3_UNTIED.replace(tie_word_embeddings=True)

# Qwen3-0.6B's config.json as published on the Hub.
QWEN3_06B_CONFIG_JSON = {
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": False,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": None,
  "rope_theta": 1000000,
  "sliding_window": None,
  "tie_word_embeddings": True,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": True,
  "use_sliding_window": False,
  "vocab_size": 151936,
}


class TestConfig:
  def test_from_published_config_equals_preset(self):
    assert models.ModelConfig.from_hf(QWEN3_06B_CONFIG_JSON) == models.preset(
      "Qwen/Qwen3-0.6B"
    )

  def test_qk_norm_only_for_qwen3(self):
    assert QWEN3_TIED.qk_norm and not QWEN3_TIED.has_qkv_bias
    assert not models.tiny_config().qk_norm
    assert not models.tiny_config(arch="qwen2").qk_norm

  @pytest.mark.parametrize("config", [QWEN3_TIED, QWEN3_UNTIED])
  def test_hf_round_trip(self, config):
    assert models.ModelConfig.from_hf(config.to_hf()) == config

  def test_param_shapes_have_per_head_norms(self):
    shapes = models.param_shapes(QWEN3_TIED)
    assert shapes["layers"]["q_norm"] == {"scale": (2, 16)}
    assert shapes["layers"]["k_norm"] == {"scale": (2, 16)}
    assert "bias" not in shapes["layers"]["q_proj"]

  def test_num_params_counts_every_leaf(self):
    params = jax.eval_shape(
      lambda: models.init_params(QWEN3_UNTIED, jax.random.PRNGKey(0))
    )
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    assert QWEN3_UNTIED.num_params() == n


class TestPresets:
  """Parameter counts against the Qwen3 model cards (total, non-embedding).

  The cards round to what is listed here. The Hub's safetensors badge shows
  more for 0.6B/1.7B (0.75B/2.03B) because those checkpoints also store a copy
  of the tied embedding as `lm_head.weight`; the model has one table.
  """

  @pytest.mark.parametrize(
    "name,total,non_embedding",
    [
      ("qwen3-0.6b", 0.596e9, 0.44e9),
      ("qwen3-1.7b", 1.72e9, 1.41e9),
      ("qwen3-4b", 4.02e9, 3.63e9),
      ("qwen3-8b", 8.19e9, 6.95e9),
    ],
  )
  def test_model_card_counts(self, name, total, non_embedding):
    config = models.preset(name)
    assert config.num_params() == pytest.approx(total, rel=5e-3)
    assert config.num_non_embedding_params() == pytest.approx(
      non_embedding, rel=5e-3
    )

  def test_exact_counts(self):
    # Hand count for 0.6B: 28 layers of (q 1024·2048 + k,v 1024·1024 each +
    # o 2048·1024 + mlp 3·1024·3072 + 2·1024 norms + 2·128 q/k norms),
    # one 151936·1024 table, final norm 1024.
    per_layer = (
      1024 * 2048
      + 2 * 1024 * 1024
      + 2048 * 1024
      + 3 * 1024 * 3072
      + 2 * 1024
      + 2 * 128
    )
    expected = 28 * per_layer + 151936 * 1024 + 1024
    assert models.preset("qwen3-0.6b").num_params() == expected == 596_049_920

  @pytest.mark.parametrize(
    "name,tied",
    [
      ("qwen3-0.6b", True),
      ("qwen3-1.7b", True),
      ("qwen3-4b", True),
      ("qwen3-8b", False),
    ],
  )
  def test_shared_architecture(self, name, tied):
    config = models.preset(name)
    assert (config.arch, config.vocab_size, config.head_dim) == (
      "qwen3",
      151936,
      128,
    )
    assert config.tie_word_embeddings is tied
    assert config.rope_theta == 1e6 and config.rope_scaling is None
    assert not config.attention_bias and config.qk_norm


def _random_hf_qwen3(config, seed=0):
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import Qwen3Config, Qwen3ForCausalLM  # pylint: disable=g-import-not-at-top

  torch.manual_seed(seed)
  hf_config = Qwen3Config(
    **{
      k: v
      for k, v in config.to_hf().items()
      if k not in ("architectures", "model_type")
    }
  )
  model = Qwen3ForCausalLM(hf_config).eval()
  with torch.no_grad():  # HF init sets norms to 1: randomize them too
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
  return model


PROMPTS = [[5, 17, 99, 3, 64, 21, 8], [42, 7, 7, 120, 11], [9] * 12]


@pytest.mark.parametrize(
  "config", [QWEN3_UNTIED, QWEN3_TIED], ids=["untied", "tied"]
)
def test_parity_with_transformers(tmp_path, config):
  """Logits and greedy tokens of a checkpoint written by transformers."""
  hf_model = _random_hf_qwen3(config)
  hf_model.save_pretrained(tmp_path)
  loaded_config, params = models.load_hf(tmp_path)
  assert loaded_config == config
  report = hf_parity.compare_with_transformers(
    config, params, hf_model, PROMPTS, new_tokens=12
  )
  print(
    f"qwen3 {'tied' if config.tie_word_embeddings else 'untied'}: "
    f"max |dlogit| = {report['max_abs_dlogit']:.2e}"
  )
  assert report["all_greedy_match"], report["rows"]
  assert report["max_abs_dlogit"] < 1e-4


def test_transformers_loads_saved_dir(tmp_path, random_params):
  """HF out: our save_hf dir loads in transformers with the same logits, and
  load -> save -> load is the identity."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top

  config = QWEN3_TIED
  params = random_params(config, seed=3)
  models.save_hf(config, params, tmp_path, dtype="float32")
  hf_model = AutoModelForCausalLM.from_pretrained(
    tmp_path, dtype=torch.float32
  ).eval()
  assert type(hf_model).__name__ == "Qwen3ForCausalLM"
  tokens = jnp.asarray([PROMPTS[0]], jnp.int32)
  with torch.no_grad():
    theirs = hf_model(
      input_ids=torch.tensor(np.asarray(tokens), dtype=torch.long)
    ).logits.numpy()
  ours = np.asarray(models.forward(config, params, tokens))
  np.testing.assert_allclose(ours, theirs, atol=1e-4)
  config2, params2 = models.load_hf(tmp_path)
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_qk_norm_is_applied(random_params):
  """Scaling one q-norm weight changes the logits (the norm is not skipped)."""
  config = QWEN3_UNTIED
  params = random_params(config, seed=1)
  tokens = jnp.asarray([PROMPTS[0]], jnp.int32)
  base = models.forward(config, params, tokens)
  scaled = jax.tree.map(lambda x: x, params)
  scaled["layers"]["q_norm"]["scale"] = (
    params["layers"]["q_norm"]["scale"].at[0, 0].mul(3.0)
  )
  assert not np.allclose(base, models.forward(config, scaled, tokens))
