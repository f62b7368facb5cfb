"""A Bradley–Terry reward model: a scalar head on the decoder, trained on
preference pairs, and its use as a batched reward.

Bradley & Terry (1952) model the probability that a response y_c is preferred
to y_r for a prompt x as

    P(y_c ≻ y_r | x) = σ(r(x, y_c) − r(x, y_r)),

and the reward model r is fit by maximum likelihood on (x, chosen, rejected)
pairs (Ouyang et al. 2022, "Training language models to follow instructions
with human feedback", eq. 1):

    L = −E log σ(r(x, y_c) − r(x, y_r)).

r(x, y) is the critic's value head (`rljax.models.value`) read at the last
real token of prompt + response: the same machinery as PPO's critic, so a
trained reward model can also initialise one. The loss only sees score
differences, so the head's bias is frozen at 0.

Files: preference pairs are JSONL rows `{"prompt": str, "chosen": str,
"rejected": str}` (`load_preference_pairs`). `save_reward_model` writes an
orbax checkpoint and an HF `LlamaForSequenceClassification`-style export
(`score.weight`, `num_labels=1`, last-non-pad-token pooling) that
transformers loads; `load_reward_model` reads it back.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Iterable, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rljax import models
from rljax.rewards import batched
from rljax.rewards.pool import RewardBatch, RewardInput

__all__ = [
    "PreferenceDataError", "PreferencePair", "RewardModel", "RewardModelReward",
    "bradley_terry_loss", "encode_pairs", "encode_texts", "evaluate_pairs",
    "init_reward_model", "last_token_index", "load_preference_pairs",
    "load_reward_model", "make_train_step", "pair_accuracy",
    "save_reward_model", "sequence_rewards", "write_preference_pairs",
]

FORMAT = "rljax-bradley-terry-reward-model"
PAIR_FIELDS = ("prompt", "chosen", "rejected")


# ------------------------------------------------------------------ kernels
def bradley_terry_loss(r_chosen: chex.Array, r_rejected: chex.Array
                       ) -> chex.Array:
  """Mean negative log-likelihood of the preferences, −log σ(r_c − r_r).

  Computed as softplus(r_r − r_c), which is exact and does not overflow for
  large margins. Bradley & Terry 1952; Ouyang et al. 2022, eq. 1.

  Args:
    r_chosen: [B] rewards of the preferred responses.
    r_rejected: [B] rewards of the other responses.

  Returns:
    Scalar float32 loss.
  """
  chex.assert_rank([r_chosen, r_rejected], 1)
  chex.assert_equal_shape([r_chosen, r_rejected])
  margin = r_chosen.astype(jnp.float32) - r_rejected.astype(jnp.float32)
  return jnp.mean(jax.nn.softplus(-margin))


def pair_accuracy(r_chosen: chex.Array, r_rejected: chex.Array) -> chex.Array:
  """Fraction of pairs ranked right: mean 1[r_c > r_r], a tie counting ½
  (an untrained model with equal scores is at chance, 0.5, not 0)."""
  chex.assert_rank([r_chosen, r_rejected], 1)
  chex.assert_equal_shape([r_chosen, r_rejected])
  wins = (r_chosen > r_rejected).astype(jnp.float32)
  ties = (r_chosen == r_rejected).astype(jnp.float32)
  return jnp.mean(wins + 0.5 * ties)


def last_token_index(attention_mask: chex.Array) -> chex.Array:
  """[B] index of each row's last real token (left or right padding)."""
  chex.assert_rank(attention_mask, 2)
  t = attention_mask.shape[1]
  return t - 1 - jnp.argmax(attention_mask[:, ::-1] > 0, axis=1)


def sequence_rewards(config: models.ModelConfig, params: dict[str, Any],
                     tokens: chex.Array, attention_mask: chex.Array
                     ) -> chex.Array:
  """r(x, y) [B] float32: the value head at each row's last real token.

  Args:
    config: the backbone's architecture.
    params: {"backbone": decoder params, "head": value head}.
    tokens: int [B, T], prompt then response, padded.
    attention_mask: [B, T], 1 = real token.
  """
  chex.assert_rank([tokens, attention_mask], 2)
  chex.assert_equal_shape([tokens, attention_mask])
  values = models.value_forward(config, params["backbone"], params["head"],
                                tokens, attention_mask)
  last = last_token_index(attention_mask)
  return jnp.take_along_axis(values, last[:, None], axis=1)[:, 0]


