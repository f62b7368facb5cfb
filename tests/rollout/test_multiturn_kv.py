"""Multi-turn episodes that keep their KV in the continuous engine
(`rollout_multiturn(..., kv_reuse=True)`: `multiturn_kv`, `slot_episodes`,
`slot_append`).

The model is the sharp tiny random decoder of test_continuous_batching.py
(no near-ties for float noise to flip), so the KV matters: a row's next
token after an observation depends on every key it attends to. A toy
tokenizer (an id is its decimal text) and a toy environment (each model
turn that ends at a stop id is answered with a few ids, until the third
turn) make whole episodes of several turns without a real tool.
"""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import toy
from rljax.data.records import Example
from rljax.envs import CalculatorTool, ToolEnv, ToolEnvConfig
from rljax.envs.base import StepResult
from rljax.models.pretrained import tiny_tokenizer
from rljax.rollout import base
from rljax.rollout.jax_sampler import JaxSampler
from rljax.rollout.multiturn import MultiTurnConfig, rollout_multiturn
from tests.envs.test_multiturn import EOS
from tests.envs.test_multiturn import GREEDY as FORCED_GREEDY
from tests.envs.test_multiturn import OBSERVATION, TURN_1, TURN_2
from tests.envs.test_multiturn import _forced_decoder, _ids, _script

_CONFIG = models.tiny_config(vocab_size=128)
# Prompts whose greedy turns all end at a stop id (their episodes end by
# the environment), and two whose turns run to the turn cap (cut).
ENDING = [[5, 17, 3], [4, 8, 15, 16, 23, 42, 7], [11, 12], [6]]
CUT = [[9], [1, 2, 3]]
STOPS = (5, 30, 92, 110, 111)
GREEDY = base.SamplingConfig(
  n=2, greedy=True, max_new_tokens=16, stop_token_ids=STOPS
)
BUDGET = 48
INFO = {"tool_calls": 0, "malformed_calls": 0, "tool_errors": {}}


@pytest.fixture(scope="module")
def engine():
  """One continuous engine for the module (its programs compile once)."""
  return JaxSampler(
    _CONFIG,
    toy.sharp_params(_CONFIG, jax.random.key(0)),
    max_prompt_len=64,
    batching="continuous",
    decode_slots=4,
    chunk_steps=8,
  )


class Answers:
  """Ends a turn at EOS (any stop id) as the chat formats do; answers
  turn t with 3 + t ids (20, 21, ...), ends the episode at the third.
  `before_step` runs first (a slow tool); `ended` gets the time the
  episode's last step returned."""

  stop_sequences = ()
  eos_ends_turn = True

  def __init__(self, before_step=None, ended=None):
    self.turns = 0
    self.before_step = before_step
    self.ended = ended

  def reset(self, example):
    return example.question

  def step(self, turn):
    del turn
    if self.before_step is not None:
      self.before_step()
    self.turns += 1
    info = {**INFO, "turns": self.turns, "tool_calls": self.turns}
    if self.turns >= 3:
      if self.ended is not None:
        self.ended(time.perf_counter())
      return StepResult("", 1.0, True, info)
    obs = " ".join(str(20 + i) for i in range(3 + self.turns))
    return StepResult(obs, 0.0, False, info)


def _examples(prompts):
  return [
    Example(question=" ".join(map(str, q)), answer="", uid=str(i))
    for i, q in enumerate(prompts)
  ]


def _rollout(engine, prompts, make_env, kv_reuse, **config):
  return rollout_multiturn(
    engine,
    _examples(prompts),
    make_env,
    toy.DecimalTokenizer(_CONFIG.vocab_size),
    GREEDY,
    MultiTurnConfig(max_response_tokens=BUDGET, **config),
    kv_reuse=kv_reuse,
  )


def test_kept_kv_gives_the_per_turn_drivers_tokens_and_logp(engine):
  """Greedy: the same rows as one engine call per turn that prefills each
  row's whole history again. Log-probs within float noise: the history's
  keys come from decode steps and observation appends instead of one
  prefill, the same f32 terms summed in another order (~1e-6 relative on
  log-probs of tens of nats, as test_continuous_batching.py argues)."""
  prompts = ENDING + CUT
  want = _rollout(engine, prompts, Answers, kv_reuse=False)
  got = _rollout(engine, prompts, Answers, kv_reuse=True)
  a, b = want.batch, got.batch
  assert b.response_ids == a.response_ids
  assert b.finish_reason == a.finish_reason
  assert {"stop", "length"} <= set(b.finish_reason)
  for x, y in zip(a.action_mask, b.action_mask):
    np.testing.assert_array_equal(x, y)
  for x, y in zip(a.behav_logp, b.behav_logp):
    np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got.rewards, want.rewards)
  # Episodes of three turns, two observations each, were run.
  assert [i["turns"] for i in got.infos] == [3] * len(b.response_ids)
  observed = sum(int((~m).sum()) for m in b.action_mask)
  assert observed == len(b.response_ids) * (4 + 5)
  # One run; each prompt prefilled once (at most: several in one
  # program), the observations appended, never the history again.
  m = got.metrics
  assert m["engine_calls"] == 1.0 and want.metrics["engine_calls"] == 3.0
  assert m["engine/prefills"] <= len(prompts)
  assert m["engine/appended_tokens"] == observed


