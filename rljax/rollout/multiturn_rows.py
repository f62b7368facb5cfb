"""The driver's record of one multi-turn row and how it reads a turn,
shared by both paths of `multiturn` (one engine call per turn, and the
kept-KV run of `multiturn_kv`): `Row` (ids, log-probs, action mask, the
environment and its state), `Turns` (where a turn stops in the ids an
engine sampled, what is kept, continuations and cuts), and the
environment's answer to a complete turn (`env_step_of`, `answer_turn`).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import numpy as np

from rljax.envs.base import Environment
from rljax.rollout.stop_strings import turn_end


@dataclasses.dataclass
class Row:
  """One episode as it will be trained: prompt, response ids (model and
  observations), their log-probs and mask, and the environment's state."""

  env: Environment
  prompt: list[int]
  ids: list[int] = dataclasses.field(default_factory=list)
  logp: list[float] = dataclasses.field(default_factory=list)
  mask: list[int] = dataclasses.field(default_factory=list)
  # The version of the weights that sampled each id (an observation's ids:
  # that of the turn they answer); stamped only where the caller asks.
  versions: list[int] = dataclasses.field(default_factory=list)
  turn_start: int = 0  # where the model turn in progress began in ``ids``
  stop_state: int = 0  # the stop automaton's state after the turn so far
  done: bool = False
  finish: str = "stop"
  reward: float = 0.0
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  # (index of the turn's last model id, reward) of turns before the last.
  turn_rewards: list[tuple[int, float]] = dataclasses.field(
    default_factory=list
  )

  def room(self, turn_cap: int, budget: int) -> int:
    """Ids this row may still generate in the turn in progress."""
    return min(
      turn_cap - (len(self.ids) - self.turn_start), budget - len(self.ids)
    )

  def cut(self, reason: str) -> None:
    self.done, self.finish = True, "length"
    turns = self.info.get("turns", 0) + 1  # the turn that was cut
    self.info = {**EMPTY_INFO, **self.info, "turns": turns}
    self.info["stop_reason"] = reason


EMPTY_INFO = {
  "turns": 0,
  "tool_calls": 0,
  "malformed_calls": 0,
  "tool_errors": {},
  "stop_reason": "",
}


@dataclasses.dataclass
class Turns:
  """How the driver reads the ids an engine sampled for a row (either
  path): where the turn stops, what is kept, continuations and cuts; and
  the counts of those."""

  tokenizer: Any
  matcher: Any
  eos: set[int]
  turn_cap: int
  budget: int
  chunk: int
  decode_kw: dict[str, Any]
  continuations: int = 0
  dropped: int = 0

  def room(self, row: Row) -> int:
    """Ids the row's next engine segment may sample."""
    room = row.room(self.turn_cap, self.budget)
    return min(room, self.chunk) if self.chunk else room

  def take(
    self, row: Row, room: int, ids, logp, version: int = 0
  ) -> tuple[str, bool] | None:
    """Appends the kept ids of one segment (limited to `room`, sampled by
    weights of `version`) to the row.
    Returns (the turn's text, final) when a turn ended and the environment
    is to answer it (`_step`); None when the row goes on in its next
    segment (a '>' that closed nothing, a chunk's end) or was cut."""
    ids, logp = [int(t) for t in ids], np.asarray(logp, np.float32)
    if len(ids) > room:
      raise RuntimeError(
        f"rollout_multiturn: the engine returned {len(ids)} ids for a "
        f"row limited to {room}; expected at most its limit"
      )
    end = None
    if self.matcher is not None:
      head = row.ids[row.turn_start :]

      def closes(k):
        text = self.tokenizer.decode(head + ids[:k], **self.decode_kw)
        return turn_complete(row.env, text)

      end, row.stop_state = turn_end(self.matcher, ids, row.stop_state, closes)
    if end is not None:  # a closed call: the ids after it are dropped
      self.dropped += len(ids) - end
      ids, logp = ids[:end], logp[:end]
    row.ids += ids
    row.logp += logp.tolist()
    row.mask += [1] * len(ids)
    row.versions += [int(version)] * len(ids)
    final = end is None and bool(ids) and ids[-1] in self.eos
    if end is None and not final:
      if not ids or row.room(self.turn_cap, self.budget) <= 0:
        row.cut(cut_reason(row, self.budget))
      else:
        self.continuations += 1  # a '>' that closed nothing, or a chunk's end
      return None
    turn = self.tokenizer.decode(row.ids[row.turn_start :], **self.decode_kw)
    eos_turn = final and bool(getattr(row.env, "eos_ends_turn", False))
    return turn, final and not eos_turn

  @staticmethod
  def env_step(row: Row, turn: str, final: bool):
    """The environment's answer to a turn (a tool may run: any thread)."""
    return env_step_of(row.env, turn, final)

  def answer(self, row: Row, result, final: bool) -> None:
    """`answer_turn`: the observation's ids appended, or the episode ended."""
    answer_turn(row, result, self.tokenizer, self.budget, final)


def turn_complete(env: Any, turn: str) -> bool:
  """A turn that stopped on a stop token holds a closed call: the
  environment's reading where it has one, else any stop sequence."""
  check = getattr(env, "turn_complete", None)
  if callable(check):
    return bool(check(turn))
  return any(s in turn for s in env.stop_sequences)


def env_step_of(env: Any, turn: str, final: bool):
  """`env.step(turn)`, told the turn is final (EOS) where it takes that."""
  if final:
    try:
      takes_final = "final" in inspect.signature(env.step).parameters
    except (TypeError, ValueError):
      takes_final = False
    if takes_final:
      return env.step(turn, final=True)
  return env.step(turn)


def cut_reason(row: Row, budget: int) -> str:
  return "max_response_tokens" if len(row.ids) >= budget else "max_new_tokens"


def step(row: Row, turn: str, tokenizer: Any, budget: int, final: bool) -> None:
  """The environment answers a complete turn (`answer_turn`)."""
  answer_turn(row, env_step_of(row.env, turn, final), tokenizer, budget, final)


def answer_turn(row: Row, result, tokenizer: Any, budget: int, final: bool):
  """The environment's answer to a complete turn: its observation's own
  ids (mask 0, log-prob 0) are appended, or the episode ends. A `final`
  turn (the model's EOS) ends the episode whatever the environment
  answers."""
  row.info = {**EMPTY_INFO, **dict(result.info)}
  if result.done or final:  # the outcome reward: the row's own
    row.done, row.finish = True, "stop"
    row.reward += float(result.reward)
    if not result.done:
      row.info["stop_reason"] = "eos"  # the environment wanted more
    return
  if result.reward:  # a reward of this turn: at its last model id
    row.turn_rewards.append((len(row.ids) - 1, float(result.reward)))
  obs = [
    int(t)
    for t in tokenizer.encode(result.observation, add_special_tokens=False)
  ]
  if len(row.ids) + len(obs) >= budget:  # no room left to answer it
    row.done, row.finish = True, "length"
    row.info["stop_reason"] = "max_response_tokens"
    return
  row.ids += obs
  row.logp += [0.0] * len(obs)
  row.mask += [0] * len(obs)
  row.versions += [row.versions[-1] if row.versions else 0] * len(obs)
  row.turn_start, row.stop_state = len(row.ids), 0
