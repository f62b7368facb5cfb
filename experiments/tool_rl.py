"""GRPO on multi-turn tool episodes: SmolLM2-135M-Instruct and a calculator.

The task (`--task.name=tool_arithmetic`, generated, no download) is long
arithmetic on 4-6 digit operands, which a 135M model gets wrong by heart;
each rollout row is an episode in which the model may call the tool
(`<calculator>48213*7391</calculator>`, answered by `<output>...</output>`)
before it answers; the verifier scores the final `\\boxed{}` answer. The
update trains on the model's ids only (`RolloutBatch.action_mask`); the
tool's output is context. See README, "Multi-turn and tools".

  python experiments/tool_rl.py                              # calculator, tags
  python experiments/tool_rl.py --task.tool=python \\
      --run.run_dir=runs/tool_rl_python                     # sandboxed Python
  python experiments/tool_rl.py --task.tool_choice=auto     # no forced call
  python experiments/tool_rl.py --task.tool_format=qwen     # <tool_call> JSON

The defaults are the setting in which GRPO gets a signal from this 135M
model: left to itself (`--task.tool_choice=auto`) it calls the calculator in
under 1 % of its episodes even at temperature 1.0 and never answers right,
so every group's rewards are equal and every advantage 0. With
`--task.tool_choice=required` the first turn opens with `<calculator>` (in
the prompt's ids): the model writes the expression and then its answer, and
the rewards of a group of 8 at temperature 1.0 differ (README, "Multi-turn
and tools"). `experiments/tool_eval.py` evaluates a run's checkpoint.

Budgets: `--rollout.max_new_tokens` bounds a whole episode (model and tool
ids), `--task.max_turn_tokens` one model turn, `--task.max_turns` the turns;
`--task.max_prompt_tokens` must hold the first prompt plus a whole episode.
Writes the trainer's files under --run.run_dir (metrics.jsonl, plots.png,
summary.json) and tool_plots.png: training accuracy (held-out at the first
and last step as points), tool-call rate, malformed-call rate and turns per
episode over steps.
"""

from __future__ import annotations

import os

from rljax import hostmem
from rljax.train import cli
from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

train_flags.define_train_flags(
  {
    "algorithm": "grpo",
    "model.name": "smollm2-135m-instruct",
    "task.name": "tool_arithmetic",
    "task.difficulty": "easy",  # one operation: one call answers it
    "task.tool": "calculator",
    "task.tool_format": "tags",
    "task.tool_prompt": "example",  # one worked call in the prompt
    "task.tool_choice": "required",  # the first turn opens a call
    "task.max_turns": 2,  # the call, then the answer
    "task.max_turn_tokens": 48,
    "task.max_prompt_tokens": 512,
    "task.eval_size": 16,
    "rollout.quant": "none",
    "kl.coef": 0.0,
    "loss.aggregation": "token-mean",
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 8,
    "rollout.max_new_tokens": 128,
    "rollout.temperature": 1.0,
    "update.micro_batches": 2,
    "optim.learning_rate": 2e-5,
    "run.steps": 30,
    "run.checkpoint_every": 10,
    "run.export_hf": False,
    "run.run_dir": "runs/tool_rl",
    "run.resume": True,
  }
)

# (panel title, [(metric, label)]): the tool run's own figure.
TOOL_PANELS = (
  (
    "accuracy",
    [("accuracy", "training episodes"), ("eval_accuracy", "held-out (greedy)")],
  ),
  ("tool-call rate", [("tool_call_rate", "episodes with a call")]),
  ("malformed-call rate", [("malformed_call_rate", "malformed / calls")]),
  ("turns per episode", [("turns_mean", "model turns")]),
)


def plot_tool_metrics(run_dir: str, out_path: str) -> None:
  """The four panels of TOOL_PANELS from `run_dir`'s metrics.jsonl."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  from rljax.train.metrics import read_metrics

  rows = read_metrics(run_dir)
  fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), layout="constrained")
  for ax, (title, keys) in zip(axes.flat, TOOL_PANELS):
    for key, label in keys:
      pts = [
        (r["step"], r[key])
        for r in rows
        if isinstance(r.get(key), (int, float))
      ]
      if pts:
        xs, ys = zip(*pts)
        # Evaluations are sparse points; a line would invent values.
        style = "o" if key.startswith("eval_") else "-o"
        ax.plot(xs, ys, style, markersize=3.5, label=label)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.savefig(out_path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  cfg = train_flags.config_from_flags()
  summary = run_experiment(cfg)
  path = os.path.join(cfg.run.run_dir, "tool_plots.png")
  plot_tool_metrics(cfg.run.run_dir, path)
  print(f"[rljax] tool metrics plot: {path} ({summary['steps']} steps)")


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
