"""`--task.tool_choice=required` (rljax/train/tool_task.py): the first
prompt ends with a call's opening, the model writes the rest, and the
environment reads the turn with the opening put back."""

import json

import pytest

from rljax import envs
from rljax.data.records import Example
from rljax.models.pretrained import tiny_tokenizer
from rljax.train import tool_task
from rljax.train.config import ConfigError, apply_preset

EXAMPLE = Example(question="What is 19 \u00d7 3?", answer="57", uid="q")


def _env(tool_choice, format_name="tags", tool=None):
  return tool_task.make_tool_env(
    tool or envs.CalculatorTool(),
    envs.ToolEnvConfig(format=format_name, max_turns=3),
    tool_task.ToolPrompt(),
    tiny_tokenizer(),
    tool_choice,
  )


def test_required_reads_the_first_turn_with_the_opening():
  env = _env("required")
  env.reset(EXAMPLE)
  first = env.step("19*3</calculator>")  # the model's text after "<calculator>"
  assert not first.done and "57" in first.observation
  assert first.info["tool_calls"] == 1 and first.info["malformed_calls"] == 0
  last = env.step("The answer is \\boxed{57}.")  # later turns: as written
  assert last.done and last.reward == 1.0 and last.info["turns"] == 2
  # A new episode opens with the prefill again.
  env.reset(EXAMPLE)
  assert env.step("2+2</calculator>").info["tool_calls"] == 1


def test_auto_reads_the_same_text_without_the_opening():
  env = _env("auto")
  env.reset(EXAMPLE)
  out = env.step("19*3</calculator>")  # a stray closing tag: no call ran
  assert out.info["tool_calls"] == 0 and out.info["malformed_calls"] == 1
  assert "57" not in out.observation


def test_qwen_prefix_plus_argument_is_one_valid_call():
  env = _env("required", "qwen")
  env.reset(EXAMPLE)
  out = env.step('19*3"}}\n</tool_call>')
  assert out.info["tool_calls"] == 1 and out.info["malformed_calls"] == 0
  assert "57" in out.observation
  prefix = tool_task.call_prefix(envs.PythonTool(), "qwen")
  body = prefix.split("\n", 1)[1] + 'print(1)"}}'
  assert json.loads(body) == {
    "name": "python",
    "arguments": {"code": "print(1)"},
  }


def test_unknown_tool_choice_is_refused():
  with pytest.raises(ValueError, match="tool_choice='always'"):
    _env("always")
  with pytest.raises(ConfigError, match="task.tool_choice"):
    apply_preset(
      "grpo",
      {"task.name": "tool_arithmetic", "task.tool_choice": "always"},
    )


def test_trainer_prompt_ends_with_the_opening(tmp_path):
  tok = tiny_tokenizer()
  overrides = {
    "model.name": "tiny",
    "task.name": "tool_arithmetic",
    "task.max_prompt_tokens": 512,
    "task.eval_size": 2,
    "rollout.max_new_tokens": 64,
    "run.run_dir": str(tmp_path),
  }
  auto = tool_task.build_tool_task(apply_preset("grpo", overrides), tok)
  req = tool_task.build_tool_task(
    apply_preset("grpo", {**overrides, "task.tool_choice": "required"}), tok
  )
  try:
    example = req.eval_examples()[0]
    opening = tok.encode("<calculator>", add_special_tokens=False)
    assert req.prompt_ids(example) == auto.prompt_ids(example) + opening
    assert isinstance(req.make_env(), tool_task.FirstCallPrefilled)
    assert isinstance(auto.make_env(), envs.ToolEnv)
  finally:
    auto.close()
    req.close()
