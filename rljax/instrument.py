"""A small decoder trained from scratch on generated arithmetic: the cheap
instrument for long-horizon quantized-rollout RL.

QuRL's long-horizon collapse (Fig. 3: TIS drifts, ACR holds) takes hundreds
of RL steps; a 135M model takes ~40 s per step on a 2-core CPU. This module
makes a policy that costs well under a second per step and still has
something to learn:

  * `CharTokenizer`: one token per character of "0123456789+-*/()=" plus
    <pad>, <bos>, <eos> (20 tokens), with the encode/decode/eos/pad calls the
    trainer makes of a tokenizer.
  * `InstrumentConfig`: a Llama-architecture decoder of a few million
    parameters (the same `rljax.models` code as SmolLM2, so INT8/FP8 rollout,
    UAQ and every correction run unchanged).
  * `train_sft`: supervised fine-tuning from random weights on
    "expression=answer<eos>" until the held-out greedy accuracy reaches a
    target (partly competent: RL has headroom), resumable.
  * `build_task` / `run_experiment`: the generated-arithmetic `Task` in this
    tokenizer's bare format ("(3+4)*2=" -> "14") and one RL run through the
    real `Trainer`, writing the same run directory as any other run.

experiments/long_horizon.py drives it; docs/long_horizon.md explains it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable, Sequence

import numpy as np

__all__ = [
  "CharTokenizer",
  "InstrumentConfig",
  "SFTConfig",
  "build_task",
  "load_model",
  "render_prompt",
  "run_experiment",
  "train_sft",
]

_CHARS = "0123456789+-*/()="
SPECIALS = ("<pad>", "<bos>", "<eos>")
MODEL_FILE = "instrument.json"
PARAMS_FILE = "params.npz"
STATE_FILE = "sft_state.npz"


class CharTokenizer:
  """One token per character; ids 0-2 are <pad>, <bos>, <eos>."""

  pad_token_id = 0
  bos_token_id = 1
  eos_token_id = 2

  def __init__(self):
    self._vocab = SPECIALS + tuple(_CHARS)
    self._ids = {c: i for i, c in enumerate(self._vocab)}

  def __len__(self) -> int:
    return len(self._vocab)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    bad = sorted({c for c in text if c not in self._ids or c in SPECIALS})
    if bad:
      raise ValueError(
        f"CharTokenizer.encode: characters {bad} of {text!r} "
        f"are not in the vocabulary {_CHARS!r}"
      )
    ids = [self._ids[c] for c in text]
    return [self.bos_token_id] + ids if add_special_tokens else ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i < len(SPECIALS):
        if not skip_special_tokens:
          out.append(SPECIALS[i])
        continue
      if i < len(self._vocab):
        out.append(self._vocab[i])
    return "".join(out)


def render_prompt(question: str) -> str:
  """'What is (3 + 4) × 2?' -> '(3+4)*2=' (the generator's expression form)."""
  text = question.strip()
  if text.startswith("What is "):
    text = text[len("What is ") :]
  text = text.rstrip("?").replace("\u00d7", "*").replace("\u00f7", "/")
  return text.replace(" ", "") + "="


@dataclasses.dataclass(frozen=True)
class InstrumentConfig:
  """Shape of the decoder (Llama architecture, untied head).

  The default, 4 layers of width 128, has 0.8M parameters: large enough to
  learn two-step arithmetic from scratch in minutes, small enough for
  sub-second RL steps on two shared CPU cores (width 256 learns faster per
  step but made RL steps ~1.5 s there).
  """

  hidden_size: int = 128
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 2
  intermediate_size: int = 512
  max_len: int = 64

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(
        f"InstrumentConfig.hidden_size={self.hidden_size} is "
        f"not a multiple of num_heads={self.num_heads}"
      )
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"InstrumentConfig.num_kv_heads={self.num_kv_heads} "
        f"does not divide num_heads={self.num_heads}"
      )

  def model_config(self):
    from rljax import models

    return models.tiny_config(
      vocab_size=len(CharTokenizer()),
      hidden_size=self.hidden_size,
      intermediate_size=self.intermediate_size,
      num_layers=self.num_layers,
      num_heads=self.num_heads,
      num_kv_heads=self.num_kv_heads,
      head_dim=self.hidden_size // self.num_heads,
      max_position_embeddings=self.max_len,
      bos_token_id=CharTokenizer.bos_token_id,
      eos_token_id=CharTokenizer.eos_token_id,
      pad_token_id=CharTokenizer.pad_token_id,
    )


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """Supervised pre-training of the instrument.

  Stops at `steps` or as soon as the greedy accuracy on `eval_size` held-out
  problems reaches `target_accuracy` (checked every `eval_every` steps), so
  that RL starts from a partly competent policy.
  """

  difficulty: str = "medium"
  steps: int = 4000
  batch_size: int = 64
  learning_rate: float = 1e-3
  warmup_steps: int = 100
  eval_every: int = 100
  eval_size: int = 256
  target_accuracy: float = 0.3
  seed: int = 0

  def __post_init__(self):
    if not 0.0 < self.target_accuracy <= 1.0:
      raise ValueError(
        f"SFTConfig.target_accuracy={self.target_accuracy}: expected in (0, 1]"
      )
    for name in ("steps", "batch_size", "eval_every", "eval_size"):
      if getattr(self, name) < 1:
        raise ValueError(
          f"SFTConfig.{name}={getattr(self, name)}: expected >= 1"
        )


