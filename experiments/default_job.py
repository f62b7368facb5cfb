"""The default job's settings, defining no flags: `main.py` runs them, and
the benchmarks that time "the default job" (`bench_async.py`) start from
the same recipe, so a change to the job reaches both."""

# What the job trains with (see main.py's docstring for why TIS, UAQ 1.5).
RECIPE = {
  "algorithm": "grpo",
  "model.name": "smollm2-135m-instruct",
  "task.name": "arithmetic",
  "task.difficulty": "easy",
  "rollout.quant": "int8",
  "loss.correction": "tis",
  "rollout.uaq_scale": 1.5,
  "kl.coef": 0.0,
  "loss.aggregation": "token-mean",
  "rollout.prompts_per_step": 8,
  "rollout.group_size": 6,
  "rollout.max_new_tokens": 32,
  "rollout.temperature": 0.7,
  "update.micro_batches": 6,
  "update.logprob_chunk": 32,
  "optim.learning_rate": 1e-5,
}

# The whole run `python experiments/main.py` makes.
JOB = {
  **RECIPE,
  "run.steps": 20,
  "task.eval_size": 64,
  "run.checkpoint_every": 10,
  "run.run_dir": "runs/main",
  "run.resume": True,
}
