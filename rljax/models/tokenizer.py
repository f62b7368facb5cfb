"""Tokenizers (with chat templates) for rljax checkpoints, via transformers."""
from __future__ import annotations

import os


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
    tokenizer = AutoTokenizer.from_pretrained(path)
  else:
    raise FileNotFoundError(f"load_tokenizer: {path!r} is neither an HF "
                            "directory nor a .gguf file")
  if tokenizer.pad_token is None and tokenizer.eos_token is not None:
    tokenizer.pad_token = tokenizer.eos_token
  return tokenizer
