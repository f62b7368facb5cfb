"""Importing rljax's vLLM worker extension in tests: its modules run inside
vLLM's server and live outside the rljax package (third_party/vllm_ext), on
no path a test process has."""

import importlib
import sys

from rljax.rollout.vllm.process import EXTENSION_DIR


def import_extension(name: str):
  """The extension module `name` (e.g. "rljax_vllm_auth"), imported with
  the extension dir on sys.path only while importing."""
  sys.path.insert(0, EXTENSION_DIR)
  try:
    return importlib.import_module(name)
  finally:
    sys.path.remove(EXTENSION_DIR)
