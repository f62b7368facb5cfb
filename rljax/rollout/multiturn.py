"""Multi-turn rollouts with tools, token in / token out, on any engine.

``rollout_multiturn(engine, examples, make_env, tokenizer, sampling)`` runs
one episode per (example, sample): the model writes a turn, the environment
(``rljax.envs.Environment``, e.g. a ``ToolEnv``) answers it, and so on until
the episode ends. Every row of one turn is generated in one engine call;
rows whose episode ended drop out of the next call (or, ``kv_reuse``, all
episodes in one engine run: below).

Token in / token out: a row is its prompt's ids followed by the ids the
engine sampled and the ids of each observation, tokenized on its own
(``tokenizer.encode(observation)``), in order. The conversation is never
decoded and re-encoded: decoding is only for the environment to read a turn.
Re-encoding would not give the same ids (BPE merges across the boundary of a
turn and an observation, and sampled ids need not be the tokenizer's
canonical split of their text), so the trained tokens would differ from the
tokens whose ``behav_logp`` the engine returned.
``MultiTurnRollout.batch.action_mask`` marks the model's tokens (1) apart
from the observations' (0, with ``behav_logp`` 0.0 there).

Where a turn stops. A turn ends where its text first holds a stop sequence
(a closing tag such as ``</calculator>``) that closes a call, wherever the
tokenizer split it: ``stop_strings.StopMatcher`` walks the sampled ids (an
automaton over their texts, its state carried from one engine call to the
next) and the environment confirms the call closed (``turn_complete``).
Engines stop on ids only, so ``MultiTurnConfig.stop_by`` says what they are
given:

  "string"  the EOS ids only: no call ends on a ``>`` that closes nothing.
            Each call decodes up to the turn's room (or
            ``string_stop_chunk`` ids); the driver cuts the turn after the
            id that completes the stop and drops the ids sampled after it
            (and their log-probs), which the kept ids do not depend on.
  "token"   the EOS ids plus every id that can complete a stop sequence
            (``StopMatcher.completing_ids``; a bare ``>`` among them): the
            engine decodes no id past a stop, but a ``>`` that closes
            nothing ends the call too and the row goes on in the next call
            (a "continuation"; on the JAX engine a prefill of the row, or
            with ``kv_reuse`` none: the row just decodes on).

Either way the kept ids and their log-probs are the engine's, untouched;
the ids of a turn cut at its stop are those an engine stopping exactly
there would have sampled. Environments with no stop sequences (the chat
formats, whose turns end at the model's end-of-turn id) stop on EOS alone.

Continuing from the cached prefix. With ``kv_reuse=True`` (the JAX
sampler's continuous engine, ``multiturn_kv``) nothing is prefilled again:
every episode runs in one engine run, a row that stops at a tool call
leaves the decode batch with its KV pages kept, its environment step runs
in a thread pool (``MultiTurnConfig.tool_workers``) while the other rows
decode (no turn barrier), and its observation's ids are prefilled onto its
own pages at its next positions before it decodes on (``slot_episodes``,
``slot_append``). Opt-in, not automatic: sampled rows draw other random
streams than the per-turn calls (one key per row for its whole episode),
and speculation and in-flight weight updates are not taken there.
Otherwise (any engine) each call passes a row's whole ids as the
prompt. The JAX sampler re-fills the row's KV: it prefills prompt, earlier
turns and observations again (one prefill of the row per turn; its decode
steps are the same as in one long generation). vLLM gets the ids as the
prompt (``/v1/completions`` with a token-id prompt) and, with prefix caching
on (vLLM's default), reuses the KV blocks of the prefix it computed in the
previous turn; run the sidecar with ``VLLMSidecarConfig(fresh_prefix_cache=
False)``, since the default resets the cache before every call.

A stop is a closed call only if the environment says so
(``env.turn_complete(turn)`` where it has one: ``ToolEnv`` does not count a
closing tag inside a string of the call's code; else any stop sequence in
the turn). A turn that ends in EOS is the model's end of the episode: the
environment gets it as final (``env.step(turn, final=True)`` where its
step takes that: a call left open is not run) and the episode ends there
whatever the environment answers; except where the environment's format
ends a call turn at EOS (``env.eos_ends_turn``, the chat formats): there
EOS ends the turn, its calls run, and only a turn without calls ends the
episode.

Limits: ``sampling.max_new_tokens`` caps one model turn (its segments
together), ``MultiTurnConfig.max_response_tokens`` the ids after the prompt
(model and observations together, counted in ids, not in re-encoded text as
``ToolEnvConfig.max_total_tokens`` is). Each row is generated with its own
limit, what is left of both (``max_new_tokens_per_sample`` of engines that
take it; otherwise one call per distinct limit), so no row decodes past
its limit. A row that reaches either ends with finish reason "length"
(reward 0), as does one whose observation does not fit (the observation is
left out). The environment ends the others (an answer, ``max_turns``, ...)
with finish reason "stop".
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from rljax.core import _validation as v
from rljax.data.records import Example
from rljax.envs.base import Environment, summarize
from rljax.rollout import multiturn_kv
from rljax.rollout.multiturn_rows import EMPTY_INFO, Row, Turns, step
from rljax.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig
from rljax.rollout.stop_strings import stop_matcher

__all__ = [
  "MultiTurnConfig",
  "MultiTurnRollout",
  "Tokenizer",
  "STOP_BY",
  "rollout_multiturn",
  "stop_token_table",
]

# What the engine stops on (MultiTurnConfig.stop_by).
STOP_BY = ("token", "string")
# The prefix of a kept-KV run's own figures in `MultiTurnRollout.metrics`
# (`slot_episodes.run`'s counts: prefills, appends, decode steps, ...).
ENGINE_METRICS = "engine/"
# A seed per engine call: calls after the first must not replay its keys.
_SEED_STRIDE = 0x9E3779B1
_SEED_RANGE = 2**31


class Tokenizer(Protocol):
  """What the driver needs of a (transformers) tokenizer."""

  def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

  def decode(self, ids: Sequence[int], **kwargs: Any) -> str: ...

  def __len__(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class MultiTurnConfig:
  """Limits of the driver (the environment has its own, ``ToolEnvConfig``).

  Attributes:
    max_response_tokens: ids after the prompt, model turns and observations
      together (>= 1); the packed response width.
    skip_special_tokens: decode turns for the environment without special
      tokens (the ids are kept either way).
    stop_by: "token" or "string", the ids the engine stops on (module
      doc): "string" ends no engine call on a '>' that closes nothing, at
      the cost of ids decoded past a stop and dropped.
    string_stop_chunk: with ``stop_by="string"``, ids per engine call
      (>= 0; 0 = the turn's whole room): smaller chunks decode fewer ids
      past a stop and make more engine calls.
    tool_workers: with ``kv_reuse``, threads running environment steps
      (tools) at once (>= 1) while the engine decodes the other rows.
  """

  max_response_tokens: int = 1024
  skip_special_tokens: bool = True
  stop_by: str = "token"
  string_stop_chunk: int = 0
  tool_workers: int = 8

  def __post_init__(self):
    v.check_field(
      "MultiTurnConfig",
      "max_response_tokens",
      self.max_response_tokens,
      v.all_of(v.is_int, v.at_least(1)),
    )
    v.check_field(
      "MultiTurnConfig",
      "skip_special_tokens",
      self.skip_special_tokens,
      v.is_bool,
    )
    v.check_field(
      "MultiTurnConfig", "stop_by", self.stop_by, v.one_of(*STOP_BY)
    )
    v.check_field(
      "MultiTurnConfig",
      "string_stop_chunk",
      self.string_stop_chunk,
      v.all_of(v.is_int, v.at_least(0)),
    )
    v.check_field(
      "MultiTurnConfig",
      "tool_workers",
      self.tool_workers,
      v.all_of(v.is_int, v.at_least(1)),
    )


@dataclasses.dataclass
class MultiTurnRollout:
  """The trajectories of one multi-turn rollout.

  Attributes:
    batch: prompts, responses (model and observation ids interleaved),
      ``behav_logp`` (0.0 on observation ids), finish reasons and
      ``action_mask`` (1 model id, 0 observation id), rows as
      ``RolloutBatch`` orders them.
    rewards: float32 [P * n], each episode's outcome: the reward of its
      last step (0 for an episode the driver cut). Rewards of earlier steps
      are ``batch.turn_rewards`` (at each turn's last model id; None when
      every one is 0, as with ``ToolEnv``).
    infos: each episode's last info (``ToolEnv``'s counters), with
      ``stop_reason`` set by the driver where it cut the episode.
    metrics: ``rljax.envs.summarize`` of the infos, plus the driver's
      counts (engine calls, continuations after a false stop or a chunk,
      ids decoded past a stop and dropped, model and
      observation ids per episode, truncation rate).
  """

  batch: RolloutBatch
  rewards: np.ndarray
  infos: list[dict[str, Any]]
  metrics: dict[str, float]


# (id(tokenizer), chars) -> (the tokenizer, kept alive so that its id is
# not reused, and its table).
_TABLES: dict[tuple[int, str], tuple[Any, tuple[int, ...]]] = {}


def stop_token_table(
  tokenizer: Tokenizer, stop_sequences: Sequence[str]
) -> tuple[int, ...]:
  """Ids of every token whose text holds the last character of a stop
  sequence (cached per tokenizer): a superset of the ids that can complete
  one, which the driver takes from ``StopMatcher.completing_ids``."""
  if not stop_sequences or any(
    not isinstance(s, str) or not s for s in stop_sequences
  ):
    raise ValueError(
      v.field_message(
        "stop_sequences", stop_sequences, "a non-empty list of non-empty str"
      )
    )
  last = "".join(sorted({s[-1] for s in stop_sequences}))
  key = (id(tokenizer), last)
  if key not in _TABLES:
    size = len(tokenizer)
    texts = [tokenizer.decode([i]) for i in range(size)]
    _TABLES[key] = (
      tokenizer,
      tuple(i for i, t in enumerate(texts) if any(c in t for c in last)),
    )
  return _TABLES[key][1]


def _check_args(engine, examples, sampling, config) -> None:
  if not callable(getattr(engine, "generate", None)):
    raise TypeError(
      f"rollout_multiturn: engine={engine!r:.80}; expected a RolloutEngine "
      "(JaxSampler, VLLMSidecar, ...) or anything with its generate"
    )
  if not isinstance(sampling, SamplingConfig):
    raise TypeError(
      f"rollout_multiturn: sampling={sampling!r:.80}; expected a "
      "rljax.rollout.SamplingConfig"
    )
  if not sampling.stop_token_ids:
    raise ValueError(
      "rollout_multiturn: sampling.stop_token_ids is empty; expected the "
      "model's EOS id(s), which end the final answer"
    )
  if not isinstance(config, MultiTurnConfig):
    raise TypeError(
      f"rollout_multiturn: config={config!r:.80}; expected a MultiTurnConfig"
    )
  if not examples or not all(isinstance(e, Example) for e in examples):
    raise ValueError(
      "rollout_multiturn: examples must be a non-empty list of Example"
    )


def _check_capacity(engine, prompts: list[list[int]], budget: int) -> None:
  """A row's last call passes prompt + budget ids as the prompt: refuse now
  what the engine would refuse in the middle of the rollout."""
  most = getattr(engine, "max_prompt_len", None)
  longest = max(len(p) for p in prompts)
  if isinstance(most, int) and longest + budget > most:
    raise ValueError(
      f"rollout_multiturn: the longest prompt ({longest} ids) plus "
      f"MultiTurnConfig.max_response_tokens={budget} exceeds the engine's "
      f"max_prompt_len={most}; expected a longer max_prompt_len or a smaller "
      "max_response_tokens"
    )


def _batch(
  prompts, rows: list[Row], n: int, timing, stamped: bool = False
) -> RolloutBatch:
  turn_rewards = [list(r.turn_rewards) for r in rows]
  versions = [np.asarray(r.versions, np.int32) for r in rows]
  return RolloutBatch(
    prompt_ids=prompts,
    response_ids=[list(r.ids) for r in rows],
    behav_logp=[np.asarray(r.logp, np.float32) for r in rows],
    finish_reason=[r.finish for r in rows],
    n=n,
    timing=timing,
    action_mask=[np.asarray(r.mask, bool) for r in rows],
    turn_rewards=turn_rewards if any(turn_rewards) else None,
    policy_version=versions if stamped else None,
  )


def rollout_multiturn(
  engine: RolloutEngine,
  examples: Sequence[Example],
  make_env: Callable[[], Environment],
  tokenizer: Tokenizer,
  sampling: SamplingConfig,
  config: MultiTurnConfig = MultiTurnConfig(),
  *,
  render_prompt: Callable[[str], Sequence[int]] | None = None,
  kv_reuse: bool = False,
  between_turns: Callable[[], int] | None = None,
) -> MultiTurnRollout:
  """Runs ``sampling.n`` episodes per example (see the module doc).

  Args:
    engine: a rollout engine (``JaxSampler``, ``VLLMSidecar``, pool).
    examples: P problems.
    make_env: a fresh environment per episode (they hold state).
    tokenizer: encodes observations, decodes turns, lists stop tokens.
    sampling: ``n`` episodes per example; ``max_new_tokens`` per model turn;
      ``stop_token_ids`` the EOS id(s); temperature etc. as usual.
    config: the driver's limits.
    render_prompt: the first observation (``env.reset``'s text) to prompt
      ids, e.g. through a chat template; default ``tokenizer.encode`` of the
      text as is.
    kv_reuse: run the episodes in one run of an engine that keeps each
      row's KV across turns and runs tools off the decode batch
      (`JaxSampler` with batching="continuous", `multiturn_kv`); False:
      one engine call per turn (any engine).
    between_turns: called before every engine call (the caller may load
      newer weights into the engine there); returns the version of the
      weights the engine now holds, which stamps the ids that call samples
      (``batch.policy_version``; an observation's ids carry the version of
      the turn they answer). None: no call, no versions. Not with
      `kv_reuse` (its one run takes no weights between turns).

  Returns:
    a ``MultiTurnRollout``.
  """
  _check_args(engine, examples, sampling, config)
  if kv_reuse and between_turns is not None:
    raise ValueError(
      "rollout_multiturn: kv_reuse=True with between_turns; expected one of "
      "them (a kept-KV run takes no new weights between turns)"
    )
  n, budget, turn_cap = (
    sampling.n,
    config.max_response_tokens,
    sampling.max_new_tokens,
  )
  encode = render_prompt or (
    lambda text: tokenizer.encode(text, add_special_tokens=False)
  )
  rows: list[Row] = []
  prompts: list[list[int]] = []
  for example in examples:
    for j in range(n):
      env = make_env()
      ids = [int(t) for t in encode(env.reset(example))]
      if j == 0:
        prompts.append(ids)
      elif ids != prompts[-1]:
        raise ValueError(
          "rollout_multiturn: make_env() gave environments whose first "
          f"observations of example {example.uid!r} differ; expected one "
          "prompt per example"
        )
      rows.append(Row(env, ids, info=dict(EMPTY_INFO)))
  if kv_reuse:
    multiturn_kv.check_engine(engine)
  else:  # the KV path never passes a row's history as a prompt
    _check_capacity(engine, prompts, budget)
  stop_sequences = tuple(rows[0].env.stop_sequences)
  eos = set(sampling.stop_token_ids)
  matcher = stop_matcher(tokenizer, stop_sequences) if stop_sequences else None
  stop_ids = tuple(sorted(eos))
  if matcher is not None and config.stop_by == "token":
    stop_ids = tuple(sorted(eos | set(matcher.completing_ids())))
  chunk = config.string_stop_chunk if config.stop_by == "string" else 0

  turns = Turns(
    tokenizer, matcher, eos, turn_cap, budget, chunk,
    {"skip_special_tokens": config.skip_special_tokens},
  )  # fmt: skip
  start = time.perf_counter()
  calls = 0
  if kv_reuse:
    calls = 1  # one run: rows re-enter it with their observations
    stats = multiturn_kv.drive(
      engine, prompts, rows, turns,
      dataclasses.replace(sampling, stop_token_ids=stop_ids), config,
    )  # fmt: skip
  per_row = _takes_row_limits(engine)
  while not kv_reuse:
    active = [r for r in rows if not r.done]
    if not active:
      break
    rooms = [turns.room(r) for r in active]
    version = between_turns() if between_turns is not None else 0
    call_sampling = dataclasses.replace(
      sampling,
      stop_token_ids=stop_ids,
      seed=(sampling.seed + _SEED_STRIDE * calls) % _SEED_RANGE,
    )
    if calls == 0:  # every row at its prompt: the n samples share its KV
      out = engine.generate(
        prompts, dataclasses.replace(call_sampling, max_new_tokens=rooms[0])
      )
      outputs = list(zip(out.response_ids, out.behav_logp))
    else:
      outputs = _generate_rows(
        engine, [r.prompt + r.ids for r in active], rooms,
        dataclasses.replace(call_sampling, n=1), per_row,
      )  # fmt: skip
    calls += 1
    for row, room, (ids, logp) in zip(active, rooms, outputs):
      turn = turns.take(row, room, ids, logp, version)
      if turn is not None:
        step(row, turn[0], tokenizer, budget, final=turn[1])
  seconds = time.perf_counter() - start

  infos = [r.info for r in rows]
  metrics = summarize(infos)
  model = np.array([sum(r.mask) for r in rows], np.float64)
  total = np.array([len(r.ids) for r in rows], np.float64)
  metrics.update(
    engine_calls=float(calls),
    continuations=float(turns.continuations),
    dropped_after_stop_mean=float(turns.dropped) / len(rows),
    model_tokens_mean=float(model.mean()),
    observation_tokens_mean=float((total - model).mean()),
    truncated_rate=float(np.mean([r.finish == "length" for r in rows])),
    reward_mean=float(np.mean([r.reward for r in rows])),
  )
  if kv_reuse:
    metrics.update({f"{ENGINE_METRICS}{k}": float(x) for k, x in stats.items()})
  timing = {
    "seconds": seconds,
    "tokens": float(model.sum()),
    "tokens_per_s": float(model.sum()) / seconds if seconds > 0 else 0.0,
    "engine_calls": float(calls),
  }
  return MultiTurnRollout(
    batch=_batch(prompts, rows, n, timing, stamped=between_turns is not None),
    rewards=np.array([r.reward for r in rows], np.float32),
    infos=infos,
    metrics=metrics,
  )


def _takes_row_limits(engine: Any) -> bool:
  """The engine's generate takes `max_new_tokens_per_sample`."""
  try:
    params = inspect.signature(engine.generate).parameters
  except (TypeError, ValueError):
    return False
  return "max_new_tokens_per_sample" in params


def _generate_rows(engine, prompts, limits, sampling, per_row) -> list:
  """(ids, log-probs) of one sample of each prompt, prompt i limited to
  `limits[i]` ids: in one call where the engine takes per-sample limits,
  else one call per distinct limit (each with its own seed)."""
  if per_row:
    out = engine.generate(
      prompts,
      dataclasses.replace(sampling, max_new_tokens=max(limits)),
      max_new_tokens_per_sample=list(limits),
    )
    return list(zip(out.response_ids, out.behav_logp))
  outputs: list[Any] = [None] * len(prompts)
  for k, limit in enumerate(sorted(set(limits))):
    which = [i for i, x in enumerate(limits) if x == limit]
    out = engine.generate(
      [prompts[i] for i in which],
      dataclasses.replace(
        sampling,
        max_new_tokens=limit,
        seed=(sampling.seed + k) % _SEED_RANGE,
      ),
    )
    for i, ids, logp in zip(which, out.response_ids, out.behav_logp):
      outputs[i] = (ids, logp)
  return outputs
