"""The persistent compilation cache the engine turns on (`compile_cache`):
its directory, the switch that turns it off, and a caller's own setting
left alone."""

from __future__ import annotations

import jax
import pytest

from rljax.rollout import compile_cache


# Every JAX setting `enable()` may write: the fixture puts each back, or
# the rest of this worker's tests would run under this file's cache
# settings (the suite's own cache writes every program, whatever its
# compile time).
_SETTINGS = (
  "jax_compilation_cache_dir",
  "jax_persistent_cache_min_compile_time_secs",
  "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture
def fresh(monkeypatch):
  """The module and JAX's setting as a new process has them (restored)."""
  before = {name: getattr(jax.config, name) for name in _SETTINGS}
  monkeypatch.setattr(compile_cache, "_enabled", None)
  jax.config.update("jax_compilation_cache_dir", None)
  yield
  for name, value in before.items():
    jax.config.update(name, value)


def test_default_directory_is_per_cpu(fresh, monkeypatch, tmp_path):
  monkeypatch.delenv(compile_cache.ENV, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))
  path = compile_cache.enable()
  assert path.startswith(str(tmp_path / ".cache" / "rljax" / "jax"))
  assert jax.config.jax_compilation_cache_dir == path
  assert (
    jax.config.jax_persistent_cache_min_compile_time_secs
    == compile_cache.MIN_COMPILE_SECONDS
  )
  assert compile_cache.enable() == path  # once per process


def test_env_names_it_or_turns_it_off(fresh, monkeypatch, tmp_path):
  monkeypatch.setenv(compile_cache.ENV, "off")
  assert compile_cache.enable() is None
  assert jax.config.jax_compilation_cache_dir is None
  monkeypatch.setattr(compile_cache, "_enabled", None)
  monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "c"))
  assert compile_cache.enable() == str(tmp_path / "c")


def test_a_callers_directory_is_kept(fresh, monkeypatch, tmp_path):
  monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "ours"))
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "theirs"))
  assert compile_cache.enable() == str(tmp_path / "theirs")
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "theirs")
