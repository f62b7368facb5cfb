"""--rollout.batching picks the JAX sampler's batching (static by default,
continuous on request), and is refused where it would do nothing."""

import pytest

from rljax import models
from rljax.rollout import factory
from rljax.train import config as config_lib


def test_default_is_static_and_continuous_is_taken():
  cfg = config_lib.TrainConfig()
  assert cfg.rollout.batching == "static"
  assert cfg.replace({"rollout.batching": "continuous"}).rollout.batching == (
    "continuous"
  )


@pytest.mark.parametrize(
  "values,match",
  [
    ({"rollout.batching": "paged"}, "--rollout.batching"),
    (
      {"rollout.batching": "continuous", "rollout.engine": "vllm"},
      "--rollout.batching='continuous'",
    ),
  ],
)
def test_bad_or_no_op_settings_are_refused(values, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.TrainConfig().replace(values)


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_the_factory_hands_it_to_the_sampler(batching):
  engine = factory.make_engine(
    "jax",
    models.tiny_config(),
    None,
    quant="none",
    max_prompt_len=16,
    max_new_tokens=8,
    pad_id=0,
    batching=batching,
  )
  assert engine.batching == batching
