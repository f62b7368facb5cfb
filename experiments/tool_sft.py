"""A tool-use warm-up: supervised fine-tuning on generated demonstrations.

Left to itself (`tool_choice=auto`) SmolLM2-135M-Instruct calls the tool in
under 1 % of its episodes, so GRPO's groups all score 0 and nothing is
learned. This script writes demonstrations of the behaviour to learn and
fine-tunes on them, so that RL with `auto` has calls to reinforce:

  turn 1   the call, in the trainer's format: `<calculator>EXPR</calculator>`
           (tool_arithmetic) or `<python>PROGRAM</python>`
           (tool_word_problems: the problem's own program)
  obs.     the real tool's answer, from the trainer's own environment
  turn 2   "The answer is \\boxed{ANSWER}." and the end-of-turn id

Each demonstration is an episode of the trainer's environment
(`tool_task.make_tool_env`, `tool_choice=auto`), ids laid out as the
multi-turn driver lays them (prompt | call | observation | answer, each
encoded on its own); it is kept only if the environment scores it 1. The
loss is the mean negative log-likelihood of the model's ids (the call and
the answer), never of the prompt or the tool's output. The problems come
from the trainer's training pool with the held-out ones removed.

  python experiments/tool_sft.py --out_dir=runs/tool_sft/sft
  python experiments/tool_sft.py --task=tool_word_problems --tool=python \\
      --out_dir=runs/tool_sft/sft_word

Writes <out_dir>/model (an HF directory: `--model.name=` of the trainer,
`--model=` of tool_eval.py), metrics.jsonl (loss per step) and
demos.jsonl (the first demonstrations as text). A finished out_dir is left
as it is, and a killed run resumes from its last checkpoint (state.pkl,
every --save_every steps: weights, optimizer state, batch order, rng).
"""

from __future__ import annotations

import json
import os
import pickle
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags

from rljax import envs, hostmem, models
from rljax.data.prompts import ChatTemplate
from rljax.train import cli, tool_task

_MODEL = flags.DEFINE_string(
  "model", "smollm2-135m-instruct", "Policy: a name, HF directory or tiny."
)
_TASK = flags.DEFINE_enum(
  "task", "tool_arithmetic", ["tool_arithmetic", "tool_word_problems"], ""
)
_DIFFICULTY = flags.DEFINE_enum(
  "difficulty", "easy", ["easy", "medium", "hard"], "The task's level."
)
_TOOL = flags.DEFINE_enum("tool", "calculator", ["calculator", "python"], "")
_FORMAT = flags.DEFINE_enum("tool_format", "tags", ["tags", "qwen"], "")
_PROMPT = flags.DEFINE_enum(
  "tool_prompt", "plain", ["plain", "example"], "A worked call or not."
)
_SEED = flags.DEFINE_integer("seed", 0, "The training run's run.seed.")
_DEMOS = flags.DEFINE_integer("demos", 256, "Demonstrations written.")
_STEPS = flags.DEFINE_integer("steps", 32, "Optimizer steps.")
_BATCH = flags.DEFINE_integer("batch", 8, "Demonstrations per step.")
_LR = flags.DEFINE_float("lr", 2e-5, "AdamW learning rate (cosine decay).")
_MAX_LEN = flags.DEFINE_integer("max_len", 512, "Ids of one demonstration.")
_OUT_DIR = flags.DEFINE_string("out_dir", "runs/tool_sft/sft", "Output.")
_SAVE_EVERY = flags.DEFINE_integer(
  "save_every", 4, "Steps between checkpoints (a killed run resumes)."
)
_STOP_AFTER = flags.DEFINE_integer(
  "stop_after",
  0,
  "Stop after this step with its checkpoint written, as a kill there would "
  "leave the run (a time-boxed share of a busy machine); 0 = run to the end.",
)
_STATE = "state.pkl"


