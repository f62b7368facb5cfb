"""The default job: a short QuRL-style GRPO run on a real model.

SmolLM2-135M-Instruct (embedded GGUF) learns generated arithmetic with GRPO,
rollouts on an INT8 (W8A8) actor corrected by truncated importance sampling
(TIS, C = 2) and update-aware quantization (s = 1.5), one update per
rollout. Evaluates the held-out set before and after, writes metrics.jsonl,
TensorBoard logs, plots.png and an HF export under --run.run_dir; the
summary prints ACR's exposure (rljax.core.exposure): how many tokens and how
much of the gradient ACR's widened bound would have changed.

Why TIS and not ACR here: with one update per rollout π_prox = π_θ at the
only gradient, R ≡ 1, and ACR (QuRL Eq. 9) equals TIS in value and gradient
(derivation in rljax/core/exposure.py), so a banner saying ACR would name a
mechanism that cannot act.
To exercise ACR, give it several updates per rollout (same tokens per step;
the proximal forward pass costs ~12-16 % more per step on the CPU):

  python experiments/main.py --loss.correction=acr --update.minibatches=2 \
      --update.micro_batches=3 --run.run_dir=runs/main_acr

  python experiments/main.py                      # the embedded default
  python experiments/main.py --rollout.quant=none --run.run_dir=runs/fp  # reference
  # (unquantized with the same UAQ fold: the control for quantization alone;
  # add --rollout.uaq_scale=1 for plain fp32)
"""

from rljax import hostmem
from rljax.train import cli
from rljax.train import flags as train_flags
from rljax.train.driver import run_experiment

import default_job  # experiments/, the script's own folder

train_flags.define_train_flags(default_job.JOB)


def main(argv):
  del argv
  run_experiment(train_flags.config_from_flags())


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
