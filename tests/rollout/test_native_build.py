"""The native paged-attention kernel is never required: where it cannot
be built (no compiler, a compiler that rejects the flags, as on a CPU or
toolchain -march=native does not suit), `native_build.load` returns None
with the reason, `paged_attention.choose` picks the XLA reference, and the
continuous engine samples on that path."""

from __future__ import annotations

import os
import stat

import jax
import numpy as np
import pytest

from rljax import models
from rljax.rollout import base
from rljax.rollout import native_build
from rljax.rollout import paged_attention as pa
from rljax.rollout.jax_sampler import JaxSampler


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
  """No library loaded or cached yet in this process's view."""
  monkeypatch.setattr(native_build, "_loaded", {})
  monkeypatch.setattr(native_build, "last_error", {})
  monkeypatch.setenv("RLJAX_KERNEL_CACHE", str(tmp_path / "kernels"))
  monkeypatch.delenv(pa.IMPL_ENV, raising=False)
  return tmp_path


def _failing_compiler(tmp_path) -> str:
  """A `g++` that rejects every command line, as an unknown -march would."""
  path = tmp_path / "failing-g++"
  path.write_text(
    "#!/bin/sh\n"
    'case "$1" in --version) echo "failing-g++ 1.0"; exit 0;; esac\n'
    'echo "error: unrecognized -march target" >&2\nexit 1\n'
  )
  path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return str(path)


@pytest.mark.parametrize("compiler", ["missing", "failing"])
def test_a_failed_build_falls_back_to_the_xla_reference(
  fresh_build, monkeypatch, compiler
):
  if compiler == "missing":
    monkeypatch.setenv("CXX", "no-such-compiler-rljax")
  else:
    monkeypatch.setenv("CXX", _failing_compiler(fresh_build))
  assert native_build.load(pa.SOURCE, (pa.TARGET,)) is None
  reason = native_build.last_error[pa.SOURCE]
  assert ("no C++ compiler" in reason) == (compiler == "missing")
  if compiler == "failing":
    assert "-march=native" in reason and "unrecognized" in reason
    assert not os.listdir(fresh_build / "kernels")  # no partial library
  if jax.default_backend() == "cpu":
    assert not pa.native_available()
  assert pa.choose(8, 8, np.float32) == "xla"
  monkeypatch.setenv(pa.IMPL_ENV, "native")
  with pytest.raises(ValueError, match="cannot run"):
    pa.choose(8, 8, np.float32)


def test_the_engine_samples_without_the_kernel(fresh_build, monkeypatch):
  """Continuous batching with no compiler: the XLA path, and the samples
  of the engine forced onto it."""
  monkeypatch.setenv("CXX", "no-such-compiler-rljax")
  config = models.tiny_config(vocab_size=128)
  params = models.init_params(config, jax.random.key(0))
  cfg = base.SamplingConfig(n=2, temperature=1.0, max_new_tokens=12, seed=3)
  prompts = [[5, 17, 3], [9], [4, 8, 15, 16]]
  engine = JaxSampler(
    config, params, max_prompt_len=32, batching="continuous", decode_slots=4
  )
  got = engine.generate(prompts, cfg)
  assert got.timing["attention"] == "xla"
  monkeypatch.setenv(pa.IMPL_ENV, "xla")
  want = JaxSampler(
    config, params, max_prompt_len=32, batching="continuous", decode_slots=4
  ).generate(prompts, cfg)
  assert got.response_ids == want.response_ids