# Seeds of the SFT problem streams, apart from the RL streams of
# rljax.train.tasks (train: seed, held-out: 10_000 + seed).
_SFT_TRAIN_SEED = 50_000
_SFT_EVAL_SEED = 60_000
# RL held-out sets the SFT data must not contain (RL seeds 0..9).
_RL_SEEDS_PROTECTED = range(10)


def sft_examples(sft: SFTConfig, rl_eval_size: int, count: int):
  """`count` SFT training problems, none in an RL held-out set of seeds
  0-9 (eval_size `rl_eval_size`), and the SFT held-out problems."""
  from rljax import data as data_lib

  protected = set()
  for s in _RL_SEEDS_PROTECTED:
    protected |= {
      e.question
      for e in data_lib.generate_arithmetic(
        rl_eval_size, sft.difficulty, seed=10_000 + s
      )
    }
  held = data_lib.generate_arithmetic(
    sft.eval_size, sft.difficulty, seed=_SFT_EVAL_SEED + sft.seed
  )
  protected |= {e.question for e in held}
  train = [
    e
    for e in data_lib.generate_arithmetic(
      count, sft.difficulty, seed=_SFT_TRAIN_SEED + sft.seed
    )
    if e.question not in protected
  ]
  return train, held


def sft_batch(
  tokenizer: CharTokenizer, examples, length: int
) -> tuple[np.ndarray, np.ndarray]:
  """tokens [B, length] of "prompt answer <eos>" (right-padded) and the
  loss mask [B, length - 1] over the targets answer + <eos>."""
  tokens = np.zeros((len(examples), length), np.int32)
  mask = np.zeros((len(examples), length - 1), np.float32)
  for b, e in enumerate(examples):
    prompt = tokenizer.encode(render_prompt(e.question))
    answer = tokenizer.encode(e.answer) + [tokenizer.eos_token_id]
    row = prompt + answer
    if len(row) > length:
      raise ValueError(
        f"sft_batch: {e.question!r} needs {len(row)} tokens; length={length}"
      )
    tokens[b, : len(row)] = row
    # Target t+1 is predicted at position t: answer tokens and <eos>.
    mask[b, len(prompt) - 1 : len(row) - 1] = 1.0
  return tokens, mask


def _sft_loss(config, params, tokens, mask):
  import jax
  import jax.numpy as jnp
  from rljax import models

  logits = models.forward(config, params, tokens[:, :-1])
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def greedy_accuracy(
  config, params, tokenizer, examples, max_new_tokens: int = 8
) -> float:
  """Fraction of `examples` whose greedy completion is exactly the answer."""
  from rljax.rollout.base import SamplingConfig
  from rljax.rollout.jax_sampler import JaxSampler

  prompts = [tokenizer.encode(render_prompt(e.question)) for e in examples]
  engine = JaxSampler(
    config,
    params,
    quant="none",
    max_prompt_len=32,
    pad_id=tokenizer.pad_token_id,
  )
  try:
    rb = engine.generate(
      prompts,
      SamplingConfig(
        n=1,
        greedy=True,
        max_new_tokens=max_new_tokens,
        stop_token_ids=(tokenizer.eos_token_id,),
        seed=0,
      ),
    )
  finally:
    engine.close()
  got = [tokenizer.decode(r) for r in rb.response_ids]
  return float(np.mean([g == e.answer for g, e in zip(got, examples)]))


