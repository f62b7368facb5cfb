"""Example: GRPO on the VR-CLI likelihood-improvement reward (`--reward.name=vrcli`).

Gurung & Lapata 2025: the policy writes reasoning a for a prompt x, and a
frozen reference model (here the initial policy) rewards it by how much it
makes the gold continuation y more likely: [1 − PPL(y | x, a) / PPL(y | x)]
× 100 (`rljax.rewards.likelihood`). No verifier is needed, only gold text.

The data is experiments/data/vrcli_word_problems.jsonl: 16 word problems,
each with a gold one-sentence solution as y. It is read with the `math500`
field map, which takes {"problem", "answer"} verbatim (any such file works;
y is the "answer" text). Held-out accuracy is off (--task.eval_size=0): the math
verifier cannot grade a sentence.

  python experiments/reward_vrcli.py
  python experiments/reward_vrcli.py --task.data_path=my_pairs.jsonl \
      --reward.vrcli_reference=/path/to/frozen_hf_dir
"""

import os

from absl import app

from rljax import hostmem
from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

DATA = os.path.join(
  os.path.dirname(os.path.abspath(__file__)),
  "data",
  "vrcli_word_problems.jsonl",
)

train_flags.define_train_flags(
  {
    "algorithm": "grpo",
    "model.name": "smollm2-135m-instruct",
    "task.name": "math500",
    "task.data_path": DATA,
    "reward.name": "vrcli",
    "rollout.quant": "none",
    "kl.coef": 0.0,
    "rollout.prompts_per_step": 4,
    "rollout.group_size": 4,
    "rollout.max_new_tokens": 32,
    "rollout.temperature": 0.7,
    "task.max_prompt_tokens": 256,
    "optim.learning_rate": 1e-5,
    "run.steps": 5,
    "task.eval_size": 0,
    "run.export_hf": False,
    "run.run_dir": "runs/reward_vrcli",
  }
)


def main(argv):
  del argv
  run_experiment(train_flags.config_from_flags())


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
