"""LoRA: low-rank adapters on the decoder's projections, over a frozen base.

LoRA (Hu et al., 2021) trains, for a frozen kernel W [in, out], two factors
A [in, r] and B [r, out] and runs

  W' = W + (α / r) · A B,     B = 0 at init, so W' = W at step 0.

Here the adapters are their own params tree,

  {"layers": {"q_proj": {"lora_a": [L, in, r], "lora_b": [L, r, out]}, ...}}

on any subset of the seven projections. Training differentiates only that
tree: the update step applies `LoraTransform` (the merge W + (α/r)·A B, with
the frozen base as a non-differentiated argument) inside the loss, so the
gradient, the optimizer state and the checkpoints hold adapters only. The
frozen base may be held in float32, bfloat16 or INT8 (per-channel weight-only,
`QTensor`) to save memory; the merge computes in float32.

Dropout. Because the adapters are merged into the kernel inside the loss, a
per-token mask on the adapter's input (PEFT's `lora_dropout`) has no merged
form. `dropout = p` here drops each *input feature* of each adapter (a row of
A) with probability p, one mask per update step, scaled by 1 / (1 − p): the
same expectation, a coarser mask. Merges for rollout and export use no dropout.

UAQ and LoRA (QuRL §4.3). UAQ's invariant scaling is folded into the *frozen
base* once, before the adapters are created; the adapters then live in the
folded parametrisation. Every rollout sync merges the adapters into the folded
base and quantizes the merged kernels (INT8/FP8), so the quantizer sees
W/s + (α/r)·A B, exactly the kernel full fine-tuning would have in the folded
parametrisation, and UAQ's reduced quantization error applies to it. Export
unfolds: the merged HF weights through `unfold_uaq`, and the PEFT adapter by
rescaling A (a kernel multiplied by s^k in the fold has its A multiplied by
s^-k on the way out: (W s^k + c A B) s^-k = W + c (A s^-k) B). `fold_adapters`
applies the same rule in the other direction, to bring plain adapters into a
folded model (tests/models/test_lora.py checks both directions).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from jaxtyping import PRNGKeyArray

from rljax.models import decoder, hf_io
from rljax.models.config import ModelConfig
from rljax.quant import quantizers
from rljax.quant import uaq
from rljax.quant.qtensor import QTensor

Params = Mapping[str, Any]

LORA_TARGETS = decoder._PROJECTIONS  # pylint: disable=protected-access
BASE_DTYPES = ("float32", "bfloat16", "int8")

# HF module path of each projection under "model.layers.{i}.".
_HF_MODULES = {
  "q_proj": "self_attn.q_proj",
  "k_proj": "self_attn.k_proj",
  "v_proj": "self_attn.v_proj",
  "o_proj": "self_attn.o_proj",
  "gate_proj": "mlp.gate_proj",
  "up_proj": "mlp.up_proj",
  "down_proj": "mlp.down_proj",
}


def parse_targets(targets: str | tuple[str, ...]) -> tuple[str, ...]:
  """ "all", "attn", "mlp" or a comma list ("q_proj,v_proj") -> names."""
  if isinstance(targets, str):
    groups = {
      "all": LORA_TARGETS,
      "attn": LORA_TARGETS[:4],
      "mlp": LORA_TARGETS[4:],
    }
    targets = groups.get(
      targets.strip(), tuple(t.strip() for t in targets.split(",") if t.strip())
    )
  targets = tuple(targets)
  bad = [t for t in targets if t not in LORA_TARGETS]
  if not targets or bad or len(set(targets)) != len(targets):
    raise ValueError(
      f"LoraConfig.targets={targets!r}; expected distinct names "
      f"from {LORA_TARGETS} (or 'all', 'attn', 'mlp')"
    )
  return tuple(t for t in LORA_TARGETS if t in targets)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """LoRA hyper-parameters (hashable: part of the jitted update's spec).

  Attributes:
    rank: r > 0, the adapters' inner width.
    alpha: α; the update is scaled by α / r.
    dropout: p in [0, 1): per-step input-feature dropout (module docstring).
    targets: projections that get adapters ("all", "attn", "mlp", or names).
    base_dtype: how the frozen base is held: "float32", "bfloat16", "int8".
  """

  rank: int = 16
  alpha: float = 32.0
  dropout: float = 0.0
  targets: tuple[str, ...] | str = LORA_TARGETS
  base_dtype: str = "float32"

  def __post_init__(self):
    if (
      not isinstance(self.rank, int)
      or isinstance(self.rank, bool)
      or self.rank <= 0
    ):
      raise ValueError(f"LoraConfig.rank={self.rank!r}; expected an int > 0")
    if not float(self.alpha) > 0:
      raise ValueError(f"LoraConfig.alpha={self.alpha!r}; expected > 0")
    if not 0.0 <= float(self.dropout) < 1.0:
      raise ValueError(
        f"LoraConfig.dropout={self.dropout!r}; expected a probability in [0, 1)"
      )
    if self.base_dtype not in BASE_DTYPES:
      raise ValueError(
        f"LoraConfig.base_dtype={self.base_dtype!r}; expected "
        f"one of {BASE_DTYPES}"
      )
    object.__setattr__(self, "targets", parse_targets(self.targets))

  @property
  def scaling(self) -> float:
    return float(self.alpha) / self.rank


# ------------------------------------------------------------------ params
def init_adapters(
  config: ModelConfig, lora: LoraConfig, rng: PRNGKeyArray, dtype=jnp.float32
) -> dict[str, Any]:
  """A ~ U(±1/sqrt(in)) (PEFT's Kaiming-uniform bound), B = 0."""
  shapes = decoder.layer_kernel_shapes(config)
  n = config.num_layers
  out = {}
  for key, name in zip(jax.random.split(rng, len(lora.targets)), lora.targets):
    d_in, d_out = shapes[name]
    bound = 1.0 / np.sqrt(d_in)
    out[name] = {
      "lora_a": jax.random.uniform(
        key, (n, d_in, lora.rank), jnp.float32, -bound, bound
      ).astype(dtype),
      "lora_b": jnp.zeros((n, lora.rank, d_out), dtype),
    }
  return {"layers": out}


def freeze_base(
  config: ModelConfig, params: Params, lora: LoraConfig
) -> dict[str, Any]:
  """The frozen base in `lora.base_dtype`: bf16 casts every float leaf; int8
  quantizes the seven projection kernels (per output channel, weight-only)
  and keeps the rest in float32."""
  del config
  if lora.base_dtype == "float32":
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  if lora.base_dtype == "bfloat16":
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params)
  out = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  out = dict(out, layers=dict(out["layers"]))
  for name in LORA_TARGETS:
    leaf = dict(out["layers"][name])
    leaf["kernel"] = quantizers.quantize(leaf["kernel"], "int8_wo")
    out["layers"][name] = leaf
  return out


def _as_f32(x):
  return (
    x.dequantize(jnp.float32)
    if isinstance(x, QTensor)
    else x.astype(jnp.float32)
  )


def adapter_delta(lora: LoraConfig, adapter: Params) -> jax.Array:
  """(α/r)·A B per layer: [L, in, out] in float32."""
  return lora.scaling * jnp.einsum(
    "lir,lro->lio",
    adapter["lora_a"].astype(jnp.float32),
    adapter["lora_b"].astype(jnp.float32),
  )


def merge(
  config: ModelConfig,
  lora: LoraConfig,
  base: Params,
  adapters: Params,
  rng: PRNGKeyArray | None = None,
) -> dict[str, Any]:
  """Float32 params computing W + (α/r)·A B for every adapted kernel.

  With `rng` and `lora.dropout > 0`, rows of A are dropped (training only).
  Differentiable in `adapters`; `base` is treated as a constant by callers
  (it is not among the differentiated arguments).
  """
  del config
  merged = jax.tree.map(_as_f32, base, is_leaf=lambda x: isinstance(x, QTensor))
  layers = dict(merged["layers"])
  for i, (name, adapter) in enumerate(sorted(adapters["layers"].items())):
    if rng is not None and lora.dropout > 0:
      a = adapter["lora_a"]
      keep = jax.random.bernoulli(
        jax.random.fold_in(rng, i), 1.0 - lora.dropout, a.shape[:2] + (1,)
      )
      adapter = dict(
        adapter, lora_a=jnp.where(keep, a / (1.0 - lora.dropout), 0.0)
      )
    layers[name] = dict(
      layers[name], kernel=layers[name]["kernel"] + adapter_delta(lora, adapter)
    )
  merged["layers"] = layers
  return merged


def attach(lora: LoraConfig, base: Params, adapters: Params) -> dict[str, Any]:
  """The *unmerged* params: base kernels (float, bf16 or QTensor) plus
  "lora_a" and (α/r)-scaled "lora_b" leaves, which `layers.linear` runs as
  y = x W + (x A)(α/r · B) without forming W + A B."""
  layers = dict(base["layers"])
  for name, adapter in adapters["layers"].items():
    layers[name] = dict(
      layers[name],
      lora_a=adapter["lora_a"],
      lora_b=lora.scaling * adapter["lora_b"],
    )
  return dict(base, layers=layers)


@dataclasses.dataclass(frozen=True)
class LoraTransform:
  """`UpdateSpec.param_transform` for LoRA: (frozen base, adapters, rng) ->
  merged params. Hashable by value, so equal configs share a compiled step."""

  model_config: ModelConfig
  lora: LoraConfig

  def __call__(
    self, base: Params, adapters: Params, rng: PRNGKeyArray | None = None
  ) -> dict[str, Any]:
    return merge(self.model_config, self.lora, base, adapters, rng)


def fold_adapters(
  lora: LoraConfig, adapters: Params, powers: Mapping
) -> dict[str, Any]:
  """Adapters for a model whose kernels were multiplied by s^k (UAQ:
  `quant.uaq.uaq_powers`, with s already applied: `powers` maps
  (module, "kernel") -> the factor s^k): A ← A · s^k."""
  del lora
  layers = {}
  for name, adapter in adapters["layers"].items():
    factor = powers.get((name, "kernel"), 1.0)
    layers[name] = dict(adapter, lora_a=adapter["lora_a"] * factor)
  return {"layers": layers}


def uaq_kernel_factors(
  scale: float, fold_vo: bool = False, fold_up_down: bool = False
) -> dict:
  """(module, "kernel") -> s^k, the factor UAQ's fold multiplies it by."""
  return {
    key: float(scale) ** k
    for key, k in uaq.uaq_powers(fold_vo, fold_up_down).items()
    if key[1] == "kernel"
  }


# ------------------------------------------------------------------ export
def num_adapter_params(adapters: Params) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(adapters))