def _flatten(tree) -> dict[str, np.ndarray]:
  import jax

  leaves = jax.tree_util.tree_leaves_with_path(tree)
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def _unflatten(template, arrays: dict):
  import jax
  import jax.numpy as jnp

  paths, treedef = jax.tree_util.tree_flatten_with_path(template)
  leaves = []
  for path, like in paths:
    key = jax.tree_util.keystr(path)
    if key not in arrays:
      raise ValueError(f"instrument checkpoint has no array {key!r}")
    leaves.append(jnp.asarray(arrays[key], dtype=jnp.asarray(like).dtype))
  return jax.tree_util.tree_unflatten(treedef, leaves)


def _save_npz(path: str, arrays: dict) -> None:
  tmp = path + ".tmp.npz"
  np.savez(tmp, **arrays)
  os.replace(tmp, path)  # a killed save never leaves half a file


def train_sft(
  out_dir: str,
  shape: InstrumentConfig,
  sft: SFTConfig,
  rl_eval_size: int = 256,
  state_every: int = 200,
  log: Callable[[str], None] = print,
  progress: bool = False,
) -> dict:
  """Pre-trains the instrument in `out_dir` (resumable); returns its record.

  Writes `instrument.json` (shapes, SFT config, history of held-out
  accuracy) and `params.npz` when done; `sft_state.npz` holds params, Adam
  state and step every `state_every` steps, so a killed SFT continues.
  """
  import jax
  import optax
  from rljax import models

  record_path = os.path.join(out_dir, MODEL_FILE)
  if os.path.exists(record_path):
    with open(record_path) as f:
      record = json.load(f)
    if record.get("done"):
      return record
  os.makedirs(out_dir, exist_ok=True)
  tokenizer = CharTokenizer()
  config = shape.model_config()
  params = models.init_params(config, jax.random.PRNGKey(sft.seed))
  # A short SFT (a test) warms up over at most half its steps.
  warmup = min(sft.warmup_steps, sft.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, sft.learning_rate, warmup, sft.steps, sft.learning_rate / 10
  )
  opt = optax.chain(
    optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01)
  )
  opt_state = opt.init(params)
  step, history, t_spent = 0, [], 0.0
  state_path = os.path.join(out_dir, STATE_FILE)
  if os.path.exists(state_path):
    saved = dict(np.load(state_path))
    step = int(saved.pop("__step"))
    t_spent = float(saved.pop("__seconds"))
    history = json.loads(str(saved.pop("__history")))
    params = _unflatten(
      params, {k[2:]: v for k, v in saved.items() if k.startswith("p:")}
    )
    opt_state = _unflatten(
      opt_state, {k[2:]: v for k, v in saved.items() if k.startswith("o:")}
    )
    log(f"[instrument] resuming SFT at step {step}")
  train, held = sft_examples(sft, rl_eval_size, count=100_000)

  @jax.jit
  def update(params, opt_state, tokens, mask):
    loss, grads = jax.value_and_grad(
      lambda p: _sft_loss(config, p, tokens, mask)
    )(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  rng = np.random.default_rng(sft.seed)
  rng.bit_generator.advance(step)  # a resumed SFT draws new batches
  length = 32
  bar = None
  if progress:
    from tqdm import tqdm

    bar = tqdm(total=sft.steps, initial=step, desc="SFT", unit="step")
  t0 = time.perf_counter()
  reached = False

  def save_state():
    arrays = {"p:" + k: v for k, v in _flatten(params).items()}
    arrays.update({"o:" + k: v for k, v in _flatten(opt_state).items()})
    arrays.update(
      {
        "__step": np.array(step),
        "__seconds": np.array(t_spent + time.perf_counter() - t0),
        "__history": np.array(json.dumps(history)),
      }
    )
    _save_npz(state_path, arrays)

  while step < sft.steps and not reached:
    idx = rng.integers(0, len(train), sft.batch_size)
    tokens, mask = sft_batch(tokenizer, [train[i] for i in idx], length)
    params, opt_state, loss = update(params, opt_state, tokens, mask)
    step += 1
    if bar is not None:
      bar.update(1)
      bar.set_postfix(loss=f"{float(loss):.3f}")
    if step % sft.eval_every == 0 or step == sft.steps:
      acc = greedy_accuracy(config, params, tokenizer, held)
      history.append({"step": step, "loss": float(loss), "accuracy": acc})
      log(
        f"[instrument] SFT step {step}: loss {float(loss):.4f}, held-out "
        f"greedy accuracy {acc:.3f}"
      )
      reached = acc >= sft.target_accuracy
    if step % state_every == 0:
      save_state()
  if bar is not None:
    bar.close()
  _save_npz(os.path.join(out_dir, PARAMS_FILE), _flatten(params))
  record = {
    "done": True,
    "shape": dataclasses.asdict(shape),
    "sft": dataclasses.asdict(sft),
    "steps": step,
    "accuracy": history[-1]["accuracy"] if history else None,
    "reached_target": reached,
    "history": history,
    "sft_seconds": t_spent + time.perf_counter() - t0,
    "parameters": int(
      sum(np.asarray(x).size for x in jax.tree_util.tree_leaves(params))
    ),
  }
  with open(record_path, "w") as f:
    json.dump(record, f, indent=1)
  return record


def load_model(out_dir: str):
  """The pre-trained instrument of `train_sft` as an `rljax.models.Model`."""
  import jax
  from rljax import models

  record_path = os.path.join(out_dir, MODEL_FILE)
  if not os.path.exists(record_path):
    raise FileNotFoundError(
      f"{out_dir!r} holds no pre-trained instrument ({MODEL_FILE}); run "
      "experiments/long_horizon.py (its SFT phase) first"
    )
  with open(record_path) as f:
    record = json.load(f)
  config = InstrumentConfig(**record["shape"]).model_config()
  template = models.init_params(config, jax.random.PRNGKey(0))
  params = _unflatten(
    template, dict(np.load(os.path.join(out_dir, PARAMS_FILE)))
  )
  return models.Model(config=config, params=params, tokenizer=CharTokenizer())


# A run's model is `instrument:<dir>`, or `instrument:<dir>#order=<k>`: the
# same instrument and problems, the training prompts drawn in another order
# (a perturbed A/A arm: the harmless change that measures a study's noise).
ORDER_KEY = "#order="
# Order k > 0 shuffles the training prompts with seed run.seed + k * this
# (far from every run seed, so no two (seed, order) pairs share an order).
ORDER_STRIDE = 1_000_003


def parse_name(spec: str) -> tuple[str, int]:
  """(instrument dir, data order) of a model spec `<dir>` or
  `<dir>#order=<k>` (the part of `model.name` after `instrument:`)."""
  spec = (
    spec.split("instrument:", 1)[1] if spec.startswith("instrument:") else spec
  )
  path, sep, order = spec.partition(ORDER_KEY)
  if not sep:
    return spec, 0
  if not order.isdigit():
    raise ValueError(
      f"instrument model {spec!r}: data order {order!r}; expected "
      f"'<dir>{ORDER_KEY}<k>' with an integer k >= 0"
    )
  return path, int(order)


def order_seed(run_seed: int, order: int) -> int:
  """The seed of the training prompts' order: the run's seed at order 0."""
  if order < 0:
    raise ValueError(f"data order {order}; expected >= 0")
  return run_seed + order * ORDER_STRIDE


def build_task(cfg, tokenizer: CharTokenizer, order: int = 0):
  """The generated-arithmetic `Task` of `cfg` in the instrument's format.

  The same problem streams as `rljax.train.tasks.build_task` (train: seed
  cfg.run.seed, held-out: 10_000 + cfg.run.seed), rendered bare ('12+5-9=') and
  scored by the same verifier (the completion is a plain number). `order`
  > 0 keeps both sets and draws the training prompts in another order
  (`order_seed`).
  """
  from rljax import data as data_lib
  from rljax.train import tasks as tasks_lib

  if cfg.task.name != "arithmetic":
    raise ValueError(
      f"task={cfg.task.name!r}: the instrument trains on "
      "'arithmetic' only (its vocabulary is digits and +-*/()=)"
    )
  held_out = data_lib.generate_arithmetic(
    cfg.task.eval_size, cfg.task.difficulty, seed=10_000 + cfg.run.seed
  )
  held_q = {e.question for e in held_out}
  train = [
    e
    for e in data_lib.generate_arithmetic(
      tasks_lib.GENERATED_POOL, cfg.task.difficulty, seed=cfg.run.seed
    )
    if e.question not in held_q
  ]
  return tasks_lib.Task(
    train,
    held_out,
    tokenizer,
    render_prompt,
    cfg.rollout.prompts_per_step,
    order_seed(cfg.run.seed, order),
    cfg.task.max_prompt_tokens,
    cfg.task.reward_workers,
    last_number_fallback=True,
  )


def run_experiment(
  cfg, instrument_dir: str, show_progress: bool = True
) -> dict:
  """One RL run of the pre-trained instrument through the real `Trainer`
  (`rljax.study.run`: per-problem held-out records at every evaluation).
  `instrument_dir` may carry a data order (`parse_name`)."""
  from rljax import study

  path, order = parse_name(instrument_dir)
  model = load_model(path)
  return study.run(
    cfg,
    model=model,
    task=build_task(cfg, model.tokenizer, order=order),
    show_progress=show_progress,
  )
