"""Example: GRPO on a learned Bradley–Terry reward model (`--reward.name=reward_model`).

The policy (SmolLM2-135M-Instruct) answers generated arithmetic; each answer
is scored by a reward model trained with experiments/train_reward_model.py,
in the trainer's process, batched, on its default device. Held-out accuracy
still uses the arithmetic verifier, so this run compares with verifier runs.

  python experiments/train_reward_model.py --out_dir=runs/reward_model
  python experiments/reward_model_grpo.py --reward.model_path=runs/reward_model

Writes metrics.jsonl (`reward_mean` = the RM score; `reward_reward_model` its
raw value) and plots.png under --run.run_dir; or plot several runs together:
  python experiments/plot_run.py --runs=runs/reward_model_grpo,runs/reward_vrcli
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
    "reward.name": "reward_model",
    "reward.model_path": "runs/reward_model",
    "rollout.quant": "none",
    "kl.coef": 0.0,
    "rollout.prompts_per_step": 4,
    "rollout.group_size": 4,
    "rollout.max_new_tokens": 32,
    "rollout.temperature": 0.7,
    "optim.learning_rate": 1e-5,
    "run.steps": 5,
    "task.eval_size": 16,
    "run.export_hf": False,
    "run.run_dir": "runs/reward_model_grpo",
  }
)


def main(argv):
  del argv
  run_experiment(train_flags.config_from_flags())


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
