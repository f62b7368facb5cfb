"""QuRL Table 3 setting: GRPO on DeepScaleR-style math, evaluated on
AIME24, MATH-500, AMC23, Minerva Math and OlympiadBench (Avg@k).

Paper defaults (DeepScaleR recipe): KL loss 1e-3 (k3), temperature 0.6,
8 samples per prompt, lr 1e-6, staged context lengths 8k → 16k → 24k
(`--rollout.max_new_tokens` per stage; run the stages as consecutive runs
with --run.resume and a larger --rollout.max_new_tokens); Avg@16 at temperature 0.6, top-p
0.95. CPU overrides keep it small.

Training data: DeepScaleR-Preview-Dataset (40k) is not available offline.
Download it as JSONL rows {"problem", "answer"} and pass
  --task.name=deepscaler --task.data_path=/path/to/deepscaler.jsonl
Without it the script trains on GSM8K train (../shared/data) as an
offline stand-in, which is not the paper's setting. OlympiadBench is not
in ../shared/data: give --eval_olympiadbench=FILE, else it is skipped with
a message. Prompts longer than --task.max_prompt_tokens are dropped (metric
`prompts_filtered_long`); training on an evaluated benchmark file is
refused unless --allow_train_on_eval.
"""

from rljax import hostmem
from rljax.train import cli
from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

train_flags.define_train_flags(
  {
    "algorithm": "grpo",
    "task.name": "gsm8k",
    "task.data_path": "../shared/data/gsm8k/train.jsonl",
    "model.name": "smollm2-135m-instruct",
    "rollout.quant": "int8",
    "loss.correction": "acr",
    "rollout.uaq_scale": 1.5,
    "kl.coef": 1e-3,
    "kl.estimator": "k3",
    "rollout.temperature": 0.6,
    "optim.learning_rate": 1e-6,
    "rollout.group_size": 8,
    "rollout.prompts_per_step": 4,
    "rollout.max_new_tokens": 256,
    "task.max_prompt_tokens": 384,
    "run.steps": 20,
    "task.eval_size": 30,
    "run.run_dir": "runs/grpo_deepscaler",
  }
)
train_flags.define_benchmark_flags(
  {
    "aime24": ("aime24", "../shared/data/aime24/test.jsonl"),
    "math500": ("math500", "../shared/data/math500/test.jsonl"),
    "amc23": ("amc23", "../shared/data/amc23/test.jsonl"),
    "minerva": ("minerva_math", "../shared/data/minerva_math/test.jsonl"),
    "olympiadbench": (
      "olympiadbench",
      "../shared/data/olympiadbench/test.jsonl",
    ),
  },
  samples=4,
  temperature=0.6,
  top_p=0.95,
  paper="the paper reports Avg@16; 4 keeps a CPU run short",
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
