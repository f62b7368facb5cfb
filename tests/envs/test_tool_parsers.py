"""The tool-call parser registry: each model family's own call syntax,
several calls per turn, Qwen3 think blocks, errors kept as messages."""

import json

import pytest

from rljax import envs
from rljax.envs.tool_parsers import make_parser, parser_for_template

TOOLS = [envs.CalculatorTool(), envs.PythonTool()]


def _call(name, **arguments):
  return {"name": name, "arguments": arguments}


def _calls(parsed):
  return [(c.name, dict(c.arguments)) for c in parsed.calls]


def test_qwen_several_calls_and_think_blocks():
  a, b = _call("calculator", expression="2*3"), _call("python", code="print(1)")
  text = (
    "<think>maybe <tool_call>\n" + json.dumps(b) + "\n</tool_call></think>"
    f"<tool_call>\n{json.dumps(a)}\n</tool_call>\n"
    f"<tool_call>\n{json.dumps(b)}\n</tool_call>"
  )
  parsed = make_parser("qwen").parse(text, TOOLS)
  assert _calls(parsed) == [
    ("calculator", {"expression": "2*3"}),
    ("python", {"code": "print(1)"}),
  ]
  assert not parsed.errors
  unclosed = make_parser("qwen").parse("<think>no end <tool_call>{}", TOOLS)
  assert not unclosed.has_calls  # all of it is reasoning


def test_smollm2_list_form():
  calls = [_call("calculator", expression="1+1"), _call("nope")]
  text = f"<tool_call>{json.dumps(calls)}</tool_call>"
  parsed = make_parser("smollm2").parse(text, TOOLS)
  assert _calls(parsed) == [("calculator", {"expression": "1+1"})]
  assert len(parsed.errors) == 1 and "unknown tool 'nope'" in parsed.errors[0]
  one = make_parser("smollm2").parse(
    f"<tool_call>{json.dumps(calls[0])}</tool_call>", TOOLS
  )
  assert _calls(one) == [("calculator", {"expression": "1+1"})]
  bad = make_parser("smollm2").parse("<tool_call>[1, </tool_call>", TOOLS)
  assert "not valid JSON" in bad.errors[0]


def test_llama3_json_calls():
  a = {"name": "calculator", "parameters": {"expression": "7*6; 1"}}
  b = {"name": "python", "parameters": {"code": "print('}')"}}
  text = f"<|python_tag|>{json.dumps(a)}; {json.dumps(b)}"
  parsed = make_parser("llama3").parse(text, TOOLS)
  assert _calls(parsed) == [
    ("calculator", {"expression": "7*6; 1"}),
    ("python", {"code": "print('}')"}),
  ]
  plain = make_parser("llama3").parse("The answer is \\boxed{42}.", TOOLS)
  assert not plain.has_calls


def test_tags_and_the_registry():
  parsed = make_parser("tags").parse(
    "<calculator>1+2</calculator> then <python>print(3)</python>", TOOLS
  )
  assert [c.name for c in parsed.calls] == ["calculator", "python"]
  with pytest.raises(ValueError, match="parser 'xml'; expected one of"):
    make_parser("xml")
  assert parser_for_template("{{ '<|python_tag|>' }}") == "llama3"
  assert parser_for_template("<tool_call>\n{{ tool_call | tojson }}") == "qwen"
  assert parser_for_template("<tool_call>[{{ calls }}]</tool_call>") == (
    "smollm2"
  )
  assert parser_for_template("{{ message['content'] }}") is None
