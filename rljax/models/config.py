"""Architecture hyper-parameters of a Llama/Qwen2/Qwen3 decoder.

`ModelConfig` is a frozen (hashable) dataclass so it can be a static argument of
`jax.jit`. It reads and writes the HF `config.json` vocabulary
(`ModelConfig.from_hf`, `ModelConfig.to_hf`). The named configs of the
supported checkpoints are in `rljax.models.presets`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

ARCHS = ("llama", "qwen2", "qwen3")

# Rope scaling types that `rljax.models.layers.rope_inverse_frequencies`
# implements exactly as HF transformers does.
ROPE_SCALING_TYPES = ("linear", "llama3")

_HF_ARCHITECTURES = {
  "llama": "LlamaForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "qwen3": "Qwen3ForCausalLM",
}


def _as_token_ids(value: Any, name: str) -> int | tuple[int, ...] | None:
  if value is None:
    return None
  if isinstance(value, (list, tuple)):
    ids = tuple(int(v) for v in value)
    return ids[0] if len(ids) == 1 else ids
  if isinstance(value, int) and not isinstance(value, bool):
    return value
  raise TypeError(
    f"ModelConfig.{name}={value!r}; expected an int, a list of ints or None"
  )


def _as_rope_scaling(value: Any) -> tuple[tuple[str, Any], ...] | None:
  """Normalizes an HF rope_scaling dict to a sorted, hashable tuple of items."""
  if value is None:
    return None
  if isinstance(value, Mapping):
    items = dict(value)
  elif isinstance(value, (tuple, list)):
    items = dict(value)
  else:
    raise TypeError(
      f"ModelConfig.rope_scaling={value!r}; expected a dict, a "
      "tuple of (key, value) items or None"
    )
  # HF spells the type "type" in old configs and "rope_type" in new ones.
  if "type" in items and "rope_type" not in items:
    items["rope_type"] = items.pop("type")
  items.pop("type", None)
  # transformers>=5 folds rope_theta into rope_parameters; it is a field here.
  items.pop("rope_theta", None)
  if items.get("rope_type") in (None, "default"):
    return None
  return tuple(sorted((str(k), v) for k, v in items.items()))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of a Llama/Qwen2/Qwen3-family decoder.

  Attributes:
    arch: "llama", "qwen2" (Qwen2 = Llama with q/k/v biases) or "qwen3"
      (Qwen3 dense = Llama with a per-head RMSNorm on queries and keys, before
      RoPE, and no q/k/v biases by default).
    vocab_size: V, rows of the embedding table.
    hidden_size: D, the residual width.
    intermediate_size: F, the SwiGLU width.
    num_layers: L, the number of transformer blocks.
    num_heads: Hq, query heads.
    num_kv_heads: Hkv, key/value heads (GQA); must divide `num_heads`.
    head_dim: hd, per-head width (D // Hq unless the checkpoint says otherwise).
    rope_theta: RoPE base frequency.
    rope_scaling: None or a sorted tuple of (key, value) items of the HF
      rope_scaling dict, with a "rope_type" of "linear" or "llama3".
    rms_norm_eps: epsilon inside RMSNorm.
    tie_word_embeddings: if True the LM head is the transposed embedding.
    attention_bias: q/k/v projections have biases (forced True for Qwen2;
      read from the checkpoint for Qwen3, whose released models have none).
    max_position_embeddings: context length the checkpoint was trained for.
    bos_token_id, eos_token_id, pad_token_id: special tokens (eos may be a
      tuple when a checkpoint lists several).
  """

  arch: str = "llama"
  vocab_size: int = 32000
  hidden_size: int = 4096
  intermediate_size: int = 11008
  num_layers: int = 32
  num_heads: int = 32
  num_kv_heads: int = 32
  head_dim: int = 128
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  rms_norm_eps: float = 1e-5
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  max_position_embeddings: int = 4096
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None

  def __post_init__(self):
    if self.arch not in ARCHS:
      raise ValueError(
        f"ModelConfig.arch={self.arch!r}; expected one of {ARCHS}"
      )
    for name in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
      "max_position_embeddings",
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
          f"ModelConfig.{name}={value!r}; expected a positive int"
        )
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"ModelConfig.num_kv_heads={self.num_kv_heads} does not divide "
        f"num_heads={self.num_heads}; GQA needs num_heads % num_kv_heads == 0"
      )
    if self.head_dim % 2:
      raise ValueError(
        f"ModelConfig.head_dim={self.head_dim}; RoPE needs an even head_dim"
      )
    if not self.rope_theta > 0:
      raise ValueError(
        f"ModelConfig.rope_theta={self.rope_theta!r}; expected > 0"
      )
    if not self.rms_norm_eps > 0:
      raise ValueError(
        f"ModelConfig.rms_norm_eps={self.rms_norm_eps!r}; expected > 0"
      )
    if self.arch == "qwen2":
      # HF Qwen2 always has q/k/v biases; the field is not read from its config.
      object.__setattr__(self, "attention_bias", True)
    object.__setattr__(
      self, "rope_scaling", _as_rope_scaling(self.rope_scaling)
    )
    if self.rope_scaling is not None:
      rope_type = dict(self.rope_scaling).get("rope_type")
      if rope_type not in ROPE_SCALING_TYPES:
        raise ValueError(
          f"ModelConfig.rope_scaling rope_type={rope_type!r}; supported: "
          f"{ROPE_SCALING_TYPES} (or None for plain RoPE)"
        )
    for name in ("bos_token_id", "pad_token_id"):
      value = getattr(self, name)
      if value is not None and (
        not isinstance(value, int) or isinstance(value, bool)
      ):
        raise TypeError(
          f"ModelConfig.{name}={value!r}; expected an int or None"
        )
    object.__setattr__(
      self, "eos_token_id", _as_token_ids(self.eos_token_id, "eos_token_id")
    )

  # --------------------------------------------------------------- helpers
  @property
  def eos_token_ids(self) -> tuple[int, ...]:
    """All end-of-sequence ids as a tuple (empty when none is set)."""
    if self.eos_token_id is None:
      return ()
    if isinstance(self.eos_token_id, tuple):
      return self.eos_token_id
    return (self.eos_token_id,)

  @property
  def rope_scaling_dict(self) -> dict[str, Any] | None:
    return None if self.rope_scaling is None else dict(self.rope_scaling)

  @property
  def has_qkv_bias(self) -> bool:
    return self.attention_bias

  @property
  def qk_norm(self) -> bool:
    """RMSNorm over head_dim on each query and key head, before RoPE: what
    distinguishes Qwen3 from Llama (no other supported arch has it)."""
    return self.arch == "qwen3"

  def num_params(self) -> int:
    """Number of float parameters of `init_params(self, ...)`."""
    d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
    q, kv = self.num_heads * hd, self.num_kv_heads * hd
    per_layer = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * f
    if self.has_qkv_bias:
      per_layer += q + 2 * kv
    if self.qk_norm:
      per_layer += 2 * hd
    return self.num_embedding_params() + self.num_layers * per_layer + d

  def num_embedding_params(self) -> int:
    """Parameters of the embedding and (when untied) the LM head: what model
    cards subtract to report "non-embedding" parameters."""
    n = self.vocab_size * self.hidden_size
    return n if self.tie_word_embeddings else 2 * n

  def num_non_embedding_params(self) -> int:
    return self.num_params() - self.num_embedding_params()

  def replace(self, **overrides) -> "ModelConfig":
    return dataclasses.replace(self, **overrides)

  # ------------------------------------------------------------ HF config
  @classmethod
  def from_hf(
    cls, config: Mapping[str, Any] | str | os.PathLike
  ) -> "ModelConfig":
    """Builds a config from an HF `config.json` (dict, file, or model dir)."""
    if isinstance(config, (str, os.PathLike)):
      path = os.fspath(config)
      if os.path.isdir(path):
        path = os.path.join(path, "config.json")
      if not os.path.isfile(path):
        raise FileNotFoundError(f"no HF config.json at {path!r}")
      try:
        with open(path) as f:
          config = json.load(f)
      except ValueError as e:  # JSONDecodeError, or not UTF-8
        raise ValueError(f"{path}: not a valid JSON config ({e})") from e
    if not isinstance(config, Mapping):
      raise TypeError(
        f"ModelConfig.from_hf got {type(config).__name__}; "
        "expected a dict or a path"
      )
    c = dict(config)
    if "text_config" in c and "model_type" not in c.get("text_config", {}):
      raise ValueError("multimodal configs (text_config) are not supported")
    arch = c.get("model_type")
    if arch not in ARCHS:
      raise ValueError(f"config.json model_type={arch!r}; supported: {ARCHS}")
    act = c.get("hidden_act", "silu")
    if act != "silu":
      raise ValueError(
        f"config.json hidden_act={act!r}; only 'silu' (SwiGLU) is supported"
      )
    if c.get("mlp_bias"):
      raise ValueError(
        "config.json mlp_bias=True; MLP biases are not supported"
      )
    if c.get("use_sliding_window"):
      raise ValueError(
        "config.json use_sliding_window=True; sliding-window "
        "attention is not supported"
      )
    for key in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_hidden_layers",
      "num_attention_heads",
    ):
      if key not in c:
        raise ValueError(f"config.json lacks required field {key!r}")
    num_heads = int(c["num_attention_heads"])
    hidden = int(c["hidden_size"])
    head_dim = c.get("head_dim") or hidden // num_heads
    rope_params = c.get("rope_parameters") or {}
    rope_theta = c.get("rope_theta", rope_params.get("rope_theta", 10000.0))
    rope_scaling = c.get("rope_scaling") or rope_params or None
    return cls(
      arch=arch,
      vocab_size=int(c["vocab_size"]),
      hidden_size=hidden,
      intermediate_size=int(c["intermediate_size"]),
      num_layers=int(c["num_hidden_layers"]),
      num_heads=num_heads,
      num_kv_heads=int(c.get("num_key_value_heads") or num_heads),
      head_dim=int(head_dim),
      rope_theta=float(rope_theta),
      rope_scaling=rope_scaling,
      rms_norm_eps=float(
        c.get("rms_norm_eps", 1e-5 if arch == "llama" else 1e-6)
      ),
      tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
      attention_bias=bool(c.get("attention_bias", arch == "qwen2")),
      max_position_embeddings=int(c.get("max_position_embeddings", 4096)),
      bos_token_id=c.get("bos_token_id"),
      eos_token_id=c.get("eos_token_id"),
      pad_token_id=c.get("pad_token_id"),
    )

  def to_hf(self) -> dict[str, Any]:
    """The HF `config.json` dict (legacy rope keys: read by transformers 4 & 5
    and by vLLM)."""
    out = {
      "architectures": [_HF_ARCHITECTURES[self.arch]],
      "model_type": self.arch,
      "vocab_size": self.vocab_size,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_hidden_layers": self.num_layers,
      "num_attention_heads": self.num_heads,
      "num_key_value_heads": self.num_kv_heads,
      "head_dim": self.head_dim,
      "hidden_act": "silu",
      "rope_theta": self.rope_theta,
      "rope_scaling": self.rope_scaling_dict,
      "rms_norm_eps": self.rms_norm_eps,
      "tie_word_embeddings": self.tie_word_embeddings,
      "max_position_embeddings": self.max_position_embeddings,
      "initializer_range": 0.02,
      "attention_dropout": 0.0,
      "use_cache": True,
      "bos_token_id": self.bos_token_id,
      "eos_token_id": (
        list(self.eos_token_id)
        if isinstance(self.eos_token_id, tuple)
        else self.eos_token_id
      ),
      "pad_token_id": self.pad_token_id,
    }
    if self.arch == "llama":
      out.update(
        attention_bias=self.attention_bias, mlp_bias=False, pretraining_tp=1
      )
    elif self.arch == "qwen3":
      out.update(
        attention_bias=self.attention_bias,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=self.num_layers,
      )
    else:
      out.update(
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=self.num_layers,
      )
    return out


# The named configs live in `rljax.models.presets`, which builds them from
# ModelConfig. They stay reachable under this module's name too, resolved on
# first use: an import at the top would be circular.
_PRESET_NAMES = ("PRESETS", "preset", "tiny_config")


def __getattr__(name: str) -> Any:
  if name in _PRESET_NAMES:
    from rljax.models import presets  # pylint: disable=g-import-not-at-top

    return getattr(presets, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
