"""SmolLM2-135M-Instruct checkpoints and helpers shared by the real-engine
vLLM sidecar tests: the project's own bf16 and INT8 exports of the embedded
model, cached across runs in pytest's cache dir, the chat prompts, and
generation one prompt at a time (what vLLM reproduces on every CPU)."""

import fcntl
import json
import os

import numpy as np
import pytest

from rljax.rollout import base
from rljax.rollout.vllm_sidecar import (
  VLLMSidecarConfig,
)

_CACHE_VERSION = "smollm2-135m-v2"
EOS = 2  # <|im_end|>
# 64 MiB shards: the 135M model's sync is written as several files.
CONFIG = VLLMSidecarConfig(max_model_len=1024, shard_bytes=64 << 20)
GREEDY = base.SamplingConfig(
  greedy=True, max_new_tokens=24, stop_token_ids=(EOS,)
)


def _complete(marker: str) -> bool:
  if not os.path.isfile(marker):
    return False
  with open(marker) as f:
    return json.load(f).get("version") == _CACHE_VERSION


def _build(dirs: dict) -> None:
  """The bf16 export of the embedded model, and the INT8 export of its
  values."""
  from rljax import models  # pylint: disable=g-import-not-at-top

  model = models.load_pretrained("smollm2-135m-instruct")
  models.save_hf(
    model.config,
    model.params,
    dirs["bf16"],
    tokenizer=model.tokenizer,
    dtype="bfloat16",
  )
  # INT8 from the bf16 checkpoint's values, so that both engines run the same
  # model and `f32_params` re-quantizes to exactly the exported codes.
  config, params = models.load_hf(dirs["bf16"])
  models.export_compressed_tensors_int8(
    config, params, dirs["int8"], tokenizer=model.tokenizer
  )


@pytest.fixture(scope="module")
def checkpoints(pytestconfig, tmp_path_factory):
  """{"bf16": dir, "int8": dir} of SmolLM2-135M-Instruct, built once."""
  cache = getattr(pytestconfig, "cache", None)
  root = (
    str(cache.mkdir("rljax-vllm-checkpoints"))
    if cache is not None
    else str(tmp_path_factory.mktemp("vllm-checkpoints"))
  )
  dirs = {
    "bf16": os.path.join(root, "smollm2-bf16"),
    "int8": os.path.join(root, "smollm2-int8"),
  }
  marker = os.path.join(root, "complete.json")
  # The bf16 and INT8 test files share this cache and may start together on
  # two xdist workers: one builds while the other waits, then reads.
  with open(os.path.join(root, "build.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not _complete(marker):
      _build(dirs)
      with open(marker, "w") as f:
        json.dump({"version": _CACHE_VERSION}, f)
  return dirs


@pytest.fixture(scope="module")
def tokenizer(checkpoints):
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top

  return AutoTokenizer.from_pretrained(checkpoints["bf16"])


def _chat(tokenizer, question):
  ids = tokenizer.apply_chat_template(
    [{"role": "user", "content": question}],
    add_generation_prompt=True,
    tokenize=True,
  )
  ids = ids["input_ids"] if hasattr(ids, "keys") else ids
  return [int(t) for t in ids]


@pytest.fixture(scope="module")
def prompts(tokenizer):
  return [
    _chat(tokenizer, q)
    for q in (
      "What is 7+5?",
      "Name a primary color.",
      "Write a haiku about rain.",
    )
  ]


@pytest.fixture(scope="module")
def f32_params(checkpoints):
  from rljax import models  # pylint: disable=g-import-not-at-top

  return models.load_hf(checkpoints["bf16"])


def _hf_state_dict(model_dir):
  """name -> numpy array of a checkpoint dir (ml_dtypes registers bf16)."""
  import ml_dtypes  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  import safetensors.numpy  # pylint: disable=g-import-not-at-top

  out = {}
  for name in sorted(os.listdir(model_dir)):
    if name.endswith(".safetensors"):
      out.update(safetensors.numpy.load_file(os.path.join(model_dir, name)))
  return out


def _alone(engine, prompts, sampling):
  """Each prompt generated in a request of its own, one after the other.

  A seeded request that runs alone on the engine is what vLLM reproduces on
  every CPU; requests that share the engine's batches can sample other
  tokens on CPUs whose kernels depend on the batch (Intel AMX): see
  "Reproducibility" in `VLLMSidecar`'s docstring.
  """
  batches = [engine.generate([p], sampling) for p in prompts]
  return (
    [b.response_ids[0] for b in batches],
    [b.behav_logp[0] for b in batches],
  )


def _assert_vllm_reload_matches(engine, prompts, fast_ids, fast_logp):
  """vLLM's own reload of the sidecar's shared weights file (the fallback
  path) gives what the in-place apply gave: the same greedy tokens and
  log-probs."""
  shared_dir = engine._shared.path  # pylint: disable=protected-access
  engine.load_weights_dir(shared_dir)
  slow_ids, slow_logp = _alone(engine, prompts, GREEDY)
  assert slow_ids == fast_ids
  for a, b in zip(slow_logp, fast_logp):
    np.testing.assert_allclose(a, b, atol=1e-6)


def _scale_mlps(params, layers=range(0, 30, 3), factor=3.0):
  """The params tree with the down projections of some blocks scaled."""
  down = np.array(params["layers"]["down_proj"]["kernel"])
  down[list(layers)] *= factor
  new_layers = dict(params["layers"], down_proj={"kernel": down})
  return dict(params, layers=new_layers)
