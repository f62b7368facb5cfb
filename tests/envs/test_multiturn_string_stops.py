"""Turns end by stop string, not by token, on the real SmolLM2 tokenizer.

The forced tiny decoder of test_multiturn.py (its greedy next token a
function of the current one) writes ``<python>print(3 >2)</python>.`` with
the closing tag split as ``</`` ``py`` ``thon`` ``>.`` (the tag ends inside
a token that carries text after it) and a ``>`` inside the code, then
writes on: with ``stop_by="string"`` the engine is given EOS alone, so no
call ends on a ``>``; the driver cuts the turn after ``>.`` and drops what
the engine sampled after it, log-probs and mask aligned.
"""

import dataclasses

import numpy as np
import pytest

from rljax.envs import PythonTool
from rljax.models.pretrained import tiny_tokenizer
from rljax.rollout.jax_sampler import JaxSampler
from rljax.rollout.multiturn import MultiTurnConfig
from rljax.rollout.stop_strings import stop_matcher, turn_end
from tests.envs.test_multiturn import (
  EOS,
  GREEDY,
  PROMPT_LAST,
  TURN_2,
  _forced_decoder,
  _ids,
  _run,
)

CALL = ["<", "python", ">", "print", "(", "3", "Ġ>", "2", ")", "</", "py"]
CALL += ["thon", ">."]
OBSERVATION = "\n<output>\nTrue\n</output>\n"


@pytest.fixture(scope="module")
def tokenizer():
  return tiny_tokenizer()


@pytest.fixture(scope="module")
def sampler(tokenizer):
  call, answer = _ids(tokenizer, CALL), _ids(tokenizer, TURN_2) + [EOS]
  last_prompt = tokenizer.encode(PROMPT_LAST, add_special_tokens=False)[-1]
  last_obs = tokenizer.encode(OBSERVATION, add_special_tokens=False)[-1]
  chain = [(last_prompt, call[0])] + list(zip(call[:-1], call[1:]))
  # After the closing tag the model writes on: a new call's opening.
  chain += [(call[-1], call[0])]
  chain += [(last_obs, answer[0])] + list(zip(answer[:-1], answer[1:]))
  script = {}
  for a, b in chain:
    assert script.setdefault(a, b) == b, f"token {a} has two successors"
  config, params = _forced_decoder(tokenizer, script)
  return JaxSampler(config, params, max_prompt_len=256)


def _episode(sampler, tokenizer, **config):
  return _run(
    sampler, tokenizer, GREEDY, MultiTurnConfig(max_response_tokens=128, **config),
    tool=PythonTool(),
  )  # fmt: skip


def _check_rows(out, recorder, tokenizer):
  """Each row: the call cut after its closing tag, the tool's observation,
  the answer; every model run is engine outputs for exactly its prefix (the last one
  cut after the stop), log-probs the engine's."""
  call, answer = _ids(tokenizer, CALL), _ids(tokenizer, TURN_2) + [EOS]
  obs = tokenizer.encode(OBSERVATION, add_special_tokens=False)
  batch = out.batch
  for row in range(batch.num_samples):
    ids, logp = batch.response_ids[row], np.asarray(batch.behav_logp[row])
    prompt = batch.prompt_ids[row // batch.n]
    assert ids == call + obs + answer
    mask = [1] * len(call) + [0] * len(obs) + [1] * len(answer)
    np.testing.assert_array_equal(batch.action_mask[row], mask)
    np.testing.assert_array_equal(logp[len(call) : len(call) + len(obs)], 0.0)
    for start, run in ((0, call), (len(call) + len(obs), answer)):
      pos = start
      while pos < start + len(run):  # engine outputs, one after another
        got = [
          (g, g_logp)
          for p, g, g_logp in recorder.calls
          if p == prompt + ids[:pos]
        ]
        assert got, f"row {row}: no engine output for the run at {pos}"
        g, g_logp = got[0]
        k = min(len(g), start + len(run) - pos)
        assert g[:k] == ids[pos : pos + k]
        np.testing.assert_array_equal(logp[pos : pos + k], g_logp[:k])
        pos += k
  assert [i["tool_calls"] for i in out.infos] == [1] * batch.num_samples
  assert [i["tool_errors"] for i in out.infos] == [{}] * batch.num_samples
  np.testing.assert_array_equal(out.rewards, [1, 1, 0, 0])  # 57, not 60


def test_string_stops_end_no_call_on_a_bare_gt(tokenizer, sampler):
  out, recorder, envs = _episode(sampler, tokenizer, stop_by="string")
  _check_rows(out, recorder, tokenizer)
  assert all(e.observations == [OBSERVATION] for e in envs)
  # One call per turn: neither the opening tag's '>' nor the code's ' >'
  # ended one; every call ended at EOS or at its limit.
  assert out.metrics["engine_calls"] == 2.0
  assert out.metrics["continuations"] == 0.0
  for (_, got, _), limit in zip(recorder.calls, recorder.limits):
    assert got[-1] == EOS or len(got) == limit
  # The turn's 16-id call wrote 13 ids of the call and 3 after it.
  assert out.metrics["dropped_after_stop_mean"] == 3.0


def test_token_stops_keep_the_same_rows(tokenizer, sampler):
  """The default: the engine stops on ids that can complete the tag (the
  opening tag's bare '>'; not the code's ' >'), and the rows are the same
  ids and log-probs."""
  out, recorder, _ = _episode(sampler, tokenizer)
  _check_rows(out, recorder, tokenizer)
  assert out.metrics["continuations"] == 4.0  # the opening '>' of each row
  assert out.metrics["dropped_after_stop_mean"] == 0.0


def test_chunks_carry_the_automaton_state_across_calls(tokenizer, sampler):
  """Chunks of 5 ids split the closing tag between calls (``</`` ends the
  second, ``py thon >.`` are in the third): the state carried across calls
  still ends the turn at ``>.``."""
  out, recorder, _ = _episode(
    sampler, tokenizer, stop_by="string", string_stop_chunk=5
  )
  call = _ids(tokenizer, CALL)
  assert all(r[: len(call)] == call for r in out.batch.response_ids)
  assert out.metrics["dropped_after_stop_mean"] == 2.0  # 15 - 13
  for _, got, _ in recorder.calls:
    assert len(got) <= 5


def test_turn_end_on_the_real_tokenizer(tokenizer):
  matcher = stop_matcher(tokenizer, ("</python>",))
  code = '<python>if 3 >2:\n  print("a</python>")\n</python>\nmore'
  ids = tokenizer.encode(code, add_special_tokens=False)

  def closes(k):  # the closing tag outside the code's strings
    return tokenizer.decode(ids[:k]).count("</python>") == 2

  end, _ = turn_end(matcher, ids, 0, closes)
  assert tokenizer.decode(ids[:end]).endswith("</python>")
  assert tokenizer.decode(ids[:end]).count("</python>") == 2
  # Fed one id at a time, the carried state finds the same end.
  state = 0
  for k, token in enumerate(ids):
    found, state = turn_end(
      matcher, [token], state, lambda _, k=k: closes(k + 1)
    )
    if found is not None:
      assert k + 1 == end
      break
  else:
    pytest.fail("no stop found id by id")


def test_bad_stop_settings_are_named():
  with pytest.raises(ValueError, match=r"stop_by='regex'.*one of"):
    MultiTurnConfig(stop_by="regex")
  with pytest.raises(ValueError, match="string_stop_chunk=-1"):
    MultiTurnConfig(string_stop_chunk=-1)
  assert dataclasses.replace(MultiTurnConfig(), stop_by="string")
