"""Optimizer-state memory of full fine-tuning vs LoRA, measured.

Builds the trainer's optimizer (`make_optimizer`: global-norm clip + AdamW)
over (a) every weight and (b) LoRA adapters, initialises its state for real
and sums the bytes of the arrays it holds; also the trainable parameters and
the frozen base in float32 / bfloat16 / INT8.

  python3 experiments/lora_memory.py                       # SmolLM2-135M, r=16, all 7 projections
  python3 experiments/lora_memory.py --preset=qwen3-0.6b --rank=8 --targets=attn

Shapes come from the preset (random weights: the byte counts depend only on
shapes and dtypes).
"""

from __future__ import annotations

import json

from absl import app, flags
import jax
import jax.numpy as jnp

from rljax import hostmem
from rljax import models
from rljax.models import lora as lora_lib
from rljax.train import optim as optim_lib

_PRESET = flags.DEFINE_string(
  "preset", "smollm2-135m-instruct", "rljax.models preset name"
)
_RANK = flags.DEFINE_integer("rank", 16, "LoRA rank")
_TARGETS = flags.DEFINE_string("targets", "all", "LoRA target projections")


def _bytes(tree) -> int:
  return sum(int(x.nbytes) for x in jax.tree.leaves(tree))


def _count(tree) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(tree))


def main(argv):
  del argv
  config = models.preset(_PRESET.value)
  params = models.init_params(config, jax.random.PRNGKey(0), jnp.float32)
  optimizer = optim_lib.make_optimizer(optim_lib.OptimConfig(1e-5, steps=100))
  full_state = optimizer.init(params)
  full = {
    "trainable_params": _count(params),
    "optimizer_state_bytes": _bytes(full_state),
  }
  del full_state

  lora = lora_lib.LoraConfig(
    rank=_RANK.value, alpha=2.0 * _RANK.value, targets=_TARGETS.value
  )
  adapters = lora_lib.init_adapters(config, lora, jax.random.PRNGKey(1))
  lora_state = optimizer.init(adapters)
  result = {
    "preset": _PRESET.value,
    "rank": lora.rank,
    "targets": list(lora.targets),
    "full": full,
    "lora": {
      "trainable_params": _count(adapters),
      "optimizer_state_bytes": _bytes(lora_state),
    },
    "frozen_base_bytes": {
      dtype: _bytes(
        lora_lib.freeze_base(
          config, params, lora_lib.LoraConfig(base_dtype=dtype)
        )
      )
      for dtype in lora_lib.BASE_DTYPES
    },
  }
  saved = (
    full["optimizer_state_bytes"] - result["lora"]["optimizer_state_bytes"]
  )
  result["optimizer_state_bytes_saved"] = saved
  result["optimizer_state_ratio"] = (
    result["lora"]["optimizer_state_bytes"] / full["optimizer_state_bytes"]
  )
  print(json.dumps(result, indent=1))
  mib = 2.0**20
  print(
    f"{_PRESET.value}: optimizer state full {full['optimizer_state_bytes'] / mib:.1f} MiB, "
    f"LoRA r={lora.rank} on {len(lora.targets)} projections "
    f"{result['lora']['optimizer_state_bytes'] / mib:.1f} MiB "
    f"(saved {saved / mib:.1f} MiB, "
    f"{100 * result['optimizer_state_ratio']:.2f}% of full)"
  )


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