def to_peft_state_dict(
  config: ModelConfig, adapters: Params
) -> dict[str, np.ndarray]:
  """PEFT names and layouts: `base_model.model.model.layers.{i}.<module>.
  lora_A.weight` [r, in] and `lora_B.weight` [out, r] (nn.Linear layout)."""
  out = {}
  adapters = jax.device_get(adapters)
  for name, adapter in adapters["layers"].items():
    a = np.asarray(adapter["lora_a"], np.float32)
    b = np.asarray(adapter["lora_b"], np.float32)
    for i in range(config.num_layers):
      prefix = f"base_model.model.model.layers.{i}.{_HF_MODULES[name]}"
      out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a[i].T)
      out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b[i].T)
  return out


def save_peft_adapter(
  config: ModelConfig,
  lora: LoraConfig,
  adapters: Params,
  out_dir: str | os.PathLike,
  base_model_name_or_path: str | None = None,
) -> str:
  """Writes `adapter_config.json` + `adapter_model.safetensors` (float32),
  the layout `peft.PeftModel.from_pretrained(base, out_dir)` reads. Pass
  adapters in the *plain* (unfolded) parametrisation (`fold_adapters` with
  the inverse factors undoes UAQ)."""
  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  safetensors.numpy.save_file(
    to_peft_state_dict(config, adapters),
    os.path.join(out_dir, "adapter_model.safetensors"),
    metadata={"format": "pt"},
  )
  adapter_config = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "base_model_name_or_path": base_model_name_or_path,
    "r": lora.rank,
    "lora_alpha": float(lora.alpha),
    "lora_dropout": float(lora.dropout),
    "target_modules": sorted(adapters["layers"]),
    "bias": "none",
    "fan_in_fan_out": False,
    "inference_mode": True,
    "modules_to_save": None,
    "use_rslora": False,
    "use_dora": False,
    "init_lora_weights": True,
    "layers_to_transform": None,
  }
  with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
    json.dump(adapter_config, f, indent=2)
  return out_dir


def load_peft_adapter(
  config: ModelConfig, directory: str | os.PathLike
) -> tuple[LoraConfig, dict[str, Any]]:
  """(LoraConfig, adapters) from a PEFT adapter directory (ours or PEFT's)."""
  directory = os.fspath(directory)
  with open(os.path.join(directory, "adapter_config.json")) as f:
    meta = json.load(f)
  lora = LoraConfig(
    rank=int(meta["r"]),
    alpha=float(meta["lora_alpha"]),
    dropout=float(meta.get("lora_dropout", 0.0)),
    targets=tuple(meta["target_modules"]),
  )
  tensors = hf_io.load_hf_state_dict(directory)
  adapters = {}
  for name in lora.targets:
    a, b = [], []
    for i in range(config.num_layers):
      prefix = f"base_model.model.model.layers.{i}.{_HF_MODULES[name]}"
      a.append(np.asarray(tensors[f"{prefix}.lora_A.weight"]).T)
      b.append(np.asarray(tensors[f"{prefix}.lora_B.weight"]).T)
    adapters[name] = {
      "lora_a": jnp.asarray(np.stack(a), jnp.float32),
      "lora_b": jnp.asarray(np.stack(b), jnp.float32),
    }
  return lora, {"layers": adapters}
