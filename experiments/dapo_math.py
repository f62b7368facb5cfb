"""QuRL Table 2 setting: DAPO on math, evaluated on AIME 2024.

Paper defaults (DAPO recipe): clip-higher ε_low 0.2 / ε_high 0.28,
token-mean loss, dynamic sampling, overlong shaping (L_max 20480,
L_cache 4096; the dapo preset turns it on with L_max = max_new_tokens
and L_cache = L_max / 5), no KL, lr 1e-6, 16 samples per prompt, temperature 1.0.
CPU overrides keep it small; on a GPU pass the paper's sizes and a
DAPO-Math-17k style file with --data_path.
"""
from absl import app

from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

train_flags.define_train_flags(
    algorithm="dapo", task="math500", data_path="../shared/data/math500/test.jsonl",
    model="smollm2-135m-instruct", rollout_quant="int8", correction="acr",
    uaq_scale=1.5, learning_rate=1e-6, eps_low=0.2, eps_high=0.28,
    group_size=8, prompts_per_step=4, max_new_tokens=256, max_prompt_tokens=384,
    dynamic_sampling=True,
    steps=20, eval_size=30, run_dir="runs/dapo_math")


def main(argv):
  del argv
  run_experiment(train_flags.config_from_flags())


if __name__ == "__main__":
  app.run(main)
