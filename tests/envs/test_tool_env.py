"""ToolEnv: episodes, limits, counters; TokenEnv; summarize."""

import dataclasses

import pytest

from rljax.data.records import Example
from rljax.envs import (
  CalculatorTool,
  Environment,
  ToolEnv,
  ToolEnvConfig,
  ToolResult,
  TokenEnv,
  summarize,
  truncate,
)

EXAMPLE = Example(question="What is 12345 × 6789?", answer=str(12345 * 6789))


@dataclasses.dataclass(frozen=True)
class Echo:
  """A tool that returns its text, or ``n`` copies of "x"."""

  name: str = "echo"
  description: str = "echoes"
  argument: str = "text"
  parameters = {"type": "object"}

  def run(self, arguments, timeout_s):
    text = arguments["text"]
    return ToolResult("x" * int(text[2:]) if text.startswith("n=") else text)


def _env(**limits):
  return ToolEnv([CalculatorTool(), Echo()], ToolEnvConfig(**limits))


class TestEpisode:
  def test_is_an_environment(self):
    assert isinstance(_env(), Environment)

  def test_tool_then_answer(self):
    env = _env()
    prompt = env.reset(EXAMPLE)
    assert EXAMPLE.question in prompt and "<calculator>" in prompt
    step = env.step(
      "Let me use the tool. <calculator>12345 * 6789</calculator>"
    )
    assert step.observation == f"\n<output>\n{12345 * 6789}\n</output>\n"
    assert (step.reward, step.done) == (0.0, False)
    assert step.info["tool_calls"] == 1 and step.info["turns"] == 1
    final = env.step(f"So the answer is \\boxed{{{12345 * 6789}}}.")
    assert (final.observation, final.reward, final.done) == ("", 1.0, True)
    assert final.info["stop_reason"] == "answer"

  def test_a_final_turn_runs_no_call_and_ends(self):
    """EOS inside an open call: the answer, not a call (the engine may
    drop a stop string, but not an EOS)."""
    env = _env()
    env.reset(EXAMPLE)
    step = env.step("<calculator>2+3", final=True)
    assert (step.observation, step.reward, step.done) == ("", 0.0, True)
    assert step.info["tool_calls"] == 0 and step.info["malformed_calls"] == 1
    assert step.info["stop_reason"] == "call_left_open"
    env.reset(EXAMPLE)
    right = f"\\boxed{{{12345 * 6789}}} <echo>hi"
    assert env.step(right, final=True).reward == 1.0  # scored as the answer
    env.reset(EXAMPLE)
    assert not env.step("<calculator>2+3").done  # not final: a call, as before

  def test_wrong_answer_scores_zero(self):
    env = _env()
    env.reset(EXAMPLE)
    assert env.step("\\boxed{1}").reward == 0.0

  def test_malformed_call_is_answered_and_counted(self):
    env = _env()
    env.reset(EXAMPLE)
    step = env.step("<calculator></calculator>")
    assert not step.done and "malformed tool call" in step.observation
    assert step.info["malformed_calls"] == 1 and step.info["tool_calls"] == 0
    step = env.step("<calculator>1 +* 2</calculator>")
    assert step.info["tool_errors"] == {"arguments": 1}

  def test_max_turns_ends_with_zero_reward(self):
    env = _env(max_turns=2)
    env.reset(EXAMPLE)
    assert not env.step("<calculator>1+1</calculator>").done
    last = env.step("<calculator>1+1</calculator>")
    assert (last.done, last.reward, last.info["stop_reason"]) == (
      True,
      0.0,
      "max_turns",
    )
    with pytest.raises(RuntimeError, match="reset"):
      env.step("more")

  def test_max_total_tokens_counts_turns_and_observations(self):
    env = ToolEnv(
      [Echo()], ToolEnvConfig(max_total_tokens=30), count_tokens=len
    )
    env.reset(EXAMPLE)
    step = env.step("<echo>n=10</echo>")  # 17 + 23 chars of observation
    assert step.done and step.info["stop_reason"] == "max_total_tokens"
    assert step.info["total_tokens"] == 17 + len(
      "\n<output>\n" + "x" * 10 + "\n</output>\n"
    )

  def test_tool_output_is_cut_to_the_limits(self):
    env = ToolEnv(
      [Echo()],
      ToolEnvConfig(max_tool_output_chars=50, max_tool_output_tokens=1000),
      count_tokens=len,
    )
    env.reset(EXAMPLE)
    step = env.step("<echo>n=500</echo>")
    body = step.observation.split("<output>\n")[1].split("\n</output>")[0]
    assert len(body) == 50 and body.endswith("[truncated]")
    assert step.info["truncated_outputs"] == 1

  def test_calls_past_the_per_turn_limit_are_malformed(self):
    env = _env(max_calls_per_turn=1)
    env.reset(EXAMPLE)
    step = env.step("<echo>a</echo><echo>b</echo>")
    assert step.info["tool_calls"] == 1 and step.info["malformed_calls"] == 1
    assert "at most 1 tool calls" in step.observation

  def test_qwen_format(self):
    env = ToolEnv([CalculatorTool()], ToolEnvConfig(format="qwen"))
    env.reset(EXAMPLE)
    assert env.stop_sequences == ("</tool_call>",)
    step = env.step(
      '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    )
    assert "<tool_response>\n42\n</tool_response>" in step.observation


class TestTruncate:
  def test_token_budget_by_binary_search(self):
    count = lambda s: len(s.split())  # noqa: E731
    text = " ".join(["w"] * 100)
    cut, was_cut = truncate(text, 10_000, 20, count)
    assert was_cut and count(cut) <= 20 and count(cut) >= 19

  def test_short_text_unchanged(self):
    assert truncate("abc", 16, 4, len) == ("abc", False)


@pytest.mark.parametrize(
  "field,value",
  [
    ("format", "hermes"),
    ("max_turns", 0),
    ("max_calls_per_turn", 1.5),
    ("max_tool_output_chars", 3),
    ("max_tool_output_tokens", 0),
    ("max_total_tokens", -1),
    ("tool_timeout_s", 0),
  ],
)
def test_config_names_the_bad_field(field, value):
  with pytest.raises(
    ValueError, match=rf"ToolEnvConfig\.{field}={value!r}; expected"
  ):
    ToolEnvConfig(**{field: value})


def test_tools_need_distinct_names():
  with pytest.raises(ValueError, match="distinct"):
    ToolEnv([CalculatorTool(), CalculatorTool()])


class TestTokenEnv:
  def test_only_the_observation_is_encoded(self):
    # A toy character tokenizer: ids are code points.
    encoded = []

    def encode(text):
      encoded.append(text)
      return [ord(c) for c in text]

    env = TokenEnv(_env(), encode, lambda ids: "".join(map(chr, ids)))
    prompt_ids = env.reset(EXAMPLE)
    turn = [ord(c) for c in "<calculator>2*3</calculator>"]
    step = env.step(turn)
    assert (
      "".join(map(chr, step.observation_ids)) == "\n<output>\n6\n</output>\n"
    )
    # The model's turn is decoded for the env, never re-encoded.
    assert encoded == [
      "".join(map(chr, prompt_ids)),
      "\n<output>\n6\n</output>\n",
    ]
    assert env.stop_sequences == ("</calculator>", "</echo>")


def test_summarize():
  infos = [
    {
      "turns": 2,
      "tool_calls": 1,
      "malformed_calls": 1,
      "tool_errors": {"math": 1},
    },
    {"turns": 1, "tool_calls": 0, "malformed_calls": 0, "tool_errors": {}},
  ]
  assert summarize(infos) == {
    "episodes": 2.0,
    "tool_call_rate": 0.5,
    "malformed_call_rate": 0.5,
    "turns_mean": 1.5,
    "tool_calls_mean": 0.5,
    "malformed_calls": 1.0,
    "tool_error/math": 1.0,
  }
  assert summarize([]) == {}
