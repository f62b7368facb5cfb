"""The test run's shared persistent compilation cache
(`compile_cache_util.start_suite_cache`, started by tests/conftest.py)."""

import os

import jax
import jax.numpy as jnp
import pytest

import compile_cache_util


def test_a_compiled_program_lands_in_the_runs_cache():
  directory = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if not directory:
    assert os.environ.get(compile_cache_util.SUITE_CACHE_SWITCH) == "0"
    pytest.skip("the run's compilation cache is switched off")
  assert jax.config.jax_compilation_cache_dir == directory
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
  before = set(os.listdir(directory))

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
    assert environ["JAX_COMPILATION_CACHE_DIR"] == directory
    assert environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
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
