"""--rollout.chunk_steps: the continuous engine's most decode steps between
two scheduling points (where finished rows leave, prompts join and a
streaming run takes new weights), from the flag to the sampler."""

import inspect

import pytest

from rljax import models
from rljax.rollout import factory
from rljax.train import config as config_lib
from tests.rollout.test_factory_prefix_cache import actor_engine_kwargs

CONTINUOUS = {"rollout.batching": "continuous"}


def test_default_is_the_samplers():
  from rljax.rollout.jax_sampler import JaxSampler  # pylint: disable=g-import-not-at-top

  default = inspect.signature(JaxSampler).parameters["chunk_steps"].default
  assert config_lib.TrainConfig().rollout.chunk_steps == default


@pytest.mark.parametrize(
  "values,match",
  [
    ({**CONTINUOUS, "rollout.chunk_steps": 0}, "--rollout.chunk_steps=0"),
    ({"rollout.chunk_steps": 4}, "--rollout.chunk_steps=4.*batching='static'"),
  ],
)
def test_bad_or_no_op_settings_are_refused(values, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.TrainConfig().replace(values)


def test_the_factory_hands_it_to_the_sampler():
  engine = factory.make_engine(
    "jax", models.tiny_config(), None, quant="none", max_prompt_len=16,
    max_new_tokens=8, pad_id=0, batching="continuous", chunk_steps=4,
  )  # fmt: skip
  assert engine.chunk_steps == 4


def test_the_trainer_hands_it_to_the_factory(monkeypatch):
  cfg = config_lib.apply_preset(
    "grpo", {"model.name": "tiny", **CONTINUOUS, "rollout.chunk_steps": 2}
  )
  assert actor_engine_kwargs(monkeypatch, cfg)["chunk_steps"] == 2