def init_reward_model(config: models.ModelConfig, backbone_params,
                      rng: jax.Array, init_scale: float = 0.0
                      ) -> dict[str, Any]:
  """{"backbone": copy of `backbone_params`, "head": value head}.

  The critic's initialisation (`models.init_critic`): a zero head scores
  every response 0, so training starts at chance (accuracy 0.5, loss log 2).
  """
  return models.init_critic(config, backbone_params, rng, init_scale)


# ------------------------------------------------------------------ data
@dataclasses.dataclass(frozen=True)
class PreferencePair:
  prompt: str
  chosen: str
  rejected: str


class PreferenceDataError(ValueError):
  """A preference file row that is not a valid pair; names file:line."""


def load_preference_pairs(path: str | os.PathLike) -> list[PreferencePair]:
  """Reads JSONL rows {"prompt", "chosen", "rejected"} (strings; chosen and
  rejected non-empty and different). Blank lines are skipped; other keys are
  ignored.

  Raises:
    FileNotFoundError: no such file.
    PreferenceDataError: "<path>:<line>: ..." naming the field and the value.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"preference pairs file {path!r} does not exist")
  pairs = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f"{path}:{lineno}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise PreferenceDataError(f"{where}: not valid JSON ({e.msg} at "
                                  f"column {e.colno})") from None
      if not isinstance(row, dict):
        raise PreferenceDataError(f"{where}: a {type(row).__name__}; expected "
                                  f"an object with fields {PAIR_FIELDS}")
      for field in PAIR_FIELDS:
        if field not in row:
          raise PreferenceDataError(f"{where}: field {field!r} is missing "
                                    f"(has {sorted(row)})")
        value = row[field]
        if not isinstance(value, str):
          raise PreferenceDataError(
              f"{where}: field {field!r} is {type(value).__name__} "
              f"{value!r:.60}; expected a string")
        if field != "prompt" and not value:
          raise PreferenceDataError(f"{where}: field {field!r} is empty")
      if row["chosen"] == row["rejected"]:
        raise PreferenceDataError(f"{where}: fields 'chosen' and 'rejected' "
                                  "are the same text; a pair needs two "
                                  "different responses")
      pairs.append(PreferencePair(row["prompt"], row["chosen"],
                                  row["rejected"]))
  if not pairs:
    raise PreferenceDataError(f"{path}: no preference pairs in the file")
  return pairs


def write_preference_pairs(path: str | os.PathLike,
                           pairs: Iterable[PreferencePair]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for p in pairs:
      f.write(json.dumps(dataclasses.asdict(p)) + "\n")


def _bucket(n: int, minimum: int = 16) -> int:
  """Next power of two >= n: few distinct shapes, few compilations."""
  size = minimum
  while size < n:
    size *= 2
  return size


def encode_texts(tokenizer, prompts: Sequence[str], responses: Sequence[str],
                 max_len: int, pad_id: int, rows: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded (tokens, attention_mask) int32 [rows, T] of prompt +
  response, tokenized separately as the policy produced them.

  A sequence over `max_len` loses tokens from its start: the reward is read
  at the last token, which must stay. T is a power of two (few compiles);
  `rows` pads the batch with empty rows (mask 0 but for token 0).
  """
  if len(prompts) != len(responses):
    raise ValueError(f"encode_texts: {len(prompts)} prompts, "
                     f"{len(responses)} responses")
  seqs = []
  for prompt, response in zip(prompts, responses):
    ids = (tokenizer.encode(prompt, add_special_tokens=False)
           + tokenizer.encode(response, add_special_tokens=False))
    seqs.append(ids[-max_len:] or [pad_id])
  return _pack(seqs, pad_id, rows)


def _pack(seqs: Sequence[Sequence[int]], pad_id: int, rows: int | None
          ) -> tuple[np.ndarray, np.ndarray]:
  rows = len(seqs) if rows is None else rows
  t = _bucket(max((len(s) for s in seqs), default=1))
  tokens = np.full((rows, t), pad_id, np.int32)
  mask = np.zeros((rows, t), np.int32)
  mask[:, 0] = 1  # padding rows: one real token, so the last index exists
  for i, s in enumerate(seqs):
    tokens[i, :len(s)] = s
    mask[i, :len(s)] = 1
  return tokens, mask


