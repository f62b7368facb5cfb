"""Tool calls in the model's own chat format: the parser registry wired
into ``ToolEnv`` (``format="chat_*"``), several calls per turn run
concurrently up to ``max_calls_per_turn``, and the rollout driver ending
such a turn at EOS without ending the episode."""

import dataclasses
import json
import threading
import time

import numpy as np
import pytest

from rljax import envs
from rljax.data.records import Example
from rljax.models.pretrained import tiny_tokenizer
from rljax.rollout import base
from rljax.rollout.multiturn import MultiTurnConfig, rollout_multiturn

EOS = 2  # <|im_end|>


@dataclasses.dataclass(frozen=True)
class SlowEcho:
  """A tool that sleeps, then answers its text and the thread it ran on."""

  seconds: float = 0.3
  name: str = "echo"
  description: str = "Echoes its text."
  argument: str = "text"
  parameters = {"type": "object", "properties": {"text": {"type": "string"}}}

  def run(self, arguments, timeout_s):
    time.sleep(self.seconds)
    return envs.ToolResult(f"{arguments['text']}@{threading.get_ident()}")


def _qwen_call(name, **arguments):
  body = json.dumps({"name": name, "arguments": arguments})
  return f"<tool_call>\n{body}\n</tool_call>"


def _env(fmt="chat_qwen", tools=None, **config):
  env = envs.ToolEnv(
    tools or [envs.CalculatorTool()],
    envs.ToolEnvConfig(format=fmt, **config),
  )
  env.reset(Example(question="What is 19 × 3?", answer="57", uid="a"))
  return env


def test_each_family_is_read_and_answered_in_its_own_syntax():
  tools = [envs.CalculatorTool()]
  turns = {
    "chat_qwen": _qwen_call("calculator", expression="2*3")
    + _qwen_call("calculator", expression="4+1"),
    "chat_llama3": '<|python_tag|>{"name": "calculator", "parameters": '
    '{"expression": "2*3"}}; {"name": "calculator", "parameters": '
    '{"expression": "4+1"}}',
    "chat_smollm2": '<tool_call>[{"name": "calculator", "arguments": '
    '{"expression": "2*3"}}, {"name": "calculator", "arguments": '
    '{"expression": "4+1"}}]</tool_call>',
  }
  observations = {
    "chat_qwen": "\n<|im_start|>user\n<tool_response>\n6\n</tool_response>\n"
    "<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    "chat_llama3": "<|start_header_id|>ipython<|end_header_id|>\n\n6<|eot_id|>"
    "<|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "chat_smollm2": "\n<|im_start|>tool\n6<|im_end|>\n<|im_start|>tool\n5"
    "<|im_end|>\n<|im_start|>assistant\n",
  }
  for name, turn in turns.items():
    env = _env(name, tools)
    assert env.eos_ends_turn and env.stop_sequences == ()
    assert not env.turn_complete(turn)  # never stops on a string
    result = env.step(turn)
    assert not result.done, name
    assert result.observation == observations[name]
    assert (
      result.info["tool_calls"] == 2 and result.info["malformed_calls"] == 0
    )
  # The instructions list the tools, unless the chat template does.
  fmt = envs.make_chat_format("chat_qwen")
  assert '"name": "calculator"' in fmt.instructions(tools)
  assert envs.make_chat_format("chat_qwen", True).instructions(tools) == ""


def test_qwen3_think_block_calls_do_not_run():
  env = _env("chat_qwen")
  turn = (
    "<think>maybe " + _qwen_call("calculator", expression="1/0") + "</think>"
    "The answer is \\boxed{57}."
  )
  result = env.step(turn)
  assert result.done and result.reward == 1.0
  assert (
    result.info["tool_calls"] == 0 and result.info["stop_reason"] == "answer"
  )


def test_calls_run_concurrently_up_to_max_calls_per_turn():
  tool = SlowEcho(seconds=0.4)
  env = _env("chat_qwen", [tool], max_calls_per_turn=3)
  turn = "".join(_qwen_call("echo", text=t) for t in "abcd")
  start = time.perf_counter()
  result = env.step(turn)
  seconds = time.perf_counter() - start
  assert seconds < 1.0, seconds  # 3 × 0.4 s in sequence
  outputs = [
    body.split("\n")[1]
    for body in result.observation.split("<tool_response>")[1:]
  ]
  assert [o.split("@")[0] for o in outputs[:3]] == ["a", "b", "c"]
  assert len({o.split("@")[1] for o in outputs[:3]}) == 3  # three threads
  assert (
    outputs[3] == "error: malformed tool call: at most 3 tool calls per turn"
  )
  assert result.info["tool_calls"] == 3 and result.info["malformed_calls"] == 1


