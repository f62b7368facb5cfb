"""The generated calculator task and its verifier."""

import pytest

from rljax.envs import (
  ToolArithmeticConfig,
  generate_tool_arithmetic,
  score_answer,
)
from rljax.envs.calculator import calculate


def test_seeded_and_exact():
  a = generate_tool_arithmetic(50, seed=3)
  assert a == generate_tool_arithmetic(50, seed=3)
  assert a != generate_tool_arithmetic(50, seed=4)
  for example in a:
    # The question's expression, as written (× and −), means the answer.
    expression = example.metadata["expression"]
    assert example.question == f"What is {expression}?"
    assert calculate(expression) == int(example.answer) >= 0


def test_operands_and_steps_in_range():
  config = ToolArithmeticConfig(
    min_steps=2, max_steps=3, min_digits=4, max_digits=6
  )
  for example in generate_tool_arithmetic(100, seed=0, config=config):
    tokens = example.metadata["expression"].split()
    operands = [int(t) for t in tokens[::2]]
    assert 2 <= len(operands) - 1 <= 3
    assert all(1000 <= x <= 999_999 for x in operands)


def test_needs_a_tool():
  # Most problems have answers past what mental arithmetic carries.
  examples = generate_tool_arithmetic(100, seed=0)
  assert sum(len(e.answer) >= 8 for e in examples) >= 60


@pytest.mark.parametrize(
  "completion,score",
  [
    ("... so \\boxed{541050078}", 1.0),
    ("The answer is 541,050,078.", 1.0),
    ("<answer>541050078</answer>", 1.0),
    ("\\boxed{541050077}", 0.0),
    ("541050078", 0.0),  # no answer format: not graded as an answer
    ("<output>541050078</output> \\boxed{5}", 0.0),  # the final answer counts
  ],
)
def test_score_answer(completion, score):
  assert score_answer(completion, "541050078") == score


@pytest.mark.parametrize(
  "field,value",
  [
    ("min_steps", 0),
    ("max_steps", 1),
    ("min_digits", 10),
    ("max_digits", 3),
    ("operators", ("/",)),
  ],
)
def test_config_names_the_bad_field(field, value):
  with pytest.raises(ValueError, match=rf"ToolArithmeticConfig\.{field}="):
    ToolArithmeticConfig(**{field: value})