def encode_pairs(tokenizer, pairs: Sequence[PreferencePair], max_len: int,
                 pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """[2B, T] tokens and mask: the B chosen rows, then the B rejected rows."""
  prompts = [p.prompt for p in pairs] * 2
  responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
  return encode_texts(tokenizer, prompts, responses, max_len, pad_id)


# ------------------------------------------------------------------ training
def _pair_metrics(config, params, tokens, mask):
  # The loss only sees differences, so the bias's true gradient is 0; its
  # float round-off would still be scaled up to full-size steps by Adam. The
  # bias stays frozen (at 0), which the HF export (no bias) relies on.
  head = dict(params["head"], bias=jax.lax.stop_gradient(params["head"]["bias"]))
  r = sequence_rewards(config, dict(params, head=head), tokens, mask)
  r_c, r_r = jnp.split(r, 2)
  return bradley_terry_loss(r_c, r_r), {
      "accuracy": pair_accuracy(r_c, r_r), "margin": jnp.mean(r_c - r_r)}


def make_train_step(config: models.ModelConfig, optimizer):
  """jit(step)(params, opt_state, tokens, mask) -> (params, opt_state,
  {"loss", "accuracy", "margin"}) on one batch from `encode_pairs`."""

  @jax.jit
  def step(params, opt_state, tokens, mask):
    def loss_fn(p):
      return _pair_metrics(config, p, tokens, mask)
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {"loss": loss, **aux}

  return step


@functools.partial(jax.jit, static_argnums=(0,))
def _eval_batch(config, params, tokens, mask):
  return _pair_metrics(config, params, tokens, mask)


def evaluate_pairs(config: models.ModelConfig, params, tokenizer,
                   pairs: Sequence[PreferencePair], max_len: int, pad_id: int,
                   batch_size: int = 32) -> dict[str, float]:
  """Held-out {"loss", "accuracy", "margin"}, averaged over pairs."""
  if not pairs:
    raise ValueError("evaluate_pairs: no pairs")
  totals = {"loss": 0.0, "accuracy": 0.0, "margin": 0.0}
  for sl in batched.chunks(len(pairs), batch_size):
    part = pairs[sl]
    tokens, mask = encode_pairs(tokenizer, part, max_len, pad_id)
    loss, aux = _eval_batch(config, params, jnp.asarray(tokens),
                            jnp.asarray(mask))
    for key, value in (("loss", loss), *aux.items()):
      totals[key] += float(value) * len(part)
  return {k: v / len(pairs) for k, v in totals.items()}


# ------------------------------------------------------------------ files
@dataclasses.dataclass(frozen=True)
class RewardModel:
  config: models.ModelConfig
  params: dict[str, Any]
  tokenizer: Any = None
  max_len: int = 512


def save_reward_model(out_dir: str | os.PathLike, config: models.ModelConfig,
                      params: dict[str, Any], tokenizer=None,
                      max_len: int = 512,
                      metrics: dict[str, float] | None = None) -> str:
  """Writes out_dir/{reward_model.json, orbax/, hf/}.

  orbax/ holds the params tree as trained (float32); hf/ is a
  `LlamaForSequenceClassification`-style checkpoint: the backbone's
  `model.*` tensors, `score.weight` [1, D] (the head's kernel), `num_labels`
  1 and the pad token that HF's last-non-pad-token pooling needs; it has
  no bias (0 after `make_train_step`; recorded as head_bias in
  reward_model.json).
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  out_dir = os.path.abspath(os.fspath(out_dir))
  os.makedirs(out_dir, exist_ok=True)
  bias = float(np.asarray(params["head"]["bias"])[0])
  orbax_dir = os.path.join(out_dir, "orbax")
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(orbax_dir, jax.device_get(params), force=True)
  checkpointer.wait_until_finished()
  hf_dir = os.path.join(out_dir, "hf")
  os.makedirs(hf_dir, exist_ok=True)
  state = models.to_hf_state_dict(config, params["backbone"])
  state.pop("lm_head.weight", None)  # a classifier has no LM head
  kernel = np.asarray(params["head"]["kernel"], np.float32)
  state["score.weight"] = np.ascontiguousarray(kernel.T)
  state = {k: np.ascontiguousarray(np.asarray(v, np.float32))
           for k, v in state.items()}
  safetensors.numpy.save_file(state, os.path.join(hf_dir, "model.safetensors"),
                              metadata={"format": "pt"})
  hf_config = config.to_hf()
  arch = hf_config["architectures"][0].replace("ForCausalLM",
                                               "ForSequenceClassification")
  pad = config.pad_token_id
  if pad is None and tokenizer is not None:
    pad = getattr(tokenizer, "pad_token_id", None)
  hf_config.update(architectures=[arch], num_labels=1,
                   id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0},
                   torch_dtype="float32", pad_token_id=pad)
  with open(os.path.join(hf_dir, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  if tokenizer is not None:
    tokenizer.save_pretrained(hf_dir)
  meta = {"format": FORMAT, "pooling": "last_token", "max_len": max_len,
          "head_bias": bias, "model_config": config.to_hf(),
          "metrics": dict(metrics or {})}
  with open(os.path.join(out_dir, "reward_model.json"), "w") as f:
    json.dump(meta, f, indent=1)
  return out_dir


def load_reward_model(path: str | os.PathLike, with_tokenizer: bool = True
                      ) -> RewardModel:
  """Reads a `save_reward_model` directory (its orbax params)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(os.fspath(path))
  meta_path = os.path.join(path, "reward_model.json")
  if not os.path.isfile(meta_path):
    raise FileNotFoundError(
        f"reward_model_path={path!r} has no reward_model.json; expected a "
        "directory written by experiments/train_reward_model.py")
  with open(meta_path) as f:
    meta = json.load(f)
  if meta.get("format") != FORMAT:
    raise ValueError(f"{meta_path}: format={meta.get('format')!r}; expected "
                     f"{FORMAT!r}")
  config = models.ModelConfig.from_hf(meta["model_config"])
  key = jax.random.PRNGKey(0)
  target = jax.eval_shape(lambda: init_reward_model(
      config, models.init_params(config, key), key))
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), target)
  params = ocp.StandardCheckpointer().restore(os.path.join(path, "orbax"),
                                              abstract)
  tokenizer = None
  hf_dir = os.path.join(path, "hf")
  if with_tokenizer and models.pretrained.has_tokenizer_files(hf_dir):
    tokenizer = models.load_tokenizer(hf_dir)
  return RewardModel(config, params, tokenizer, int(meta.get("max_len", 512)))


