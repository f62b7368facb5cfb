"""Tool-call formats: Qwen's <tool_call> JSON and plain tags."""

import json

import pytest

from rljax.envs import CalculatorTool, PythonTool, ToolResult
from rljax.envs.formats import (
  QwenFormat,
  TagFormat,
  ToolCall,
  make_format,
  tool_schemas,
)

TOOLS = [CalculatorTool(), PythonTool()]


def _qwen_call(name, arguments):
  return (
    "<tool_call>\n"
    + json.dumps({"name": name, "arguments": arguments})
    + "\n</tool_call>"
  )


class TestQwenFormat:
  fmt = QwenFormat()

  def test_stop_sequence_is_the_closing_tag(self):
    assert self.fmt.stop_sequences(TOOLS) == ("</tool_call>",)

  def test_call_parsed(self):
    text = "I will compute.\n" + _qwen_call("calculator", {"expression": "2*3"})
    parsed = self.fmt.parse(text, TOOLS)
    assert parsed.items == (ToolCall("calculator", {"expression": "2*3"}),)

  def test_stop_string_dropped_by_the_engine(self):
    text = (
      '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n'
    )
    assert self.fmt.parse(text, TOOLS).calls == (
      ToolCall("python", {"code": "print(1)"}),
    )

  def test_arguments_written_as_a_json_string(self):
    text = _qwen_call("calculator", json.dumps({"expression": "1+1"}))
    assert self.fmt.parse(text, TOOLS).calls[0].arguments == {
      "expression": "1+1"
    }

  def test_no_call_is_a_final_answer(self):
    assert not self.fmt.parse("The answer is \\boxed{6}.", TOOLS).has_calls

  @pytest.mark.parametrize(
    "text,needle",
    [
      ("<tool_call>{not json}</tool_call>", "not valid JSON"),
      ('<tool_call>["calculator"]</tool_call>', '"name"'),
      ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "unknown"),
      (
        '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>',
        "JSON object",
      ),
      ("</tool_call>", "without an opening"),
      ("<tool_call>{<tool_call>{}</tool_call>", "opened again"),
    ],
  )
  def test_malformed_calls_give_errors(self, text, needle):
    parsed = self.fmt.parse(text, TOOLS)
    assert parsed.calls == ()
    assert len(parsed.errors) >= 1 and needle in parsed.errors[0]

  def test_calls_and_errors_keep_their_order(self):
    text = "<tool_call>{bad}</tool_call>" + _qwen_call(
      "calculator", {"expression": "1"}
    )
    items = self.fmt.parse(text, TOOLS).items
    assert isinstance(items[0], str) and isinstance(items[1], ToolCall)

  def test_observation_is_the_templates_tool_turn(self):
    # What the Qwen2.5/Qwen3 templates render for two consecutive `tool`
    # messages after an assistant tool call, up to the next assistant turn.
    text = self.fmt.observation([ToolResult("6"), ToolResult("7")])
    assert text == (
      "<|im_end|>\n<|im_start|>user\n<tool_response>\n6\n</tool_response>\n"
      "<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )

  def test_instructions_list_the_schemas(self):
    text = self.fmt.instructions(TOOLS)
    for schema in tool_schemas(TOOLS):
      assert json.dumps(schema) in text


class TestQwenStrings:
  fmt = QwenFormat()

  def test_a_closing_tag_inside_a_json_string_is_text(self):
    code = 'print("</tool_call>")'
    text = _qwen_call("python", {"code": code})
    assert self.fmt.parse(text, TOOLS).calls == (
      ToolCall("python", {"code": code}),
    )
    assert self.fmt.turn_complete(text, TOOLS)
    first = text.index("</tool_call>") + len("</tool_call>")
    assert not self.fmt.turn_complete(text[:first], TOOLS)


class TestTagFormat:
  fmt = TagFormat()

  def test_stop_sequences_per_tool(self):
    assert self.fmt.stop_sequences(TOOLS) == ("</calculator>", "</python>")

  def test_calls_in_written_order(self):
    text = "<python>print(1)</python> then <calculator> 2+2 </calculator>"
    assert self.fmt.parse(text, TOOLS).calls == (
      ToolCall("python", {"code": "print(1)"}),
      ToolCall("calculator", {"expression": "2+2"}),
    )

  def test_open_tag_at_the_end_is_a_call(self):
    assert self.fmt.parse("so <calculator>7*8", TOOLS).calls == (
      ToolCall("calculator", {"expression": "7*8"}),
    )

  @pytest.mark.parametrize(
    "text,needle",
    [
      ("<calculator></calculator>", "empty"),
      ("1+1</calculator>", "without an opening"),
      ("<calculator>1+<calculator>2</calculator>", "opened again"),
    ],
  )
  def test_malformed_calls_give_errors(self, text, needle):
    errors = self.fmt.parse(text, TOOLS).errors
    assert errors and needle in errors[0]

  def test_observation(self):
    assert (
      self.fmt.observation([ToolResult("4")]) == "\n<output>\n4\n</output>\n"
    )

  @pytest.mark.parametrize(
    "code",
    [
      'print("</python>")',
      "print('</python>')",
      's = """a\n</python>\nb"""\nprint(s)',
      "print('it\\'s </python>')",
      'x = 1  # a quote \' in a comment opens no string\nprint("</python>")',
    ],
  )
  def test_a_closing_tag_inside_a_string_of_code_is_code(self, code):
    text = f"<python>{code}</python> done"
    assert self.fmt.parse(text, TOOLS).calls == (
      ToolCall("python", {"code": code}),
    )
    assert self.fmt.turn_complete(text, TOOLS)
    # Stopped on the string's '>': the call is still open.
    cut = text[: text.index("</python>") + len("</python>")]
    assert not self.fmt.turn_complete(cut, TOOLS)

  def test_complete_turns(self):
    complete = self.fmt.turn_complete
    assert complete("<calculator>2+2</calculator>", TOOLS)
    assert complete("1+1</calculator>", TOOLS)  # stray: answered as an error
    assert not complete("<calculator>2+2", TOOLS)
    assert not complete("a > b", TOOLS)
    # A calculator's body is not code: a quote there is just a character.
    assert complete('<calculator>"2</calculator>', TOOLS)


def test_make_format_names_the_choices():
  assert isinstance(make_format("qwen"), QwenFormat)
  with pytest.raises(ValueError, match="'hermes'.*qwen"):
    make_format("hermes")
