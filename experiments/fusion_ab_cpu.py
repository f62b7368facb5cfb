"""Fused against separate projections in the JAX sampler, alternated in one process.

Builds two `JaxSampler`s over the same weights, one with
`fuse_projections=True` (q/k/v and gate/up as one matmul each,
`rljax.models.fusion`) and one without, warms both, then times
`--rounds` rollouts of each, swapping the order every round so that a
drifting machine does not favour one side. Prints tokens/s per run and a
JSON line with all of them. This is the A/B behind the sampler's default
(fused on an accelerator, not on a CPU; docs/performance.md, "NVIDIA H200:
q/k/v and gate/up as one matmul each").

  python experiments/fusion_ab_cpu.py --quant=int8
  python experiments/fusion_ab_cpu.py --quant=none --random_init \\
    --model=smollm2-135m --new_tokens=16
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np
from absl import app, flags

from rljax import models
from rljax.rollout import JaxSampler, SamplingConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_model  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

_MODEL = flags.DEFINE_string("model", models.DEFAULT_MODEL, "Preset name.")
_RANDOM_INIT = flags.DEFINE_bool(
  "random_init", False, "Random weights of the preset (no checkpoint)."
)
_QUANT = flags.DEFINE_enum(
  "quant", "int8", ["none", "bf16", "int8", "int8_wo", "fp8"], "Format."
)
_PROMPTS = flags.DEFINE_integer("prompts", 16, "Prompts per rollout.")
_SAMPLES = flags.DEFINE_integer("samples", 8, "Samples per prompt.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64, "Tokens per sample.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 40, "Prompt tokens.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rollouts per side.")


def main(argv):
  del argv
  model = bench_model.load(_MODEL.value, _RANDOM_INIT.value)
  config, params = model.config, model.params
  rng = np.random.default_rng(0)
  high = min(config.vocab_size, 40_000)
  prompts = [
    [int(t) for t in rng.integers(10, high, _PROMPT_LEN.value)]
    for _ in range(_PROMPTS.value)
  ]
  sampling = SamplingConfig(
    n=_SAMPLES.value,
    temperature=1.0,
    max_new_tokens=_NEW_TOKENS.value,
    seed=0,
  )
  samplers = {
    fused: JaxSampler(
      config,
      params,
      quant=_QUANT.value,
      max_prompt_len=_PROMPT_LEN.value,
      max_batch=_PROMPTS.value * _SAMPLES.value,
      fuse_projections=fused,
    )
    for fused in (False, True)
  }
  for sampler in samplers.values():
    sampler.warmup(prompts, sampling)
  rates = {False: [], True: []}
  for r in range(_ROUNDS.value):
    for fused in (False, True) if r % 2 == 0 else (True, False):
      start = time.perf_counter()
      batch = samplers[fused].generate(prompts, sampling)
      seconds = time.perf_counter() - start
      tokens = sum(len(x) for x in batch.response_ids)
      rates[fused].append(tokens / seconds)
      side = "fused" if fused else "separate"
      print(f"{_QUANT.value} {side}: {tokens / seconds:.1f} tok/s", flush=True)
  print(
    json.dumps(
      {
        "quant": _QUANT.value,
        "backend": jax.default_backend(),
        "separate": rates[False],
        "fused": rates[True],
      }
    )
  )


if __name__ == "__main__":
  app.run(main)
