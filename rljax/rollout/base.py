"""The one rollout interface: sampling settings, the batch a rollout returns,
and the protocol every engine (JAX sampler, vLLM sidecar) implements.

Nothing here runs JAX or a model: an engine turns prompt token ids
into response token ids plus the log-probability of every response token
under the distribution the engine actually sampled from (`behav_logp`, the
behavior policy π_behav of QuRL §4.1), and the trainer packs that into
padded arrays with `RolloutBatch.pack`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from rljax.core import _validation as v
from rljax.rollout import trajectories
from rljax.rollout import versions

FINISH_REASONS = ("stop", "length")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to sample responses.

  Attributes:
    n: samples per prompt (the GRPO group size), >= 1.
    temperature: logits are divided by it; 0 means greedy. Must be >= 0.
    top_p: nucleus sampling: keep the smallest set of most likely tokens whose
      probability mass reaches `top_p`; 1.0 turns it off. In (0, 1].
    top_k: keep the `top_k` most likely tokens; 0 turns it off. >= 0.
    greedy: take the argmax token (same as temperature 0).
    max_new_tokens: at most this many response tokens per sample, >= 1.
    stop_token_ids: a sampled token in this tuple ends its sample; the stop
      token is kept as the last response token (the policy must learn to emit
      it) and the sample's finish reason is "stop".
    seed: base of the per-sample PRNG keys; an engine derives sample j of
      prompt i from (seed, i, j), so the same seed gives the same samples.

  `behav_logp` semantics (what engines must return per response token):
    * sampling: log π(o_t) where π = softmax(logits / temperature) restricted
      to the top-k / top-p set and renormalized over it, i.e. the
      distribution actually sampled from. With the RL defaults top_p=1.0,
      top_k=0 this is exactly log_softmax(logits / temperature), which is what
      `rljax.models.token_logprobs(..., temperature=T)` recomputes.
    * greedy: log_softmax(logits) (temperature 1) of the argmax token; the
      point mass actually sampled from would give 0 everywhere, which carries
      no information.
  """

  n: int = 1
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  greedy: bool = False
  max_new_tokens: int = 256
  stop_token_ids: tuple[int, ...] = ()
  seed: int = 0

  def __post_init__(self):
    for name, rule, error in _SAMPLING_RULES:
      v.check_field("SamplingConfig", name, getattr(self, name), rule, error)
    if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(
      self.stop_token_ids, Sequence
    ):
      raise TypeError(
        v.field_message(
          "SamplingConfig.stop_token_ids",
          self.stop_token_ids,
          "a tuple of ints",
        )
      )
    for tok in self.stop_token_ids:
      if (
        isinstance(tok, bool)
        or not isinstance(tok, (int, np.integer))
        or (tok < 0)
      ):
        raise ValueError(
          f"SamplingConfig.stop_token_ids contains {tok!r}; expected "
          "non-negative ints"
        )
    # Normalize so that configs hash and compare by value (jit static args).
    object.__setattr__(
      self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids)
    )

  @property
  def is_greedy(self) -> bool:
    """True when tokens are argmaxes (greedy flag or temperature 0)."""
    return bool(self.greedy) or self.temperature == 0.0


# (field, rule, error) in check order: the type first, then the range.
_SAMPLING_RULES = (
  ("n", v.is_int, TypeError),
  ("n", v.at_least(1), ValueError),
  ("temperature", v.is_real, TypeError),
  (
    "temperature",
    v.expect(
      v.in_range(0.0, np.inf, hi_open=True),
      "a finite value >= 0 (0 means greedy)",
    ),
    ValueError,
  ),
  ("top_p", v.is_real, TypeError),
  (
    "top_p",
    v.expect(
      v.in_range(0.0, 1.0, lo_open=True),
      "0 < top_p <= 1 (1.0 turns nucleus sampling off)",
    ),
    ValueError,
  ),
  ("top_k", v.is_int, TypeError),
  ("top_k", v.at_least(0, "0 turns top-k off"), ValueError),
  ("greedy", v.is_bool, TypeError),
  ("max_new_tokens", v.is_int, TypeError),
  ("max_new_tokens", v.at_least(1), ValueError),
  ("seed", v.is_int, TypeError),
)


