"""The trainer's tool task in a chat format: `--task.tool_format=chat_*`
picks the parser, `--task.max_calls_per_turn` bounds the calls run per
turn, a chat template that takes `tools=` renders the tools, and turns end
by stop string."""

import copy

import pytest

from rljax import envs
from rljax.models.pretrained import tiny_tokenizer
from rljax.train import tool_task
from rljax.train.config import ConfigError
from tests.train.test_tool_training import _config

# A ChatML template that lists the tools the way Qwen's does.
_TOOLS_TEMPLATE = (
  "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n"
  "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
  "For each function call, return a json object within <tool_call>"
  "</tool_call> tags.<|im_end|>\n{% endif %}"
  "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
  "{{ message['content'] }}<|im_end|>\n{% endfor %}"
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _task(tmp_path, tokenizer, **overrides):
  overrides = {"task.tool_format": "chat_qwen", **overrides}
  cfg = _config(tmp_path, **{"task.max_prompt_tokens": 512, **overrides})
  return tool_task.build_tool_task(cfg, tokenizer)


def test_chat_format_task_builds_its_environment(tmp_path):
  task = _task(tmp_path, tiny_tokenizer(), **{"task.max_calls_per_turn": 3})
  try:
    env = task.make_env()
    assert isinstance(env.format, envs.ChatFormat) and env.eos_ends_turn
    assert env.config.max_calls_per_turn == 3
    assert task.multiturn_config.stop_by == "string"
    # SmolLM2's template takes no tools: the instructions list them.
    assert not env.config.tools_in_template
    assert '"name": "calculator"' in task.prompt_text(task.eval_examples()[0])
  finally:
    task.close()


def test_a_template_that_takes_tools_renders_them(tmp_path):
  tokenizer = copy.deepcopy(tiny_tokenizer())
  tokenizer.chat_template = _TOOLS_TEMPLATE
  task = _task(tmp_path, tokenizer)
  try:
    assert task.env_config.tools_in_template
    text = task.prompt_text(task.eval_examples()[0])
    assert text.startswith("<|im_start|>system\n# Tools\n<tools>\n")
    assert text.count('"name": "calculator"') == 1  # the template's only
    assert text.endswith("<|im_start|>assistant\n")
  finally:
    task.close()
  # The template writes Qwen's calls: another chat format is named.
  assert "chat_qwen" in tool_task.template_mismatch(tokenizer, "chat_smollm2")
  assert tool_task.template_mismatch(tokenizer, "chat_qwen") == ""


def test_bad_max_calls_per_turn_is_named(tmp_path):
  with pytest.raises(ConfigError, match=r"--task.max_calls_per_turn=0"):
    _config(tmp_path, **{"task.max_calls_per_turn": 0})
  # Without tools it would change nothing.
  with pytest.raises(ConfigError, match=r"--task.max_calls_per_turn=3"):
    _config(
      tmp_path, **{"task.name": "arithmetic", "task.max_calls_per_turn": 3}
    )


@pytest.mark.parametrize("name", ["chat_qwen", "chat_llama3", "chat_smollm2"])
def test_forced_first_call_is_read_in_each_chat_format(name):
  tool = envs.CalculatorTool()
  prefix = tool_task.call_prefix(tool, name)
  turn = {
    "chat_qwen": '2*3"}}\n</tool_call>',
    "chat_llama3": '2*3"}}',
    "chat_smollm2": '2*3"}}]</tool_call>',
  }[name]
  parsed = envs.make_format(name).parse(prefix + turn, [tool])
  assert [(c.name, dict(c.arguments)) for c in parsed.items] == [
    ("calculator", {"expression": "2*3"})
  ]
