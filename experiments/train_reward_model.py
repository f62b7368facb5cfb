"""Trains a Bradley–Terry reward model on preference pairs and saves it.

The scalar head is the critic's value head on the decoder (read at the last
token of prompt + response), fit with −log σ(r_chosen − r_rejected)
(`rljax.rewards.reward_model`). Prints and plots held-out pair accuracy and
writes, under --out_dir:

  reward_model.json, orbax/, hf/   the model (`--reward.name=reward_model
                                    --reward.model_path=<out_dir>` loads it)
  rm_metrics.jsonl                 one row per step (train loss/accuracy,
                                    held-out eval_* on evaluated steps)
  rm_curve.png                     loss and held-out accuracy per step

Without --pairs the script makes a synthetic preference set with a known
rule: generated arithmetic problems (rendered like the trainer's
`--task=arithmetic` prompts), chosen = the correct answer in \\boxed{},
rejected = a wrong number or no answer. Held-out problems are never trained
on; accuracy is also reported per rejected kind.

  python experiments/train_reward_model.py                 # synthetic, SmolLM2
  python experiments/train_reward_model.py --pairs=prefs.jsonl --steps=500 \
      --model=/path/to/hf_dir --out_dir=runs/my_rm
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags

from rljax import hostmem

_MODEL = flags.DEFINE_string(
  "model",
  "smollm2-135m-instruct",
  "Backbone: 'tiny' (random, for tests), 'smollm2-135m-instruct' (the "
  "embedded GGUF), an HF dir or a .gguf file.",
)
_PAIRS = flags.DEFINE_string(
  "pairs",
  "",
  "JSONL of {prompt, chosen, rejected}; empty = the synthetic "
  "arithmetic preference set.",
)
_NUM_PAIRS = flags.DEFINE_integer(
  "num_pairs", 512, "Synthetic pairs to generate."
)
_DIFFICULTY = flags.DEFINE_string(
  "task_difficulty", "easy", "Arithmetic level of the synthetic pairs."
)
_HELD_OUT = flags.DEFINE_float(
  "held_out_fraction", 0.2, "Fraction of prompts held out for accuracy."
)
_STEPS = flags.DEFINE_integer("steps", 30, "Optimizer steps.")
_LR = flags.DEFINE_float("learning_rate", 3e-5, "Peak AdamW learning rate.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 4, "Linear warmup steps.")
_BATCH = flags.DEFINE_integer("batch_size", 4, "Pairs per step.")
_MAX_LEN = flags.DEFINE_integer(
  "max_len", 64, "Tokens kept of prompt + response."
)
_EVAL_EVERY = flags.DEFINE_integer(
  "eval_every", 15, "Held-out evaluation period (steps)."
)
_MAX_EVAL = flags.DEFINE_integer(
  "max_eval_pairs", 32, "Held-out pairs evaluated (a cap for CPU)."
)
_SEED = flags.DEFINE_integer("seed", 0, "Data split, init and batch order.")
_OUT = flags.DEFINE_string("out_dir", "runs/reward_model", "Output directory.")


def load_backbone(name: str, seed: int):
  """(config, params, tokenizer) of the backbone named by --model."""
  import jax  # pylint: disable=g-import-not-at-top
  from rljax import models  # pylint: disable=g-import-not-at-top

  if name == "tiny":
    tokenizer = models.load_tokenizer(models.default_gguf_path())
    config = models.tiny_config(vocab_size=len(tokenizer))
    return (
      config,
      models.init_params(config, jax.random.PRNGKey(seed)),
      tokenizer,
    )
  model = models.load_pretrained(name)
  if model.tokenizer is None:
    raise ValueError(
      f"--model={name!r} has no tokenizer files; a reward "
      "model scores text, so it needs one"
    )
  return model.config, model.params, model.tokenizer


def arithmetic_render(tokenizer):
  """The trainer's prompt for --task=arithmetic (`rljax.train.tasks`)."""
  from rljax import data as data_lib  # pylint: disable=g-import-not-at-top
  from rljax.train import tasks  # pylint: disable=g-import-not-at-top

  return data_lib.ChatTemplate(
    tokenizer,
    user_template=data_lib.BoxedTemplate(
      instruction=tasks.SHORT_ANSWER_INSTRUCTION
    ),
  )


