"""The test run's shared caches (`compile_cache_util.start_suite_cache`,
started by tests/conftest.py): compiled programs, and the tiny model's
tokenizer in its saved form."""

import os

import jax
import jax.numpy as jnp
import pytest

import compile_cache_util
from rljax.models import pretrained


def test_a_compiled_program_lands_in_the_runs_cache():
  directory = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if not directory:
    assert os.environ.get(compile_cache_util.SUITE_CACHE_SWITCH) == "0"
    pytest.skip("the run's caches are switched off")
  assert jax.config.jax_compilation_cache_dir == directory
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
  before = set(os.listdir(directory)) if os.path.isdir(directory) else set()

  @jax.jit
  def f(x):  # a program no other test compiles
    return jnp.cumsum(x * 3.0 + 17.0) - 5.0

  f(jnp.arange(13.0)).block_until_ready()
  assert set(os.listdir(directory)) - before


def test_start_suite_cache_makes_one_dir_and_defers_to_the_user(tmp_path):
  environ = {}
  directory = compile_cache_util.start_suite_cache(environ)
  try:
    assert os.path.isdir(directory) and not os.listdir(directory)
    assert environ["JAX_COMPILATION_CACHE_DIR"] == os.path.join(
      directory, "jax"
    )
    assert environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert environ[pretrained.TOKENIZER_CACHE_ENV] == os.path.join(
      directory, "tokenizer"
    )
    # A process that inherited it (an xdist worker) makes no second one.
    assert compile_cache_util.start_suite_cache(environ) is None
  finally:
    os.rmdir(directory)
  mine = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine")}
  assert compile_cache_util.start_suite_cache(mine) is None
  assert mine == {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine")}
  off = {compile_cache_util.SUITE_CACHE_SWITCH: "0"}
  assert compile_cache_util.start_suite_cache(off) is None
  assert "JAX_COMPILATION_CACHE_DIR" not in off


def test_the_saved_tokenizer_is_the_gguf_files(tmp_path):
  """Saved once, then read back: the same ids, text and chat prompt as the
  tokenizer rebuilt from the GGUF file."""
  # pylint: disable=protected-access
  first = pretrained._default_tokenizer(str(tmp_path))
  (saved,) = [p for p in tmp_path.iterdir()]  # no partial copy left
  assert (
    saved.name.startswith("SmolLM2") and (saved / "tokenizer.json").exists()
  )
  again = pretrained._default_tokenizer(str(tmp_path))
  fresh = pretrained._default_tokenizer(None)
  text = "What is 12 + 30? The answer is \\boxed{42}. émoji 🙂"
  chat = [{"role": "user", "content": text}]
  for tok in (first, again):
    ids = tok(text)["input_ids"]
    assert ids == fresh(text)["input_ids"]
    assert tok.decode(ids) == fresh.decode(ids)
    assert tok.apply_chat_template(
      chat, tokenize=False, add_generation_prompt=True
    ) == fresh.apply_chat_template(
      chat, tokenize=False, add_generation_prompt=True
    )
    assert (tok.pad_token_id, tok.eos_token_id, len(tok)) == (
      fresh.pad_token_id,
      fresh.eos_token_id,
      len(fresh),
    )
