"""The arithmetic difficulty knob: a level name or a spec of
KEY=VALUE overrides gives the generator config it names."""

import pytest

from rljax import data
from rljax.data.arithmetic import ARITHMETIC_LEVELS
from rljax.train.config import TrainConfig, check


def test_level_names_are_unchanged():
  for name, level in ARITHMETIC_LEVELS.items():
    assert data.parse_difficulty(name) is level


def test_spec_overrides_a_level_or_easy():
  cfg = data.parse_difficulty("steps=2_digits=2_ops=+-*")
  assert (cfg.num_steps, cfg.operand_min, cfg.operand_max, cfg.operators) == (
    2,
    10,
    99,
    ("+", "-", "*"),
  )
  cfg = data.parse_difficulty("medium_max=99")
  assert (cfg.num_steps, cfg.operand_min, cfg.operand_max) == (2, 1, 99)
  assert data.parse_difficulty("digits=1").operand_min == 1
  # Later keys win: max after digits.
  assert data.parse_difficulty("digits=2_max=50").operand_max == 50


def test_generated_problems_follow_the_spec():
  for ex in data.generate_arithmetic(50, "steps=3_digits=2", seed=1):
    steps = ex.metadata["steps"]
    assert len(steps) == 3 and 10 <= ex.metadata["start"] <= 99
    assert all(10 <= n <= 99 for _, n in steps)
  # Same spec, same seed, same problems.
  a = data.generate_arithmetic(5, "steps=2_digits=2", seed=3)
  b = data.generate_arithmetic(5, "steps=2_digits=2", seed=3)
  assert [e.question for e in a] == [e.question for e in b]


@pytest.mark.parametrize(
  "spec,match",
  [
    ("steps=0", "num_steps"),
    ("trivial", "unknown level 'trivial'"),
    ("easy_size=3", "'size=3' is not KEY=VALUE"),
    ("digits=x", "digits='x' is not a valid value"),
    ("neg=2", "neg='2'"),
    ("ops=+^", "operators"),
  ],
)
def test_bad_specs_name_the_part(spec, match):
  with pytest.raises(ValueError, match=match):
    data.parse_difficulty(spec)


def test_train_config_accepts_specs_and_names_a_bad_one():
  check(
    TrainConfig().replace(
      {"task.name": "arithmetic", "task.difficulty": "steps=2_digits=2"}
    )
  )
  with pytest.raises(ValueError, match="--task.difficulty="):
    check(
      TrainConfig().replace(
        {"task.name": "arithmetic", "task.difficulty": "steps=two"}
      )
    )