# ------------------------------------------------------------------ reward
@functools.partial(jax.jit, static_argnums=(0,))
def _score_batch(config, params, tokens, mask):
  return sequence_rewards(config, params, tokens, mask)


class RewardModelReward:
  """r(prompt, completion) of a trained reward model, as a batched reward.

  Runs in the trainer's process on its default device, `batch_size` rows per
  jitted call (the last chunk padded, so one shape compiles). Component
  `reward_model` holds the raw score; `scale`/`shift` map it to the reward:
  reward = scale · r + shift.
  """

  name = "reward_model"

  def __init__(self, model: RewardModel, tokenizer=None, batch_size: int = 32,
               scale: float = 1.0, shift: float = 0.0):
    self.model = model
    self.tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    if self.tokenizer is None:
      raise ValueError("RewardModelReward needs a tokenizer: the reward "
                       "model dir has none and none was given")
    if batch_size < 1:
      raise ValueError(f"batch_size={batch_size!r}; expected >= 1")
    self.batch_size = batch_size
    self.scale, self.shift = float(scale), float(shift)
    pad = getattr(self.tokenizer, "pad_token_id", None)
    self.pad_id = int(pad) if pad is not None else 0
    self.params = jax.device_put(model.params)

  def rewards(self, prompts: Sequence[str], completions: Sequence[str]
              ) -> np.ndarray:
    """Raw scores r(x, y) [N] float32."""
    out = np.zeros(len(prompts), np.float32)
    for sl in batched.chunks(len(prompts), self.batch_size):
      tokens, mask = encode_texts(self.tokenizer, prompts[sl], completions[sl],
                                  self.model.max_len, self.pad_id,
                                  rows=self.batch_size)
      r = _score_batch(self.model.config, self.params, jnp.asarray(tokens),
                       jnp.asarray(mask))
      out[sl] = np.asarray(r)[:sl.stop - sl.start]
    return out

  def score(self, inputs: Sequence[RewardInput]) -> RewardBatch:
    t0 = time.perf_counter()
    raw = self.rewards([i.prompt for i in inputs],
                       [i.completion for i in inputs])
    return batched.reward_batch(self.scale * raw + self.shift,
                                {"reward_model": raw},
                                seconds=time.perf_counter() - t0)

  def close(self) -> None:
    pass
