"""Tokenizers (with chat templates) for rljax checkpoints, via transformers."""

from __future__ import annotations

import os
from typing import Any

# Files any one of which makes an HF dir carry a tokenizer.
TOKENIZER_FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "tokenizer.model",
  "vocab.json",
)


def missing_tokenizer_error(path: str | os.PathLike) -> FileNotFoundError:
  """The error for an HF dir without tokenizer files, naming what was looked
  for and how to fix it."""
  return FileNotFoundError(
    f"{os.fspath(path)!r} has no tokenizer: looked for "
    f"{', '.join(TOKENIZER_FILES)} and found none; save the checkpoint with "
    "its tokenizer (models.save_hf(..., tokenizer=tok)) or copy the "
    "tokenizer files of the model it was trained from into that directory"
  )


def require_tokenizer(tokenizer: Any, path: str | os.PathLike) -> Any:
  """tokenizer, or the missing-tokenizer error for the checkpoint at path
  (`models.load_pretrained` gives tokenizer=None for an HF dir without one;
  training and evaluation need one for the chat template and decoding)."""
  if tokenizer is None:
    raise missing_tokenizer_error(path)
  return tokenizer


def load_tokenizer(path: str | os.PathLike):
  """A transformers tokenizer from an HF dir or from a GGUF file's metadata.

  For a `.gguf` path, transformers rebuilds the tokenizer and chat template
  from the file (`AutoTokenizer.from_pretrained(dir, gguf_file=name)`). A
  tokenizer without a pad token gets the eos token as pad, since batched
  rollouts need one.
  """
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top

  path = os.fspath(path)
  if path.endswith(".gguf"):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"no GGUF file at {path!r}")
    directory, name = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
  elif os.path.isdir(path):
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
      raise missing_tokenizer_error(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
  else:
    raise FileNotFoundError(
      f"load_tokenizer: {path!r} is neither an HF directory nor a .gguf file"
    )
  if tokenizer.pad_token is None and tokenizer.eos_token is not None:
    tokenizer.pad_token = tokenizer.eos_token
  return tokenizer
