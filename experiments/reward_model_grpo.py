"""Example: GRPO on a learned Bradley–Terry reward model (`--reward=reward_model`).

The policy (SmolLM2-135M-Instruct) answers generated arithmetic; each answer
is scored by a reward model trained with experiments/train_reward_model.py,
in the trainer's process, batched, on its default device. Held-out accuracy
still uses the arithmetic verifier, so this run compares with verifier runs.

  python experiments/train_reward_model.py --out_dir=runs/reward_model
  python experiments/reward_model_grpo.py --reward_model_path=runs/reward_model

Writes metrics.jsonl (`reward_mean` = the RM score; `reward_reward_model` its
raw value) and plots.png under --run_dir; or plot several runs together:
  python experiments/plot_run.py --runs=runs/reward_model_grpo,runs/reward_vrcli
"""

from absl import app

from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

train_flags.define_train_flags(
  algorithm="grpo",
  model="smollm2-135m-instruct",
  task="arithmetic",
  task_difficulty="easy",
  reward="reward_model",
  reward_model_path="runs/reward_model",
  rollout_quant="none",
  kl_coef=0.0,
  prompts_per_step=4,
  group_size=4,
  max_new_tokens=32,
  temperature=0.7,
  learning_rate=1e-5,
  steps=5,
  eval_size=16,
  export_hf=False,
  run_dir="runs/reward_model_grpo",
)


def main(argv):
  del argv
  run_experiment(train_flags.config_from_flags())


if __name__ == "__main__":
  app.run(main)
