"""QuRL Table 2 setting: DAPO on math, evaluated on AIME 2024 (Avg@k).

Paper defaults (DAPO recipe): clip-higher ε_low 0.2 / ε_high 0.28,
token-mean loss, dynamic sampling, overlong shaping (L_max 20480,
L_cache 4096; the dapo preset turns it on with L_max = max_new_tokens
and L_cache = L_max / 5), no KL, lr 1e-6, 16 samples per prompt,
temperature 1.0; AIME24 Avg@32 at temperature 1.0, top-p 0.7. CPU
overrides keep it small.

Training data: DAPO-Math-17k is not available offline. Download it, write
it as JSONL rows {"problem", "answer"}, and pass
  --task.name=deepscaler --task.data_path=/path/to/dapo_math_17k.jsonl
Without it the script trains on GSM8K train (../shared/data) as an
offline stand-in, which is not the paper's setting. Prompts longer than
--task.max_prompt_tokens are dropped (metric `prompts_filtered_long`); training
on an evaluated benchmark file is refused unless --allow_train_on_eval.
"""

from rljax import hostmem
from rljax.train import cli
from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

train_flags.define_train_flags(
  {
    "algorithm": "dapo",
    "task.name": "gsm8k",
    "task.data_path": "../shared/data/gsm8k/train.jsonl",
    "model.name": "smollm2-135m-instruct",
    "rollout.quant": "int8",
    "loss.correction": "acr",
    "rollout.uaq_scale": 1.5,
    "optim.learning_rate": 1e-6,
    "loss.eps_low": 0.2,
    "loss.eps_high": 0.28,
    "rollout.group_size": 8,
    "rollout.prompts_per_step": 4,
    "rollout.max_new_tokens": 256,
    "task.max_prompt_tokens": 384,
    "advantage.dynamic_sampling": True,
    "run.steps": 20,
    "task.eval_size": 30,
    "run.run_dir": "runs/dapo_math",
  }
)
train_flags.define_benchmark_flags(
  {"aime24": ("aime24", "../shared/data/aime24/test.jsonl")},
  samples=8,
  temperature=1.0,
  top_p=0.7,
  paper="the paper reports Avg@32; 8 keeps a CPU run short",
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