class EngineFailure(RuntimeError):
  """An engine died or hung in a way `restart()` repairs (vLLM sidecars)."""


@dataclasses.dataclass(frozen=True)
class SyncStats:
  """Cost of one weight sync into a rollout engine.

  Attributes:
    seconds: wall time of the sync (quantize + transfer + reload).
    bytes: size of the weights as the engine holds them after the sync.
  """

  seconds: float
  bytes: int


def _check_token_list(name: str, index: int, ids: Any) -> list[int]:
  if isinstance(ids, (str, bytes)) or not isinstance(
    ids, (Sequence, np.ndarray)
  ):
    raise TypeError(
      v.field_message(f"{name}[{index}]", ids, "a list of int token ids")
    )
  return [int(t) for t in ids]


@dataclasses.dataclass
class RolloutBatch:
  """What a rollout engine returns for P prompts and n samples each.

  Responses are grouped by prompt: sample j of prompt i is row i * n + j.

  Attributes:
    prompt_ids: P prompts, each a list of token ids.
    response_ids: P * n responses, each a list of token ids (a stop token, if
      one ended the sample, is its last id).
    behav_logp: P * n float32 arrays, one log-prob per response token, see
      `SamplingConfig` for the exact distribution.
    finish_reason: P * n strings, "stop" (a stop token was sampled) or
      "length" (max_new_tokens reached).
    n: samples per prompt.
    timing: engine measurements, at least "seconds", "tokens" (generated
      response tokens) and "tokens_per_s".
    action_mask: multi-turn trajectories only: P * n bool arrays, one per
      response, True on the tokens the policy sampled (model tokens) and
      False on the tokens an environment inserted (tool observations). A
      trajectory is one response row, its turns concatenated token-in /
      token-out: model turn, observation, model turn, ... The loss, KL,
      entropy, corrections, advantages and token counts read model tokens
      only (`rljax.train.build_batch`); observation tokens are context.
      Their `behav_logp` carries no meaning (engines store 0.0). None: every
      response token is a model token (single-turn rollouts).
    turn_rewards: per-turn rewards of trajectories: P * n lists of
      (token_index, reward) pairs, each at the last model token of the turn
      it rewards (an index into that row's response; it must be a model
      token). They come on top of the row's outcome reward: GAE and
      REINFORCE++ credit them at their token, the sequence-level estimators
      (GRPO, RLOO, ...) add them to the trajectory's return. None: no
      per-turn rewards.
    policy_version: P * n int32 arrays, one per response token: the version
      of the weights that sampled it, the trainer step whose update made
      them (0 = the initial weights; `rljax.train.actor.Actor` stamps it).
      Per token, not per row: an engine whose weights change
      mid-generation (in-flight updates, `rljax.rollout.inflight`) mixes
      versions inside a response, and the loss needs nothing more than
      each token's own behaviour log-prob for that (`rljax.train.staleness`
      reports the lag). None: unknown (a legacy
      rollout, an engine driven outside the trainer).
  """

  prompt_ids: list[list[int]]
  response_ids: list[list[int]]
  behav_logp: list[np.ndarray]
  finish_reason: list[str]
  n: int = 1
  timing: dict[str, float] = dataclasses.field(default_factory=dict)
  action_mask: list[np.ndarray] | None = None
  turn_rewards: list[list[tuple[int, float]]] | None = None
  policy_version: list[np.ndarray] | None = None

  def __post_init__(self):
    v.check_field(
      "RolloutBatch", "n", self.n, v.all_of(v.is_int, v.at_least(1))
    )
    num_rows = len(self.prompt_ids) * self.n
    for name in ("response_ids", "behav_logp", "finish_reason"):
      got = len(getattr(self, name))
      if got != num_rows:
        raise ValueError(
          f"RolloutBatch.{name} has {got} entries; expected len(prompt_ids) "
          f"* n = {len(self.prompt_ids)} * {self.n} = {num_rows}"
        )
    for row, (ids, logp) in enumerate(zip(self.response_ids, self.behav_logp)):
      if len(ids) != len(np.asarray(logp)):
        raise ValueError(
          f"RolloutBatch row {row}: {len(ids)} response tokens but "
          f"{len(np.asarray(logp))} behav_logp values; expected equal"
        )
    for row, reason in enumerate(self.finish_reason):
      if reason not in FINISH_REASONS:
        raise ValueError(
          v.field_message(
            f"RolloutBatch.finish_reason[{row}]",
            reason,
            f"one of {FINISH_REASONS}",
          )
        )
    if self.action_mask is not None:
      self.action_mask = trajectories.check_action_mask(
        self.action_mask, self.response_ids
      )
    if self.turn_rewards is not None:
      self.turn_rewards = trajectories.check_turn_rewards(
        self.turn_rewards, self.response_ids, self.action_mask
      )
    if self.policy_version is not None:
      self.policy_version = versions.check_policy_version(
        self.policy_version, self.response_ids
      )

  @property
  def num_prompts(self) -> int:
    return len(self.prompt_ids)

  @property
  def num_samples(self) -> int:
    """Number of responses, P * n."""
    return len(self.response_ids)

  @property
  def group_ids(self) -> np.ndarray:
    """int32 [P * n]: the prompt index of every response."""
    return np.repeat(np.arange(self.num_prompts, dtype=np.int32), self.n)

  @property
  def response_lengths(self) -> np.ndarray:
    return np.array([len(r) for r in self.response_ids], dtype=np.int32)

  def select_groups(self, groups) -> "RolloutBatch":
    """The batch of the chosen prompts' groups, in the order given.

    Args:
      groups: prompt indices (ints, repeats allowed) or a bool mask of
        length num_prompts. Engine timing is not carried over.
    """
    groups = np.asarray(groups)
    if groups.dtype == bool:
      if groups.shape != (self.num_prompts,):
        raise ValueError(
          f"select_groups mask has shape {groups.shape}; expected "
          f"({self.num_prompts},), one entry per prompt"
        )
      groups = np.flatnonzero(groups)
    groups = groups.astype(np.int64).reshape(-1)
    if groups.size and (groups.min() < 0 or groups.max() >= self.num_prompts):
      raise ValueError(
        f"select_groups indices {groups.tolist()}; expected each in "
        f"[0, {self.num_prompts})"
      )
    rows = [int(g) * self.n + j for g in groups for j in range(self.n)]
    pick = lambda rows_of: (
      None if rows_of is None else [rows_of[r] for r in rows]
    )
    return RolloutBatch(
      prompt_ids=[self.prompt_ids[g] for g in groups],
      response_ids=[self.response_ids[r] for r in rows],
      behav_logp=[self.behav_logp[r] for r in rows],
      finish_reason=[self.finish_reason[r] for r in rows],
      n=self.n,
      action_mask=pick(self.action_mask),
      turn_rewards=pick(self.turn_rewards),
      policy_version=pick(self.policy_version),
    )

  @classmethod
  def concat(cls, batches: list["RolloutBatch"]) -> "RolloutBatch":
    """The groups of several batches (equal n) one after the other."""
    ns = {b.n for b in batches}
    if len(ns) != 1:
      raise ValueError(
        f"concat of RolloutBatches with n={sorted(ns)}; expected one n"
      )
    # A batch without the multi-turn fields joins one with them as what
    # None means: every token a model token, no per-turn reward.
    action_mask = turn_rewards = None
    if any(b.action_mask is not None for b in batches):
      action_mask = [
        m
        for b in batches
        for m in (
          b.action_mask
          if b.action_mask is not None
          else [np.ones(len(r), bool) for r in b.response_ids]
        )
      ]
    if any(b.turn_rewards is not None for b in batches):
      turn_rewards = [
        t
        for b in batches
        for t in (
          b.turn_rewards
          if b.turn_rewards is not None
          else [[] for _ in b.response_ids]
        )
      ]
    # Versions only when every batch has them: a token of unknown version
    # would otherwise be reported with a lag it may not have.
    policy_version = None
    if all(b.policy_version is not None for b in batches):
      policy_version = [v for b in batches for v in b.policy_version]
    return cls(
      prompt_ids=[p for b in batches for p in b.prompt_ids],
      response_ids=[r for b in batches for r in b.response_ids],
      behav_logp=[l for b in batches for l in b.behav_logp],
      finish_reason=[f for b in batches for f in b.finish_reason],
      n=ns.pop(),
      action_mask=action_mask,
      turn_rewards=turn_rewards,
      policy_version=policy_version,
    )

  def with_policy_version(self, version: int) -> "RolloutBatch":
    """This batch with every response token stamped `version` (one engine
    call, one set of weights); timing is kept."""
    return dataclasses.replace(
      self,
      policy_version=[
        np.full(len(r), version, np.int32) for r in self.response_ids
      ],
    )

  def pack(
    self,
    pad_id: int = 0,
    prompt_len: int | None = None,
    response_len: int | None = None,
  ) -> dict[str, np.ndarray]:
    """Pads the batch into arrays the trainer can jit over.

    Row b = i * n + j holds prompt i LEFT-padded to `prompt_len` followed by
    response b RIGHT-padded to `response_len`, so every response starts at
    column `prompt_len`. Per-token log-prob arrays follow the convention of
    `rljax.models.token_logprobs`: `logp[:, t]` is the log-prob of
    `tokens[:, t + 1]`, hence they have L - 1 columns.

    Args:
      pad_id: token id written in padding positions.
      prompt_len: width of the prompt part; default the longest prompt. Pass
        a fixed value to keep shapes (and compiles) stable across steps.
      response_len: width of the response part; default the longest response.

    Returns:
      dict of numpy arrays, with B = P * n and L = prompt_len + response_len:
        tokens          int32   [B, L]
        attention_mask  int32   [B, L]   1 on real prompt and response tokens
        positions       int32   [B, L]   position ids (0 at the first real
                                         token, clipped at 0 on padding)
        response_mask   float32 [B, L-1] 1 where tokens[:, t+1] is a response
                                         token (aligned with logp)
        behav_logp      float32 [B, L-1] behavior log-prob of tokens[:, t+1]
                                         (0 outside response_mask)
        prompt_lengths  int32   [B]
        response_lengths int32  [B]
        group_ids       int32   [B]      prompt index of each row
        truncated       bool    [B]      finish_reason == "length"
      and, only when the batch has them (so single-turn batches pack as
      before):
        action_mask     float32 [B, L-1] 1 where tokens[:, t+1] is a model
                                         token (aligned with logp)
        turn_rewards    float32 [B, L-1] the per-turn rewards at their
                                         tokens' logp columns, 0 elsewhere
    """
    prompt_lengths = np.array([len(p) for p in self.prompt_ids], np.int32)
    response_lengths = self.response_lengths
    max_prompt = int(prompt_lengths.max(initial=0))
    max_response = int(response_lengths.max(initial=0))
    if prompt_len is None:
      prompt_len = max_prompt
    elif prompt_len < max_prompt:
      raise ValueError(
        f"pack(prompt_len={prompt_len}) is shorter than the longest prompt "
        f"({max_prompt} tokens); expected prompt_len >= {max_prompt}"
      )
    if response_len is None:
      response_len = max_response
    elif response_len < max_response:
      raise ValueError(
        f"pack(response_len={response_len}) is shorter than the longest "
        f"response ({max_response} tokens); expected response_len >= "
        f"{max_response}"
      )
    total = prompt_len + response_len
    if total < 2:
      raise ValueError(
        f"pack: prompt_len + response_len = {total}; expected >= 2 so that "
        "at least one next-token log-prob exists"
      )
    num_rows = self.num_samples
    tokens = np.full((num_rows, total), pad_id, np.int32)
    attention_mask = np.zeros((num_rows, total), np.int32)
    response_mask = np.zeros((num_rows, total - 1), np.float32)
    behav_logp = np.zeros((num_rows, total - 1), np.float32)
    for row in range(num_rows):
      prompt = self.prompt_ids[row // self.n]
      response = self.response_ids[row]
      start = prompt_len - len(prompt)
      tokens[row, start:prompt_len] = prompt
      tokens[row, prompt_len : prompt_len + len(response)] = response
      attention_mask[row, start : prompt_len + len(response)] = 1
      # logp column t scores token t + 1: responses start at prompt_len - 1.
      response_mask[row, prompt_len - 1 : prompt_len - 1 + len(response)] = 1.0
      behav_logp[row, prompt_len - 1 : prompt_len - 1 + len(response)] = (
        np.asarray(self.behav_logp[row], np.float32)
      )
    positions = np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0).astype(
      np.int32
    )
    extra = {}
    if self.action_mask is not None:
      extra["action_mask"] = np.zeros((num_rows, total - 1), np.float32)
      for row, m in enumerate(self.action_mask):
        extra["action_mask"][row, prompt_len - 1 : prompt_len - 1 + len(m)] = m
    if self.turn_rewards is not None:
      extra["turn_rewards"] = np.zeros((num_rows, total - 1), np.float32)
      for row, pairs in enumerate(self.turn_rewards):
        for index, reward in pairs:  # += : two rewards on one token add up
          extra["turn_rewards"][row, prompt_len - 1 + index] += reward
    return {
      "tokens": tokens,
      "attention_mask": attention_mask,
      "positions": positions,
      "response_mask": response_mask,
      "behav_logp": behav_logp,
      "prompt_lengths": np.repeat(prompt_lengths, self.n),
      "response_lengths": response_lengths,
      "group_ids": self.group_ids,
      "truncated": np.array(
        [r == "length" for r in self.finish_reason], dtype=bool
      ),
      **extra,
    }


