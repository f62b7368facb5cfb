"""rollout.factory: one engine boundary for the trainer."""

import pytest

from rljax.rollout import factory
from rljax.rollout.base import EngineFailure


class _FlakyEngine:
  """Fails its first call the way a dead sidecar does (a fake: no server)."""

  def __init__(self, failures):
    self.failures, self.restarts = failures, 0

  def call(self):
    if self.failures:
      self.failures -= 1
      raise EngineFailure("server died")
    return "ok"

  def restart(self):
    self.restarts += 1


class TestCallWithRestart:
  def test_restarts_once_then_retries(self):
    engine, seen = _FlakyEngine(1), []
    out = factory.call_with_restart(
      engine, "rollout", engine.call, lambda what, e: seen.append(what)
    )
    assert (out, engine.restarts, seen) == ("ok", 1, ["rollout"])

  def test_a_second_failure_propagates(self):
    engine = _FlakyEngine(2)
    with pytest.raises(EngineFailure, match="server died"):
      factory.call_with_restart(engine, "sync", engine.call)
    assert engine.restarts == 1

  def test_other_errors_are_not_retried(self):
    def bad():
      raise ValueError("bad weights")

    engine = _FlakyEngine(0)
    with pytest.raises(ValueError):
      factory.call_with_restart(engine, "sync", bad)
    assert engine.restarts == 0

  def test_unknown_engine(self):
    with pytest.raises(ValueError, match=r"engine='sglang'"):
      factory.make_engine(
        "sglang",
        None,
        None,
        quant="none",
        max_prompt_len=8,
        max_new_tokens=8,
        pad_id=0,
      )