def _save_state(out_dir: str, state) -> None:
  """params, optimizer state, step, the batch order left and the rng, by
  an atomic rename (a kill leaves the previous checkpoint whole)."""
  params, opt_state, step, order, rng = state
  host = jax.device_get((params, opt_state))
  path = os.path.join(out_dir, _STATE)
  with open(path + ".tmp", "wb") as f:
    pickle.dump((*host, step, list(order), rng.bit_generator.state), f)
  os.replace(path + ".tmp", path)


def _load_state(out_dir: str):
  path = os.path.join(out_dir, _STATE)
  if not os.path.isfile(path):
    return None
  with open(path, "rb") as f:
    params, opt_state, step, order, rng_state = pickle.load(f)
  as_jax = jax.tree_util.tree_map(jnp.asarray, (params, opt_state))
  return (*as_jax, step, order, rng_state)


def _identity(text: str) -> str:
  return text


def call_text(tool: envs.Tool, format_name: str, example) -> str:
  """The demonstration's call of `tool` for `example`, in `format_name`."""
  if "code" in example.metadata and tool.argument == "code":
    argument = example.metadata["code"]
  else:
    expression = example.metadata.get("expression")
    if expression is None:
      raise ValueError(
        f"example {example.uid}: a {tool.name} call needs "
        "metadata['expression'] (tool_arithmetic) or a python tool"
      )
    argument = expression.replace("\u00d7", "*").replace("\u2212", "-")
    if tool.argument == "code":
      argument = f"print({argument})"
  if format_name == "tags":
    return f"<{tool.name}>{argument}</{tool.name}>"
  body = json.dumps({"name": tool.name, "arguments": {tool.argument: argument}})
  return f"<tool_call>\n{body}\n</tool_call>"


def demonstration(tokenizer, render, make_env, tool, format_name, example):
  """(ids, loss mask) of one demonstrated episode, or None where the
  environment does not score it 1 (a tool error, a cut)."""
  env = make_env()
  ids = tool_task.render_prompt_ids(tokenizer, render, env.reset(example))
  mask = [0] * len(ids)

  def add(text: str, trained: int, extra=()):
    new = tokenizer.encode(text, add_special_tokens=False) + list(extra)
    ids.extend(new)
    mask.extend([trained] * len(new))

  call = call_text(tool, format_name, example)
  result = env.step(call)
  if result.done:
    return None
  add(call, 1)
  add(result.observation, 0)
  answer = f"The answer is \\boxed{{{example.answer}}}."
  if env.step(answer).reward < 1.0:
    return None
  add(answer, 1, [tokenizer.eos_token_id])
  return ids, mask


def _pad(rows, width: int, pad_id: int):
  tokens = np.full((len(rows), width), pad_id, np.int32)
  attention = np.zeros((len(rows), width), np.int32)
  loss = np.zeros((len(rows), width), np.float32)
  for i, (ids, mask) in enumerate(rows):
    tokens[i, : len(ids)] = ids
    attention[i, : len(ids)] = 1
    loss[i, : len(mask)] = mask
  return tokens, attention, loss


