"""The default job: QuRL on a CPU in under 30 minutes.

SmolLM2-135M-Instruct (embedded GGUF) learns generated arithmetic with GRPO,
rollouts on an INT8 (W8A8) actor, Adaptive Clipping Range (QuRL Eq. 9) and
update-aware quantization (s = 1.5). Evaluates the held-out set before and
after, writes metrics.jsonl, TensorBoard logs, plots.png and an HF export
under --run_dir.

  python experiments/main.py                      # the embedded default
  python experiments/main.py --rollout.quant=none --run.run_dir=runs/fp  # reference
"""

from absl import app

from rljax import hostmem
from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

train_flags.define_train_flags(
  {
    "algorithm": "grpo",
    "model.name": "smollm2-135m-instruct",
    "task.name": "arithmetic",
    "task.difficulty": "easy",
    "rollout.quant": "int8",
    "loss.correction": "acr",
    "rollout.uaq_scale": 1.5,
    "kl.coef": 0.0,
    "loss.aggregation": "token-mean",
    "rollout.prompts_per_step": 8,
    "rollout.group_size": 6,
    "rollout.max_new_tokens": 32,
    "rollout.temperature": 0.7,
    "update.micro_batches": 6,
    "update.logprob_chunk": 32,
    "run.steps": 20,
    "optim.learning_rate": 1e-5,
    "task.eval_size": 64,
    "run.checkpoint_every": 10,
    "run.run_dir": "runs/main",
    "run.resume": True,
  }
)


def main(argv):
  del argv
  run_experiment(train_flags.config_from_flags())


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