def plot_history(history, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
  steps = [r["step"] for r in history if "loss" in r]
  ax1.plot(steps, [r["loss"] for r in history if "loss" in r], label="train")
  ev = [r for r in history if "eval_loss" in r]
  ax1.plot(
    [r["step"] for r in ev],
    [r["eval_loss"] for r in ev],
    "o-",
    label="held-out",
  )
  ax1.set(title="Bradley–Terry loss", xlabel="step")
  ax1.legend()
  ax2.plot(
    [r["step"] for r in ev],
    [r["eval_accuracy"] for r in ev],
    "o-",
    label="held-out",
  )
  kinds = sorted({k for r in ev for k in r if k.startswith("eval_accuracy_")})
  for k in kinds:
    ax2.plot(
      [r["step"] for r in ev if k in r],
      [r[k] for r in ev if k in r],
      "--",
      label=k[len("eval_accuracy_") :],
    )
  ax2.axhline(0.5, color="gray", lw=0.8)
  ax2.set(title="pair accuracy", xlabel="step", ylim=(0, 1.02))
  ax2.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv):
  del argv
  from absl import logging  # pylint: disable=g-import-not-at-top
  from rljax.rewards import reward_model as rm  # pylint: disable=g-import-not-at-top

  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes
  t0 = time.perf_counter()
  config, backbone, tokenizer = load_backbone(_MODEL.value, _SEED.value)
  if _PAIRS.value:
    items = [(p, "") for p in rm.load_preference_pairs(_PAIRS.value)]
  else:
    items = rm.synthetic_arithmetic_pairs(
      _NUM_PAIRS.value,
      arithmetic_render(tokenizer),
      seed=_SEED.value,
      difficulty=_DIFFICULTY.value,
    )
  train_items, held_items = rm.split_pairs(items, _HELD_OUT.value, _SEED.value)
  held_items = held_items[: _MAX_EVAL.value]
  if not held_items:
    raise app.UsageError(
      f"--held_out_fraction={_HELD_OUT.value} leaves no "
      "held-out pairs; accuracy needs some"
    )
  held = [p for p, _ in held_items]
  print(
    f"[rm] {len(train_items)} training / {len(held)} held-out pairs "
    f"({'synthetic arithmetic' if not _PAIRS.value else _PAIRS.value}), "
    f"model={_MODEL.value}",
    flush=True,
  )

  import jax  # pylint: disable=g-import-not-at-top

  params = rm.init_reward_model(
    config, backbone, jax.random.PRNGKey(_SEED.value + 1)
  )
  os.makedirs(_OUT.value, exist_ok=True)
  log_file = open(os.path.join(_OUT.value, "rm_metrics.jsonl"), "w")

  def log(row):
    log_file.write(json.dumps(row) + "\n")
    log_file.flush()
    if "eval_accuracy" in row:
      # Per rejected kind: which part of the rule the model has learned.
      kinds = " ".join(
        f"{k[14:]}={v:.3f}"
        for k, v in row.items()
        if k.startswith("eval_accuracy_")
      )
      print(
        f"[rm] step {row['step']}: held-out accuracy "
        f"{row['eval_accuracy']:.3f} loss {row['eval_loss']:.4f} {kinds}",
        flush=True,
      )
    elif row["step"] % 5 == 0:
      print(
        f"[rm] step {row['step']}: train loss {row['loss']:.4f} "
        f"acc {row['accuracy']:.3f} ({row['seconds']:.1f}s)",
        flush=True,
      )

  params, history = rm.train_reward_model(
    config,
    params,
    tokenizer,
    [p for p, _ in train_items],
    held,
    steps=_STEPS.value,
    batch_size=_BATCH.value,
    learning_rate=_LR.value,
    max_len=_MAX_LEN.value,
    seed=_SEED.value,
    eval_every=_EVAL_EVERY.value,
    warmup_steps=_WARMUP.value,
    log=log,
    held_out_kinds=[k for _, k in held_items],
  )
  log_file.close()
  final = {k: v for k, v in history[-1].items() if k.startswith("eval_")}
  out = rm.save_reward_model(
    _OUT.value,
    config,
    params,
    tokenizer,
    max_len=_MAX_LEN.value,
    metrics={k[5:]: v for k, v in final.items()},
  )
  plot_history(history, os.path.join(_OUT.value, "rm_curve.png"))
  summary = {
    "out_dir": out,
    "wall_s": time.perf_counter() - t0,
    "steps": _STEPS.value,
    "eval_accuracy_before": history[0].get("eval_accuracy"),
    **final,
  }
  with open(os.path.join(_OUT.value, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  print(
    f"[rm] saved {out} (orbax/ + hf/); held-out accuracy "
    f"{summary['eval_accuracy_before']:.3f} -> "
    f"{final.get('eval_accuracy', float('nan')):.3f}; "
    f"{summary['wall_s']:.0f} s",
    flush=True,
  )
  print(f"[rm] use it: --reward.name=reward_model --reward.model_path={out}")


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