def test_a_slow_tool_does_not_stall_the_other_rows(engine):
  """Row 0's first tool call waits until the other episodes of the
  prompts in `ENDING` have ended (their last step returned; at most
  300 s, compiles included): under a turn barrier no other row could start
  its second turn meanwhile and the wait would time out. The prompts are
  those of the test above (its compiled programs)."""
  waits_for = len(ENDING) * GREEDY.n - 1  # rows 1 .. 7
  ended: dict[int, float] = {}
  others_done = threading.Event()
  released: list[float] = []

  def on_end(k):
    def note(t):
      ended[k] = t
      if len([j for j in ended if 1 <= j <= waits_for]) == waits_for:
        others_done.set()

    return note

  def slow():
    if not released:
      released.append(float(others_done.wait(timeout=300)))
      released.append(time.perf_counter())

  made = []

  def make_env():
    k = len(made)
    made.append(Answers(before_step=slow if k == 0 else None, ended=on_end(k)))
    return made[-1]

  out = _rollout(engine, ENDING + CUT, make_env, kv_reuse=True, tool_workers=2)
  assert released[0] == 1.0, "the slow tool timed out: the other rows waited"
  assert all(ended[k] < released[1] for k in range(1, waits_for + 1))
  assert ended[0] > released[1]  # its episode went on after the tool
  assert out.batch.finish_reason[: waits_for + 1] == ["stop"] * (waits_for + 1)
  # While row 0's tool ran, rows left and re-entered the decode batch.
  assert out.metrics["engine/parked_peak"] >= 2
  assert out.metrics["engine/appends"] >= 2


def test_row_counts_of_one_bucket_share_their_programs(engine):
  """The pool an episode run holds is sized by a power of two of its rows
  and prompts (`SlotPlan.held_rows`, `entries`), so a run of 6 rows and
  one of 8 run the same programs: the second compiles nothing."""
  _rollout(engine, ENDING[:3], Answers, kv_reuse=True)
  before = engine.num_compiles
  _rollout(engine, ENDING, Answers, kv_reuse=True)
  assert engine.num_compiles == before


def test_kv_reuse_needs_an_engine_that_keeps_episode_kv(engine):
  static = JaxSampler(_CONFIG, engine.params, max_prompt_len=64)
  with pytest.raises(ValueError, match="kv_reuse=True"):
    _rollout(static, ENDING, Answers, kv_reuse=True)
  with pytest.raises(ValueError, match="tool_workers"):
    MultiTurnConfig(tool_workers=0)


@pytest.fixture(scope="module")
def forced():
  """test_multiturn.py's forced decoder (its greedy next token a function
  of the current one) through a calculator episode, on a continuous
  engine."""
  tokenizer = tiny_tokenizer()
  config, params = _forced_decoder(tokenizer, _script(tokenizer))
  engine = JaxSampler(
    config,
    params,
    max_prompt_len=256,
    batching="continuous",
    decode_slots=4,
    chunk_steps=8,
  )
  return tokenizer, config, params, engine


@pytest.mark.parametrize("stop_by", ["token", "string"])
def test_a_real_tool_episode_with_stop_strings(forced, stop_by):
  """The calculator episode of test_multiturn.py, its call's tag split
  across ids: "token" stops the engine at the opening tag's '>' (a
  continuation, nothing appended); "string" decodes past the closing tag
  and the ids after it are taken back (the row's KV rewound there) before
  the observation is appended. Each row is the call, the calculator's
  observation, the answer; log-probs the model's on those ids."""
  tokenizer, config, params, engine = forced
  out = rollout_multiturn(
    engine,
    [
      Example(question="What is 19 × 3?", answer="57", uid="a"),
      Example(question="What is 20 × 3?", answer="60", uid="b"),
    ],
    lambda: ToolEnv([CalculatorTool()], ToolEnvConfig(max_turns=4)),
    tokenizer,
    FORCED_GREEDY,
    MultiTurnConfig(max_response_tokens=128, stop_by=stop_by),
    kv_reuse=True,
  )
  turn_1, turn_2 = _ids(tokenizer, TURN_1), _ids(tokenizer, TURN_2)
  obs = tokenizer.encode(OBSERVATION, add_special_tokens=False)
  batch = out.batch
  for row in range(4):
    ids = batch.response_ids[row]
    assert ids == turn_1 + obs + turn_2 + [EOS]
    mask = [1] * len(turn_1) + [0] * len(obs) + [1] * (len(turn_2) + 1)
    np.testing.assert_array_equal(batch.action_mask[row], mask)
    prompt = batch.prompt_ids[row // batch.n]
    logits = models.forward(config, params, jnp.asarray([prompt + ids]))
    want = jax.nn.log_softmax(logits[0, len(prompt) - 1 : -1])
    want = np.asarray(want)[np.arange(len(ids)), ids]
    got, on = np.asarray(batch.behav_logp[row]), np.asarray(mask, bool)
    np.testing.assert_allclose(got[on], want[on], rtol=1e-3, atol=1e-7)
    np.testing.assert_array_equal(got[~on], 0.0)
  np.testing.assert_array_equal(out.rewards, [1, 1, 0, 0])
  assert out.metrics["engine_calls"] == 1.0
  if stop_by == "token":
    assert out.metrics["continuations"] == 4.0
  else:
    assert out.metrics["dropped_after_stop_mean"] > 0
