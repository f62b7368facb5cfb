"""The ends of a multi-turn turn, on the forced tiny decoder of
test_multiturn.py (its greedy next token a function of the current one)
and the real JaxSampler: a turn ended by EOS inside an open call, a
closing tag inside the call's own string, and each row's own token limit.
"""

import numpy as np
import pytest

from rljax.rollout import base
from rljax.rollout.jax_sampler import JaxSampler
from tests.envs.test_multiturn import (
  CONFIG,
  EOS,
  GREEDY,
  PROMPT_LAST,
  TURN_1,
  TURN_2,
  PlainRecorder,
  Recorder,
  _assert_token_in_token_out,
  _forced_decoder,
  _ids,
  _run,
)


@pytest.fixture(scope="module")
def tokenizer():
  from rljax.models.pretrained import tiny_tokenizer  # pylint: disable=g-import-not-at-top

  return tiny_tokenizer()


def _edge_sampler(tokenizer, chain):
  """A JaxSampler of the forced decoder for `chain`: (token, successor or
  tuple of equally likely successors) pairs."""
  script = {}
  for a, b in chain:
    assert script.setdefault(a, b) == b, f"token {a} has two successors"
  config, params = _forced_decoder(tokenizer, script)
  return JaxSampler(config, params, max_prompt_len=256)


def _prompt_last(tokenizer):
  return tokenizer.encode(PROMPT_LAST, add_special_tokens=False)[-1]


class TestTurnEdges:
  """The ends of a turn: EOS inside an open call, a closing tag inside the
  call's own string, and each row's own token limit."""

  def test_eos_inside_an_open_call_ends_the_episode_unrun(self, tokenizer):
    # "<calculator>2+3" then EOS: the '>' of the opening tag stops the
    # engine (a continuation), EOS ends the answer with the call open.
    ids = _ids(tokenizer, ["<", "calcul", "ator", ">", "2", "+", "3"]) + [EOS]
    chain = [(_prompt_last(tokenizer), ids[0])] + list(zip(ids[:-1], ids[1:]))
    out, recorder, envs = _run(
      _edge_sampler(tokenizer, chain), tokenizer, GREEDY, CONFIG
    )
    for row, info in enumerate(out.infos):
      assert out.batch.response_ids[row] == ids  # nothing after EOS
      assert np.all(out.batch.action_mask[row])  # no observation
      assert info["tool_calls"] == 0 and info["malformed_calls"] == 1
      assert info["stop_reason"] == "call_left_open" and info["turns"] == 1
    assert out.batch.finish_reason == ["stop"] * 4
    np.testing.assert_array_equal(out.rewards, 0.0)
    assert out.metrics["engine_calls"] == 2.0
    _assert_token_in_token_out(out, recorder, envs, tokenizer, 128)

  def test_a_closing_tag_in_the_codes_string_does_not_close_it(self, tokenizer):
    # <python>print(" </python>")</python>: the '>")' after the string's
    # tag stops the engine, but the call is open until the last '>'.
    from rljax.envs import PythonTool  # pylint: disable=g-import-not-at-top

    call = _ids(tokenizer, ["<", "python", ">", "print", '("', "Ġ</", "py"])
    call += _ids(tokenizer, ["thon", '>")', "</", "python", ">"])
    answer = _ids(tokenizer, TURN_2) + [EOS]
    observation = "\n<output>\n </python>\n</output>\n"
    last_obs = tokenizer.encode(observation, add_special_tokens=False)[-1]
    chain = [(_prompt_last(tokenizer), call[0])]
    chain += list(zip(call[:-2], call[1:-1]))  # the closing '>' stops
    chain += [(last_obs, answer[0])] + list(zip(answer[:-1], answer[1:]))
    out, recorder, envs = _run(
      _edge_sampler(tokenizer, chain), tokenizer, GREEDY, CONFIG,
      tool=PythonTool(),
    )  # fmt: skip
    for row, info in enumerate(out.infos):
      assert info["tool_calls"] == 1 and info["malformed_calls"] == 0
      assert info["tool_errors"] == {}, info  # the whole code ran
      assert envs[row].observations == [observation]
    np.testing.assert_array_equal(out.rewards, [1, 1, 0, 0])
    # Stops on the opening '>' and on '>")' closed nothing.
    assert out.metrics["continuations"] == 8.0
    _assert_token_in_token_out(out, recorder, envs, tokenizer, 128)

  @pytest.mark.parametrize("own_limits", [True, False])
  def test_each_row_decodes_no_further_than_its_own_limit(
    self, tokenizer, own_limits
  ):
    """A fork after '<' sends rows down a 4-id or an 8-id way to the
    opening '>', so the next call holds rows with 10 or 6 ids of the
    14-id turn left: each is generated with its own limit (in one call
    where the engine takes per-row limits, else a call per limit), and
    none decodes an id it would not keep."""
    turn = _ids(tokenizer, TURN_1)
    detour = _ids(tokenizer, ["x", "y", "z", "w"])
    chain = [(_prompt_last(tokenizer), turn[0])]
    chain += [(turn[0], (turn[1], detour[0]))]
    chain += list(zip(detour, detour[1:] + [turn[1]]))
    chain += list(zip(turn[1:-1], turn[2:]))
    sampling = base.SamplingConfig(
      n=4, temperature=1.0, max_new_tokens=14, stop_token_ids=(EOS,), seed=1
    )
    out, recorder, _ = _run(
      _edge_sampler(tokenizer, chain), tokenizer, sampling, CONFIG,
      recorder_cls=Recorder if own_limits else PlainRecorder,
    )  # fmt: skip
    rows = out.batch.response_ids
    detoured = [r for r in rows if r[1] == detour[0]]
    assert detoured and len(detoured) < len(rows), "the fork took one way"
    # The second call of each row: after the opening '>' (4 or 8 ids in).
    short, long_ = turn[:4], turn[:1] + detour + turn[1:4]
    rooms = {tuple(short): 10, tuple(long_): 6}
    seen = set()
    for (prompt, ids, _), limit in zip(recorder.calls, recorder.limits):
      assert len(ids) <= limit
      for way, room in rooms.items():
        if tuple(prompt[-len(way) :]) == way and len(prompt) == (
          len(out.batch.prompt_ids[0]) + len(way)
        ):
          seen.add(room)
          assert len(ids) <= room, (room, ids)  # no id decoded to be cut
    assert seen == {6, 10}
    for row, ids in enumerate(rows):
      if ids[1] == detour[0]:  # 8 ids, then 6 of the call's 8: cut
        assert len(ids) == 14 and out.batch.finish_reason[row] == "length"
        assert out.infos[row]["stop_reason"] == "max_new_tokens"
