"""QuRL Table 1 setting: PPO with a critic on GSM8K, evaluated on the GSM8K
test set.

Paper defaults (QuRL Table 1; VeRL PPO GSM8K example, Qwen2.5-0.5B/1.5B-
class models): learning rate 1e-5 (actor and critic), GAE λ = 0.95
(γ = 1), KL in reward 1e-3, 1024 prompts × 1 sample, 512 new tokens;
accuracy is greedy Avg@1 on GSM8K test. The CPU overrides below keep a run
small; pass the paper's values on a GPU:

  python experiments/ppo_gsm8k.py --model.name=/path/to/Qwen2.5-0.5B-Instruct \
      --rollout.prompts_per_step=256 --rollout.max_new_tokens=512 ...

Trains on ../shared/data/gsm8k/train.jsonl, evaluates
../shared/data/gsm8k/test.jsonl (--eval_gsm8k); training on the evaluated
file is refused unless --allow_train_on_eval. Prompts longer than
--task.max_prompt_tokens are dropped (metric `prompts_filtered_long`).
"""

from rljax import hostmem
from rljax.train import cli
from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

train_flags.define_train_flags(
  {
    "algorithm": "ppo",
    "task.name": "gsm8k",
    "task.data_path": "../shared/data/gsm8k/train.jsonl",
    "model.name": "smollm2-135m-instruct",
    "rollout.quant": "int8",
    "loss.correction": "acr",
    # QuRL Table 1: UAQ off (the learning rate is high enough).
    "rollout.uaq_scale": 1.0,
    "optim.learning_rate": 1e-5,
    "critic.learning_rate": 1e-5,
    "advantage.gae_lambda": 0.95,
    "critic.gae_lambda": 0.95,
    "kl.in_reward_coef": 1e-3,
    "rollout.group_size": 1,
    "rollout.prompts_per_step": 8,
    "rollout.max_new_tokens": 256,
    "task.max_prompt_tokens": 256,
    "update.ppo_epochs": 1,
    "update.minibatches": 2,
    "run.steps": 20,
    "task.eval_size": 64,
    "run.run_dir": "runs/ppo_gsm8k",
  }
)
train_flags.define_benchmark_flags(
  {"gsm8k": ("gsm8k", "../shared/data/gsm8k/test.jsonl")},
  samples=1,
  temperature=0.0,
  top_p=1.0,
  paper="greedy accuracy, Avg@1, as in QuRL Table 1",
)


def main(argv):
  del argv
  run_experiment(
    train_flags.config_from_flags(),
    benchmarks=train_flags.benchmarks_from_flags(),
  )


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
