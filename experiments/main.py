"""The default job: QuRL on a CPU in under 30 minutes.

SmolLM2-135M-Instruct (embedded GGUF) learns generated arithmetic with GRPO,
rollouts on an INT8 (W8A8) actor, Adaptive Clipping Range (QuRL Eq. 9) and
update-aware quantization (s = 1.5). Evaluates the held-out set before and
after, writes metrics.jsonl, TensorBoard logs, plots.png and an HF export
under --run_dir.

  python experiments/main.py                      # the embedded default
  python experiments/main.py --rollout_quant=none --run_dir=runs/fp  # reference
"""

from absl import app

from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

train_flags.define_train_flags(
  algorithm="grpo",
  model="smollm2-135m-instruct",
  task="arithmetic",
  task_difficulty="easy",
  rollout_quant="int8",
  correction="acr",
  uaq_scale=1.5,
  kl_coef=0.0,
  aggregation="token-mean",
  prompts_per_step=8,
  group_size=6,
  max_new_tokens=32,
  temperature=0.7,
  micro_batches=6,
  logprob_chunk=32,
  steps=20,
  learning_rate=1e-5,
  eval_size=64,
  checkpoint_every=10,
  run_dir="runs/main",
  resume=True,
)


def main(argv):
  del argv
  run_experiment(train_flags.config_from_flags())


if __name__ == "__main__":
  app.run(main)
