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
  "PreferenceDataError",
  "PreferencePair",
  "RewardModel",
  "RewardModelReward",
  "bradley_terry_loss",
  "encode_pairs",
  "encode_texts",
  "evaluate_pairs",
  "init_reward_model",
  "last_token_index",
  "load_preference_pairs",
  "load_reward_model",
  "make_train_step",
  "pair_accuracy",
  "pair_scores",
  "save_reward_model",
  "sequence_rewards",
  "split_pairs",
  "synthetic_arithmetic_pairs",
  "train_reward_model",
  "write_preference_pairs",
]

FORMAT = "rljax-bradley-terry-reward-model"
PAIR_FIELDS = ("prompt", "chosen", "rejected")


# ------------------------------------------------------------------ kernels
def bradley_terry_loss(
  r_chosen: chex.Array, r_rejected: chex.Array
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


def sequence_rewards(
  config: models.ModelConfig,
  params: dict[str, Any],
  tokens: chex.Array,
  attention_mask: chex.Array,
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
  values = models.value_forward(
    config, params["backbone"], params["head"], tokens, attention_mask
  )
  last = last_token_index(attention_mask)
  return jnp.take_along_axis(values, last[:, None], axis=1)[:, 0]


def init_reward_model(
  config: models.ModelConfig,
  backbone_params,
  rng: jax.Array,
  init_scale: float = 0.0,
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
        raise PreferenceDataError(
          f"{where}: not valid JSON ({e.msg} at column {e.colno})"
        ) from None
      if not isinstance(row, dict):
        raise PreferenceDataError(
          f"{where}: a {type(row).__name__}; expected "
          f"an object with fields {PAIR_FIELDS}"
        )
      for field in PAIR_FIELDS:
        if field not in row:
          raise PreferenceDataError(
            f"{where}: field {field!r} is missing (has {sorted(row)})"
          )
        value = row[field]
        if not isinstance(value, str):
          raise PreferenceDataError(
            f"{where}: field {field!r} is {type(value).__name__} "
            f"{value!r:.60}; expected a string"
          )
        if field != "prompt" and not value:
          raise PreferenceDataError(f"{where}: field {field!r} is empty")
      if row["chosen"] == row["rejected"]:
        raise PreferenceDataError(
          f"{where}: fields 'chosen' and 'rejected' "
          "are the same text; a pair needs two "
          "different responses"
        )
      pairs.append(
        PreferencePair(row["prompt"], row["chosen"], row["rejected"])
      )
  if not pairs:
    raise PreferenceDataError(f"{path}: no preference pairs in the file")
  return pairs


def write_preference_pairs(
  path: str | os.PathLike, pairs: Iterable[PreferencePair]
) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for p in pairs:
      f.write(json.dumps(dataclasses.asdict(p)) + "\n")


def _bucket(n: int, minimum: int = 16) -> int:
  """Next power of two >= n: few distinct shapes, few compilations."""
  size = minimum
  while size < n:
    size *= 2
  return size


def encode_texts(
  tokenizer,
  prompts: Sequence[str],
  responses: Sequence[str],
  max_len: int,
  pad_id: int,
  rows: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded (tokens, attention_mask) int32 [rows, T] of prompt +
  response, tokenized separately as the policy produced them.

  A sequence over `max_len` loses tokens from its start: the reward is read
  at the last token, which must stay. T is a power of two (few compiles);
  `rows` pads the batch with empty rows (mask 0 but for token 0).
  """
  if len(prompts) != len(responses):
    raise ValueError(
      f"encode_texts: {len(prompts)} prompts, {len(responses)} responses"
    )
  seqs = []
  for prompt, response in zip(prompts, responses):
    ids = tokenizer.encode(prompt, add_special_tokens=False) + tokenizer.encode(
      response, add_special_tokens=False
    )
    seqs.append(ids[-max_len:] or [pad_id])
  return _pack(seqs, pad_id, rows)


def _pack(
  seqs: Sequence[Sequence[int]], pad_id: int, rows: int | None
) -> tuple[np.ndarray, np.ndarray]:
  rows = len(seqs) if rows is None else rows
  t = _bucket(max((len(s) for s in seqs), default=1))
  tokens = np.full((rows, t), pad_id, np.int32)
  mask = np.zeros((rows, t), np.int32)
  mask[:, 0] = 1  # padding rows: one real token, so the last index exists
  for i, s in enumerate(seqs):
    tokens[i, : len(s)] = s
    mask[i, : len(s)] = 1
  return tokens, mask


def encode_pairs(
  tokenizer, pairs: Sequence[PreferencePair], max_len: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
  """[2B, T] tokens and mask: the B chosen rows, then the B rejected rows."""
  prompts = [p.prompt for p in pairs] * 2
  responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
  return encode_texts(tokenizer, prompts, responses, max_len, pad_id)


# ------------------------------------------------------------------ training
def _pair_metrics(config, params, tokens, mask):
  # The loss only sees differences, so the bias's true gradient is 0; its
  # float round-off would still be scaled up to full-size steps by Adam. The
  # bias stays frozen (at 0), which the HF export (no bias) relies on.
  head = dict(
    params["head"], bias=jax.lax.stop_gradient(params["head"]["bias"])
  )
  r = sequence_rewards(config, dict(params, head=head), tokens, mask)
  r_c, r_r = jnp.split(r, 2)
  return bradley_terry_loss(r_c, r_r), {
    "accuracy": pair_accuracy(r_c, r_r),
    "margin": jnp.mean(r_c - r_r),
  }


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


def pair_scores(
  config: models.ModelConfig,
  params,
  tokenizer,
  pairs: Sequence[PreferencePair],
  max_len: int,
  pad_id: int,
  batch_size: int = 32,
) -> tuple[np.ndarray, np.ndarray]:
  """(r_chosen [N], r_rejected [N]) float32 of every pair."""
  r_c, r_r = np.zeros(len(pairs), np.float32), np.zeros(len(pairs), np.float32)
  for sl in batched.chunks(len(pairs), batch_size):
    tokens, mask = encode_pairs(tokenizer, pairs[sl], max_len, pad_id)
    r = np.asarray(
      _score_batch(config, params, jnp.asarray(tokens), jnp.asarray(mask))
    )
    r_c[sl], r_r[sl] = np.split(r, 2)
  return r_c, r_r


def evaluate_pairs(
  config: models.ModelConfig,
  params,
  tokenizer,
  pairs: Sequence[PreferencePair],
  max_len: int,
  pad_id: int,
  batch_size: int = 32,
  kinds: Sequence[str] | None = None,
) -> dict[str, float]:
  """Held-out {"loss", "accuracy", "margin"} over the pairs (the kernels on
  `pair_scores`), plus "accuracy_<kind>" per distinct non-empty kind when
  `kinds` (one per pair) is given."""
  if not pairs:
    raise ValueError("evaluate_pairs: no pairs")
  r_c, r_r = pair_scores(
    config, params, tokenizer, pairs, max_len, pad_id, batch_size
  )
  r_c, r_r = jnp.asarray(r_c), jnp.asarray(r_r)
  out = {
    "loss": float(bradley_terry_loss(r_c, r_r)),
    "accuracy": float(pair_accuracy(r_c, r_r)),
    "margin": float(jnp.mean(r_c - r_r)),
  }
  if kinds is not None:
    if len(kinds) != len(pairs):
      raise ValueError(
        f"evaluate_pairs: {len(kinds)} kinds for {len(pairs)} pairs"
      )
    kinds = np.asarray(kinds)
    for kind in sorted(set(kinds.tolist()) - {""}):
      sel = jnp.asarray(kinds == kind)
      out[f"accuracy_{kind}"] = float(pair_accuracy(r_c[sel], r_r[sel]))
  return out


def train_reward_model(
  config: models.ModelConfig,
  params: dict[str, Any],
  tokenizer,
  train_pairs: Sequence[PreferencePair],
  held_out: Sequence[PreferencePair],
  *,
  steps: int,
  batch_size: int,
  learning_rate: float,
  max_len: int,
  seed: int = 0,
  eval_every: int = 0,
  warmup_steps: int = 0,
  log=None,
  held_out_kinds: Sequence[str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, float]]]:
  """Fits the Bradley–Terry loss with AdamW (warmup then cosine decay).

  Batches are drawn without replacement from a reshuffled copy of
  `train_pairs` each epoch. Held-out pairs are evaluated (`evaluate_pairs`)
  at step 0, every `eval_every` steps (0 = never in between) and at the end,
  with "eval_accuracy_<kind>" per `held_out_kinds` (one label per held-out
  pair). `log(row)` is called after every step.

  Returns:
    (params, history): one row per step {"step", "loss", "accuracy",
    "margin", "seconds"}, with "eval_loss", "eval_accuracy", "eval_margin"
    on evaluated steps.
  """
  for name, value in (
    ("steps", steps),
    ("batch_size", batch_size),
    ("max_len", max_len),
  ):
    if not isinstance(value, int) or value < 1:
      raise ValueError(
        f"train_reward_model: {name}={value!r}; expected an int >= 1"
      )
  if not train_pairs:
    raise ValueError("train_reward_model: no training pairs")
  pad = getattr(tokenizer, "pad_token_id", None)
  pad = int(pad) if pad is not None else 0
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, learning_rate, max(warmup_steps, 1), max(steps, warmup_steps + 1)
  )
  optimizer = optax.adamw(schedule)
  opt_state = optimizer.init(params)
  step_fn = make_train_step(config, optimizer)
  rng = np.random.default_rng(seed)
  order, cursor = rng.permutation(len(train_pairs)), 0
  history = []

  def evaluate(row):
    if held_out:
      ev = evaluate_pairs(
        config,
        params,
        tokenizer,
        held_out,
        max_len,
        pad,
        batch_size=max(batch_size, 8),
        kinds=held_out_kinds,
      )
      row.update({f"eval_{k}": v for k, v in ev.items()})

  start = {"step": 0}
  evaluate(start)
  history.append(start)
  if log is not None:
    log(start)
  for step in range(1, steps + 1):
    t0 = time.perf_counter()
    idx = []
    while len(idx) < batch_size:
      if cursor == len(order):
        order, cursor = rng.permutation(len(train_pairs)), 0
      take = min(batch_size - len(idx), len(order) - cursor)
      idx.extend(order[cursor : cursor + take])
      cursor += take
    tokens, mask = encode_pairs(
      tokenizer, [train_pairs[i] for i in idx], max_len, pad
    )
    params, opt_state, out = step_fn(
      params, opt_state, jnp.asarray(tokens), jnp.asarray(mask)
    )
    row = {
      "step": step,
      **{k: float(v) for k, v in out.items()},
      "seconds": time.perf_counter() - t0,
    }
    if step == steps or (eval_every and step % eval_every == 0):
      evaluate(row)
    history.append(row)
    if log is not None:
      log(row)
  return params, history


# ------------------------------------------------------------------ synthetic
def synthetic_arithmetic_pairs(
  num_pairs: int, render, *, seed: int = 0, difficulty: str = "easy"
) -> list[tuple[PreferencePair, str]]:
  """Preference pairs with a known rule, for a demo or a test.

  Each pair is one generated arithmetic problem (`rljax.data`), rendered by
  `render(question)` (the trainer's prompt template); the chosen response
  states the correct answer in \\boxed{}; the rejected one either states a
  wrong number (kind "wrong_answer") or gives no answer ("no_answer"),
  alternately.

  Returns:
    [(pair, kind)] of `num_pairs` items.
  """
  from rljax import data as data_lib  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  examples = data_lib.generate_arithmetic(num_pairs, difficulty, seed=seed)
  forms = (
    "The answer is \\boxed{{{}}}.",
    "{} = \\boxed{{{}}}",
    "Let me compute: {} = {}. So the answer is \\boxed{{{}}}.",
  )
  hedges = (
    "I am not sure how to solve this.",
    "Let me think about it.",
    "This is a math question.",
    "I don't know.",
  )
  out = []
  for i, ex in enumerate(examples):
    answer = int(ex.answer)
    wrong = answer + int(rng.choice([-3, -2, -1, 1, 2, 3, 10]))
    form = forms[i % len(forms)]
    expr = ex.metadata.get("expression", ex.question)

    def say(value, form=form, expr=expr):
      if form.count("{}") == 1:
        return form.format(value)
      if form.count("{}") == 2:
        return form.format(expr, value)
      return form.format(expr, value, value)

    chosen = say(answer)
    if i % 2 == 0:
      kind, rejected = "wrong_answer", say(wrong)
    else:
      kind, rejected = "no_answer", hedges[int(rng.integers(len(hedges)))]
    out.append((PreferencePair(render(ex.question), chosen, rejected), kind))
  return out


def split_pairs(
  items: Sequence[Any], held_out_fraction: float, seed: int = 0, key=None
) -> tuple[list[Any], list[Any]]:
  """(train, held_out): a random `held_out_fraction` of the items, grouped
  by `key(item)` (default the pair's prompt) so that no prompt is on both
  sides."""
  if not 0.0 <= held_out_fraction < 1.0:
    raise ValueError(
      f"held_out_fraction={held_out_fraction!r}; expected a value in [0, 1)"
    )
  key = key or (
    lambda item: (item[0] if isinstance(item, tuple) else item).prompt
  )
  groups = sorted({key(item) for item in items})
  rng = np.random.default_rng(seed)
  rng.shuffle(groups)
  held = set(groups[: int(round(held_out_fraction * len(groups)))])
  train = [item for item in items if key(item) not in held]
  return train, [item for item in items if key(item) in held]


# ------------------------------------------------------------------ files
@dataclasses.dataclass(frozen=True)
class RewardModel:
  config: models.ModelConfig
  params: dict[str, Any]
  tokenizer: Any = None
  max_len: int = 512


def save_reward_model(
  out_dir: str | os.PathLike,
  config: models.ModelConfig,
  params: dict[str, Any],
  tokenizer=None,
  max_len: int = 512,
  metrics: dict[str, float] | None = None,
) -> str:
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
  state = {
    k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in state.items()
  }
  safetensors.numpy.save_file(
    state, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"}
  )
  hf_config = config.to_hf()
  arch = hf_config["architectures"][0].replace(
    "ForCausalLM", "ForSequenceClassification"
  )
  pad = config.pad_token_id
  if pad is None and tokenizer is not None:
    pad = getattr(tokenizer, "pad_token_id", None)
  hf_config.update(
    architectures=[arch],
    num_labels=1,
    id2label={"0": "LABEL_0"},
    label2id={"LABEL_0": 0},
    torch_dtype="float32",
    pad_token_id=pad,
  )
  with open(os.path.join(hf_dir, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  if tokenizer is not None:
    tokenizer.save_pretrained(hf_dir)
  meta = {
    "format": FORMAT,
    "pooling": "last_token",
    "max_len": max_len,
    "head_bias": bias,
    "model_config": config.to_hf(),
    "metrics": dict(metrics or {}),
  }
  with open(os.path.join(out_dir, "reward_model.json"), "w") as f:
    json.dump(meta, f, indent=1)
  return out_dir


def load_reward_model(
  path: str | os.PathLike, with_tokenizer: bool = True
) -> RewardModel:
  """Reads a `save_reward_model` directory (its orbax params)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  path = os.path.abspath(os.fspath(path))
  meta_path = os.path.join(path, "reward_model.json")
  if not os.path.isfile(meta_path):
    raise FileNotFoundError(
      f"reward_model_path={path!r} has no reward_model.json; expected a "
      "directory written by experiments/train_reward_model.py"
    )
  with open(meta_path) as f:
    meta = json.load(f)
  if meta.get("format") != FORMAT:
    raise ValueError(
      f"{meta_path}: format={meta.get('format')!r}; expected {FORMAT!r}"
    )
  config = models.ModelConfig.from_hf(meta["model_config"])
  key = jax.random.PRNGKey(0)
  target = jax.eval_shape(
    lambda: init_reward_model(config, models.init_params(config, key), key)
  )
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), target
  )
  params = ocp.StandardCheckpointer().restore(
    os.path.join(path, "orbax"), abstract
  )
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

  def __init__(
    self,
    model: RewardModel,
    tokenizer=None,
    batch_size: int = 32,
    scale: float = 1.0,
    shift: float = 0.0,
  ):
    self.model = model
    self.tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    if self.tokenizer is None:
      raise ValueError(
        "RewardModelReward needs a tokenizer: the reward "
        "model dir has none and none was given"
      )
    if batch_size < 1:
      raise ValueError(f"batch_size={batch_size!r}; expected >= 1")
    self.batch_size = batch_size
    self.scale, self.shift = float(scale), float(shift)
    pad = getattr(self.tokenizer, "pad_token_id", None)
    self.pad_id = int(pad) if pad is not None else 0
    self.params = jax.device_put(model.params)

  def rewards(
    self, prompts: Sequence[str], completions: Sequence[str]
  ) -> np.ndarray:
    """Raw scores r(x, y) [N] float32."""
    out = np.zeros(len(prompts), np.float32)
    for sl in batched.chunks(len(prompts), self.batch_size):
      tokens, mask = encode_texts(
        self.tokenizer,
        prompts[sl],
        completions[sl],
        self.model.max_len,
        self.pad_id,
        rows=self.batch_size,
      )
      r = _score_batch(
        self.model.config, self.params, jnp.asarray(tokens), jnp.asarray(mask)
      )
      out[sl] = np.asarray(r)[: sl.stop - sl.start]
    return out

  def score(self, inputs: Sequence[RewardInput]) -> RewardBatch:
    t0 = time.perf_counter()
    raw = self.rewards(
      [i.prompt for i in inputs], [i.completion for i in inputs]
    )
    return batched.reward_batch(
      self.scale * raw + self.shift,
      {"reward_model": raw},
      seconds=time.perf_counter() - t0,
    )

  def close(self) -> None:
    pass
