"""The word problems that take a program: seeded, every kind drawn, and
each problem's own program prints its answer (the answers are computed
apart from the program text, so this checks both)."""

import contextlib
import io

import pytest

from rljax.envs import generate_tool_word_problems, score_answer


def test_seeded_and_every_kind_is_drawn():
  a = generate_tool_word_problems(60, seed=1)
  assert a == generate_tool_word_problems(60, seed=1)
  assert a != generate_tool_word_problems(60, seed=2)
  assert len({e.metadata["kind"] for e in a}) == 6
  assert len({e.uid for e in a}) == 60


@pytest.mark.parametrize("level", ["easy", "hard"])
def test_each_program_prints_its_answer(level):
  for example in generate_tool_word_problems(30, seed=0, level=level):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      exec(example.metadata["code"], {})  # noqa: S102 (our own program)
    assert out.getvalue().strip() == example.answer, example.question
    text = f"The answer is \\boxed{{{example.answer}}}."
    assert score_answer(text, example.answer) == 1.0


def test_levels_scale_the_sizes_and_bad_input_is_named():
  easy = generate_tool_word_problems(40, seed=0, level="easy")
  hard = generate_tool_word_problems(40, seed=0, level="hard")
  assert sum(len(e.answer) for e in hard) > sum(len(e.answer) for e in easy)
  with pytest.raises(ValueError, match="level='extreme'; expected one of"):
    generate_tool_word_problems(1, seed=0, level="extreme")
  with pytest.raises(ValueError, match="n=-1"):
    generate_tool_word_problems(-1, seed=0)