def make_step(config, optimizer):
  """One AdamW step on the mean NLL of the masked ids."""

  def loss_fn(params, tokens, attention, loss_mask):
    logp, _ = models.token_logprobs(config, params, tokens, attention)
    weight = loss_mask[:, 1:]  # logp[:, t] scores tokens[:, t + 1]
    return -jnp.sum(logp * weight) / jnp.maximum(jnp.sum(weight), 1.0)

  @jax.jit
  def step(params, opt_state, tokens, attention, loss_mask):
    loss, grads = jax.value_and_grad(loss_fn)(
      params, tokens, attention, loss_mask
    )
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def main(argv) -> None:
  del argv
  out_dir = _OUT_DIR.value
  model_dir = os.path.join(out_dir, "model")
  if os.path.isfile(os.path.join(model_dir, "config.json")):
    print(f"{model_dir} exists: nothing to do", flush=True)
    return
  os.makedirs(out_dir, exist_ok=True)
  t0 = time.perf_counter()
  model = models.load_named(_MODEL.value)
  tokenizer, config = model.tokenizer, model.config
  tool = tool_task.make_tool(_TOOL.value)
  example_text = (
    tool_task.worked_example(tool, _FORMAT.value)
    if _PROMPT.value == "example"
    else ""
  )
  env_config = envs.ToolEnvConfig(format=_FORMAT.value, max_turns=4)

  def make_env():
    return tool_task.make_tool_env(
      tool, env_config, tool_task.ToolPrompt(example_text), tokenizer
    )

  render = ChatTemplate(tokenizer, user_template=_identity)
  held = {
    e.question
    for e in tool_task.held_out_problems(
      1024, _SEED.value, _DIFFICULTY.value, _TASK.value
    )
  }
  pool = tool_task.generate_problems(
    _TASK.value, tool_task.TOOL_POOL, _SEED.value, _DIFFICULTY.value
  )
  rows, texts, skipped = [], [], 0
  for example in pool:
    if len(rows) == _DEMOS.value:
      break
    if example.question in held:
      continue
    demo = demonstration(
      tokenizer, render, make_env, tool, _FORMAT.value, example
    )
    if demo is None or len(demo[0]) > _MAX_LEN.value:
      skipped += 1
      continue
    rows.append(demo)
    if len(texts) < 8:
      texts.append({"uid": example.uid, "text": tokenizer.decode(demo[0])})
  with open(os.path.join(out_dir, "demos.jsonl"), "w") as f:
    for t in texts:
      f.write(json.dumps(t) + "\n")
  width = max(len(ids) for ids, _ in rows)
  print(
    f"{len(rows)} demonstrations (skipped {skipped}), longest {width} ids",
    flush=True,
  )
  schedule = optax.cosine_decay_schedule(_LR.value, _STEPS.value)
  optimizer = optax.adamw(schedule, weight_decay=0.0)
  params = jax.tree_util.tree_map(jnp.asarray, model.params)
  opt_state = optimizer.init(params)
  step = make_step(config, optimizer)
  pad = int(tokenizer.pad_token_id or 0)
  rng = np.random.default_rng(_SEED.value)
  order: list[int] = []
  first, saved = 1, _load_state(out_dir)
  if saved is not None:  # a killed run goes on from its last checkpoint
    params, opt_state, done, order, rng.bit_generator.state = saved
    first = done + 1
    print(f"resumed after step {done}", flush=True)
  with open(os.path.join(out_dir, "metrics.jsonl"), "a") as log:
    for k in range(first, _STEPS.value + 1):
      if len(order) < _BATCH.value:
        order += list(rng.permutation(len(rows)))
      picked, order = order[: _BATCH.value], order[_BATCH.value :]
      batch = _pad([rows[i] for i in picked], width, pad)
      s0 = time.perf_counter()
      params, opt_state, loss = step(params, opt_state, *batch)
      loss = float(loss)
      record = {"step": k, "loss": loss, "seconds": time.perf_counter() - s0}
      log.write(json.dumps(record) + "\n")
      log.flush()
      print(
        f"step {k}: loss {loss:.4f} ({record['seconds']:.1f} s)", flush=True
      )
      if k == _STOP_AFTER.value and k < _STEPS.value:
        _save_state(out_dir, (params, opt_state, k, order, rng))
        print(f"stopped after step {k}; run again to go on", flush=True)
        return
      if k % _SAVE_EVERY.value == 0 and k < _STEPS.value:
        _save_state(out_dir, (params, opt_state, k, order, rng))
  models.save_hf(
    config, params, model_dir, tokenizer=tokenizer, dtype="float32"
  )
  if os.path.isfile(os.path.join(out_dir, _STATE)):  # the model is whole
    os.remove(os.path.join(out_dir, _STATE))
  meta = {
    "model": _MODEL.value,
    "task": _TASK.value,
    "tool": _TOOL.value,
    "tool_format": _FORMAT.value,
    "tool_prompt": _PROMPT.value,
    "demos": len(rows),
    "steps": _STEPS.value,
    "batch": _BATCH.value,
    "lr": _LR.value,
    "wall_s": time.perf_counter() - t0,
  }
  with open(os.path.join(out_dir, "summary.json"), "w") as f:
    json.dump(meta, f, indent=1)
  print(f"saved {model_dir} after {meta['wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