def check_prompts(
  prompt_ids: Any, vocab_size: int | None = None
) -> list[list[int]]:
  """Validates prompt token ids; returns them as lists of Python ints."""
  if isinstance(prompt_ids, np.ndarray) and prompt_ids.ndim == 2:
    prompt_ids = prompt_ids.tolist()
  if isinstance(prompt_ids, (str, bytes)) or not isinstance(
    prompt_ids, Sequence
  ):
    raise TypeError(
      f"prompt_ids={prompt_ids!r:.80}; expected a list of lists of int "
      "token ids"
    )
  if not prompt_ids:
    raise ValueError("prompt_ids is empty; expected at least one prompt")
  prompts = [
    _check_token_list("prompt_ids", i, p) for i, p in enumerate(prompt_ids)
  ]
  for i, prompt in enumerate(prompts):
    if not prompt:
      raise ValueError(f"prompt_ids[{i}] is empty; expected >= 1 token")
    bad = [
      t for t in prompt if t < 0 or (vocab_size is not None and t >= vocab_size)
    ]
    if bad:
      raise ValueError(
        f"prompt_ids[{i}] has token id {bad[0]}; expected ids in "
        f"[0, {vocab_size if vocab_size is not None else 'vocab_size'})"
      )
  return prompts


@runtime_checkable
class RolloutEngine(Protocol):
  """A rollout engine: the JAX sampler or a vLLM sidecar."""

  def generate(
    self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
  ) -> RolloutBatch:
    """Samples `sampling.n` responses for each prompt."""
    ...

  def update_weights(self, params: Any) -> SyncStats:
    """Loads prepared rollout weights (`quant.prepare_rollout_weights`) as
    given: the engine converts nothing but the layout."""
    ...

  def close(self) -> None:
    """Releases the engine's resources (processes, device memory)."""
    ...
