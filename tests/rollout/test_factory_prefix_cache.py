"""rollout.factory keeps a vLLM engine's prefix cache between calls when
asked (multi-turn tool episodes: `Actor` asks for tool tasks), and resets it
before every call otherwise. The sidecar's constructor is replaced by one
that records its config: no server starts."""

import pytest

from rljax.rollout import factory, vllm_sidecar


@pytest.mark.parametrize("reuse", [False, True])
def test_vllm_prefix_cache_follows_reuse(monkeypatch, tmp_path, reuse):
  seen = {}

  def engine_for_model(model_config, params, path, **kwargs):
    seen.update(kwargs)
    return "engine"

  monkeypatch.setattr(vllm_sidecar, "engine_for_model", engine_for_model)
  out = factory.make_engine(
    "vllm",
    None,
    None,
    quant="none",
    max_prompt_len=64,
    max_new_tokens=32,
    pad_id=0,
    run_dir=str(tmp_path),
    reuse_prefix_cache=reuse,
  )
  assert out == "engine"
  assert seen["config"].fresh_prefix_cache is (not reuse)
  assert seen["config"].max_model_len == 96


def actor_engine_kwargs(monkeypatch, cfg) -> dict:
  """The keywords the trainer's `Actor` hands `factory.make_engine` for
  `cfg` (stopped there: the engine itself is not needed)."""
  from rljax.train import actor as actor_lib  # pylint: disable=g-import-not-at-top

  seen = []

  def make_engine(*args, **kwargs):
    seen.append(kwargs)
    raise RuntimeError("stop here")

  monkeypatch.setattr(actor_lib.rollout_factory, "make_engine", make_engine)
  with pytest.raises(RuntimeError, match="stop here"):
    actor_lib.Actor(cfg, None, None, None)
  return seen[0]


def test_the_trainer_reuses_the_cache_for_tool_tasks_only(monkeypatch):
  from rljax.train.config import apply_preset

  seen = []
  for task in ("tool_arithmetic", "arithmetic"):
    cfg = apply_preset("grpo", {"model.name": "tiny", "task.name": task})
    seen.append(actor_engine_kwargs(monkeypatch, cfg)["reuse_prefix_cache"])
  assert seen == [True, False]
