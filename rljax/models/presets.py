"""Named model configs: the architectures of the supported HF checkpoints
(`PRESETS`, `preset`) and a tiny config for fast tests (`tiny_config`).

A preset is an architecture only: its weights are random until a checkpoint
is loaded (`rljax.models.pretrained`).
"""

from __future__ import annotations

from rljax.models.config import ModelConfig

_LLAMA3_ROPE = (
  ("factor", 32.0),
  ("high_freq_factor", 4.0),
  ("low_freq_factor", 1.0),
  ("original_max_position_embeddings", 8192),
  ("rope_type", "llama3"),
)


def _smollm2(**kw) -> ModelConfig:
  return ModelConfig(
    arch="llama",
    vocab_size=49152,
    head_dim=64,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
    **kw,
  )


def _qwen2(**kw) -> ModelConfig:
  kw.setdefault("rope_theta", 1000000.0)
  return ModelConfig(
    arch="qwen2",
    head_dim=kw.pop("head_dim", 128),
    rms_norm_eps=1e-6,
    attention_bias=True,
    **kw,
  )


def _qwen3(**kw) -> ModelConfig:
  # Qwen3 dense (Qwen3 technical report, 2025): head_dim 128 at every size
  # (not hidden / heads), θ = 1e6, 40,960-token context, no rope scaling.
  return ModelConfig(
    arch="qwen3",
    vocab_size=151936,
    head_dim=128,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    attention_bias=False,
    max_position_embeddings=40960,
    bos_token_id=151643,
    eos_token_id=151645,
    **kw,
  )


# Numbers from each checkpoint's HF config.json.
PRESETS: dict[str, ModelConfig] = {
  "smollm2-135m": _smollm2(
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    bos_token_id=0,
    eos_token_id=0,
  ),
  "smollm2-135m-instruct": _smollm2(
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
  ),
  "smollm2-360m": _smollm2(
    hidden_size=960,
    intermediate_size=2560,
    num_layers=32,
    num_heads=15,
    num_kv_heads=5,
    bos_token_id=0,
    eos_token_id=0,
  ),
  "smollm2-360m-instruct": _smollm2(
    hidden_size=960,
    intermediate_size=2560,
    num_layers=32,
    num_heads=15,
    num_kv_heads=5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
  ),
  "qwen2.5-0.5b": _qwen2(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    head_dim=64,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
    bos_token_id=151643,
    eos_token_id=151643,
  ),
  "qwen2.5-0.5b-instruct": _qwen2(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    head_dim=64,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
    bos_token_id=151643,
    eos_token_id=151645,
  ),
  "qwen2.5-1.5b": _qwen2(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    tie_word_embeddings=True,
    max_position_embeddings=131072,
    bos_token_id=151643,
    eos_token_id=151643,
  ),
  "qwen2.5-1.5b-instruct": _qwen2(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
    bos_token_id=151643,
    eos_token_id=151645,
  ),
  "qwen2.5-7b": _qwen2(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
    bos_token_id=151643,
    eos_token_id=151643,
  ),
  "qwen2.5-7b-instruct": _qwen2(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    tie_word_embeddings=False,
    max_position_embeddings=32768,
    bos_token_id=151643,
    eos_token_id=151645,
  ),
  "deepseek-r1-distill-qwen-1.5b": _qwen2(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
    bos_token_id=151646,
    eos_token_id=151643,
  ),
  "deepseek-r1-distill-qwen-7b": _qwen2(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
    bos_token_id=151646,
    eos_token_id=151643,
  ),
  # Qwen3 post-trained (hybrid thinking) checkpoints; the -Base ones share
  # the architecture. Model cards: 0.6B = 0.60B params (0.44B
  # non-embedding), 1.7B = 1.72B (1.4B), 4B = 4.02B (3.6B), 8B = 8.19B
  # (6.95B); tests/models/test_qwen3.py checks `num_params` against them.
  "qwen3-0.6b": _qwen3(
    hidden_size=1024,
    intermediate_size=3072,
    num_layers=28,
    num_heads=16,
    num_kv_heads=8,
    tie_word_embeddings=True,
  ),
  "qwen3-1.7b": _qwen3(
    hidden_size=2048,
    intermediate_size=6144,
    num_layers=28,
    num_heads=16,
    num_kv_heads=8,
    tie_word_embeddings=True,
  ),
  "qwen3-4b": _qwen3(
    hidden_size=2560,
    intermediate_size=9728,
    num_layers=36,
    num_heads=32,
    num_kv_heads=8,
    tie_word_embeddings=True,
  ),
  "qwen3-8b": _qwen3(
    hidden_size=4096,
    intermediate_size=12288,
    num_layers=36,
    num_heads=32,
    num_kv_heads=8,
    tie_word_embeddings=False,
  ),
  "llama-3.2-1b": ModelConfig(
    arch="llama",
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    rope_theta=500000.0,
    rope_scaling=_LLAMA3_ROPE,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    max_position_embeddings=131072,
    bos_token_id=128000,
    eos_token_id=128001,
  ),
  "llama-3.2-1b-instruct": ModelConfig(
    arch="llama",
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    rope_theta=500000.0,
    rope_scaling=_LLAMA3_ROPE,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    max_position_embeddings=131072,
    bos_token_id=128000,
    eos_token_id=(128001, 128008, 128009),
  ),
}


def preset(name: str, **overrides) -> ModelConfig:
  """The named preset (case-insensitive; an "org/" prefix is ignored)."""
  key = name.lower().rsplit("/", 1)[-1]
  if key not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
  return PRESETS[key].replace(**overrides) if overrides else PRESETS[key]


def tiny_config(**overrides) -> ModelConfig:
  """A few-thousand-parameter Llama config for fast tests.

  Sizes are multiples of 2 and 4 so that every sharded dimension divides the
  8 fake devices' mesh axes.
  """
  base = dict(
    arch="llama",
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    attention_bias=False,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
  )
  base.update(overrides)
  return ModelConfig(**base)
