"""QuRL Table 3 setting: GRPO on DeepScaleR-style math.

Paper defaults (DeepScaleR recipe): KL loss 1e-3 (k3), temperature 0.6,
8 samples per prompt, lr 1e-6, staged context lengths 8k → 16k → 24k
(`--max_new_tokens` per stage; run the stages as consecutive runs with
--resume and a larger --max_new_tokens). CPU overrides keep it small.
"""
from absl import app

from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

train_flags.define_train_flags(
    algorithm="grpo", task="math500", data_path="../shared/data/math500/test.jsonl",
    model="smollm2-135m-instruct", rollout_quant="int8", correction="acr",
    uaq_scale=1.5, kl_coef=1e-3, kl_estimator="k3", temperature=0.6,
    learning_rate=1e-6, group_size=8, prompts_per_step=4, max_new_tokens=256,
    max_prompt_tokens=384, steps=20, eval_size=30,
    run_dir="runs/grpo_deepscaler")


def main(argv):
  del argv
  run_experiment(train_flags.config_from_flags())


if __name__ == "__main__":
  app.run(main)