def test_bad_chat_settings_are_named():
  with pytest.raises(ValueError, match=r"format='xml'.*chat_qwen"):
    envs.ToolEnvConfig(format="xml")
  with pytest.raises(
    ValueError, match=r"tools_in_template=True.*format='tags'"
  ):
    envs.ToolEnvConfig(format="tags", tools_in_template=True)
  with pytest.raises(ValueError, match=r"max_calls_per_turn=0"):
    envs.ToolEnvConfig(format="chat_qwen", max_calls_per_turn=0)


class ScriptedEngine:
  """An engine that writes each row's next scripted turn, whatever the
  prompt (log-probs -0.5, -0.5, ... so alignment shows)."""

  def __init__(self, turns):
    self.turns, self.calls = turns, []

  def generate(self, prompt_ids, sampling):
    rows = [p for p in prompt_ids for _ in range(sampling.n)]
    turn = self.turns[len(self.calls)]
    self.calls.append((rows, sampling))
    ids = [list(turn)[: sampling.max_new_tokens] for _ in rows]
    return base.RolloutBatch(
      prompt_ids=[list(p) for p in prompt_ids],
      response_ids=ids,
      behav_logp=[np.full(len(r), -0.5, np.float32) for r in ids],
      finish_reason=["stop"] * len(ids),
      n=sampling.n,
      timing={},
    )


def test_driver_runs_a_chat_turn_that_ends_at_eos():
  tok = tiny_tokenizer()
  calls = _qwen_call("calculator", expression="19*3") + _qwen_call(
    "calculator", expression="1+1"
  )
  turn_1 = tok.encode(calls, add_special_tokens=False) + [EOS]
  turn_2 = tok.encode("The answer is \\boxed{57}.", add_special_tokens=False)
  engine = ScriptedEngine([turn_1, turn_2 + [EOS]])
  envs_made = []

  def make_env():
    envs_made.append(
      envs.ToolEnv([envs.CalculatorTool()], envs.ToolEnvConfig("chat_qwen"))
    )
    return envs_made[-1]

  sampling = base.SamplingConfig(
    n=1, greedy=True, max_new_tokens=64, stop_token_ids=(EOS,)
  )
  out = rollout_multiturn(
    engine,
    [Example(question="What is 19 × 3?", answer="57", uid="a")],
    make_env,
    tok,
    sampling,
    MultiTurnConfig(max_response_tokens=256, stop_by="string"),
  )
  # EOS alone stops the engine: the chat format has no stop strings.
  assert [s.stop_token_ids for _, s in engine.calls] == [(EOS,), (EOS,)]
  obs = tok.encode(
    "\n<|im_start|>user\n<tool_response>\n57\n</tool_response>\n"
    "<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    add_special_tokens=False,
  )
  ids = out.batch.response_ids[0]
  assert ids == turn_1 + obs + turn_2 + [EOS]
  mask = [1] * len(turn_1) + [0] * len(obs) + [1] * (len(turn_2) + 1)
  np.testing.assert_array_equal(out.batch.action_mask[0], mask)
  np.testing.assert_array_equal(
    out.batch.behav_logp[0], np.where(np.asarray(mask) == 1, -0.5, 0.0)
  )
  assert out.infos[0]["tool_calls"] == 2 and out.infos[0]["turns"] == 2
  assert out.infos[0]["stop_reason"] == "answer"
  np.testing.assert_array_equal(out.rewards, [1.0])


def test_llama3_reads_the_leading_calls_only():
  from rljax.envs.tool_parsers import make_parser  # pylint: disable=g-import-not-at-top

  tools = [envs.CalculatorTool()]
  parser = make_parser("llama3")
  a = '{"name": "calculator", "parameters": {"expression": "1;2"}}'
  parsed = parser.parse(f"{a} ;\n {a}\nThen I add them.", tools)
  assert [dict(c.arguments) for c in parsed.calls] == [
    {"expression": "1;2"}
  ] * 2
  assert not parsed.errors
  assert "not valid JSON" in parser.parse('{"name": "calc', tools).errors[0]
  assert "JSON object" in parser.parse(f"{a}; [1]", tools).errors[0]


def test_every_format_is_made_by_name():
  assert set(envs.FORMATS) == {
    "tags",
    "qwen",
    "chat_qwen",
    "chat_llama3",
    "chat_smollm2",
  }
  assert isinstance(envs.make_format("chat_llama3"), envs.ChatFormat)
  assert isinstance(envs.make_format("qwen"), envs.QwenFormat)
  with pytest.raises(
    ValueError, match=r"'hermes'; expected one of .*chat_qwen"
  ):
    envs.make_format("hermes")


def test_python_calls_of_one_turn_run_side_by_side():
  """Two sandboxed processes at once: each its own output, no error."""
  env = _env("chat_qwen", [envs.PythonTool()])
  turn = _qwen_call("python", code="print(6 * 7)") + _qwen_call(
    "python", code="print('b' * 3)"
  )
  result = env.step(turn)
  assert result.info["tool_errors"] == {} and result.info["tool_calls"] == 2
  assert result.observation == (
    "\n<|im_start|>user\n<tool_response>\n42\n</tool_response>\n"
    "<tool_response>\nbbb\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
  )
