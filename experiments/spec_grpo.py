"""Speculative decoding inside training: a GRPO run on GSM8K prompts that
recur every few steps (epochs), with and without --rollout.speculative.

  python experiments/spec_grpo.py --steps=20 --prompts=16 \
      --prompts_per_step=4 --group_size=8 --max_new_tokens=256 \
      --out=docs/performance/spec_grpo.json

Both arms are `experiments/main.py` runs of the same recipe (SmolLM2-135M-
Instruct, GRPO, continuous batching, temperature 1, stop at EOS, the
first --prompts questions of GSM8K's train split as the whole training
set, so a prompt recurs every prompts / prompts_per_step steps), started
together so that they share the machine's load. Speculation never changes
a sample, so both arms train on the same tokens: every untimed metric of
a step must agree (printed as a check). Per step it prints the rollout's
tokens/s of each arm and their ratio, and the speculative arm's
acceptance, tokens a row per verify step, verify / plain decode steps and
drafts by source (the earlier responses' share grows from the second
epoch on).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

_HERE = os.path.dirname(os.path.abspath(__file__))
_GSM8K_TRAIN = os.path.join(
  _HERE, "..", "..", "shared", "data", "gsm8k", "train.jsonl"
)
_STEPS = flags.DEFINE_integer("steps", 20, "RL steps of each arm.")
_PROMPTS = flags.DEFINE_integer("prompts", 16, "Training prompts (recurring).")
_PER_STEP = flags.DEFINE_integer("prompts_per_step", 4, "Prompts a step.")
_GROUP = flags.DEFINE_integer("group_size", 8, "Samples a prompt.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256, "Response limit.")
_QUANT = flags.DEFINE_string("quant", "bf16", "rollout.quant of both arms.")
_RUN_DIR = flags.DEFINE_string(
  "run_dir", None, "Where the arms' runs go (default: a temporary folder)."
)
_OUT = flags.DEFINE_string("out", None, "Write the per-step rows as JSON.")
_SEQUENTIAL = flags.DEFINE_bool(
  "sequential", False, "Run the arms one after the other (not together)."
)
_TIMED = ("time_", "_per_s", "seconds", "spec_", "idle")


def _command(run_dir: str, data: str, speculative: str) -> list[str]:
  return [
    sys.executable,
    os.path.join(_HERE, "main.py"),
    "--model.name=smollm2-135m-instruct",
    "--task.name=gsm8k",
    f"--task.data_path={data}",
    "--task.eval_size=0",
    "--task.max_prompt_tokens=256",
    f"--rollout.quant={_QUANT.value}",
    "--rollout.batching=continuous",
    f"--rollout.speculative={speculative}",
    f"--rollout.prompts_per_step={_PER_STEP.value}",
    f"--rollout.group_size={_GROUP.value}",
    f"--rollout.max_new_tokens={_MAX_NEW.value}",
    "--rollout.temperature=1.0",
    # Micro-batches of 4 sequences (the default job's 6 divide its 48).
    f"--update.micro_batches={_PER_STEP.value * _GROUP.value // 4}",
    f"--run.steps={_STEPS.value}",
    f"--run.checkpoint_every={_STEPS.value}",
    "--run.export_hf=False",
    "--run.resume=False",
    f"--run.run_dir={run_dir}",
  ]


def _rows(run_dir: str) -> list[dict]:
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def main(argv):
  del argv
  root = _RUN_DIR.value or tempfile.mkdtemp(prefix="spec_grpo_")
  os.makedirs(root, exist_ok=True)
  data = os.path.join(root, "gsm8k_train_head.jsonl")
  with open(_GSM8K_TRAIN) as f, open(data, "w") as out:
    lines = [line for line in f if line.strip()][: _PROMPTS.value]
    out.writelines(lines)
  machine = machine_info()
  print(json.dumps({"machine": machine, "load": os.getloadavg()}), flush=True)
  arms = {"off": os.path.join(root, "off"), "suffix": os.path.join(root, "on")}
  logs, procs = {}, {}
  for arm, run_dir in arms.items():
    logs[arm] = open(os.path.join(root, f"{arm}.log"), "w")
    procs[arm] = subprocess.Popen(
      _command(run_dir, data, arm), stdout=logs[arm], stderr=subprocess.STDOUT
    )
    if _SEQUENTIAL.value:
      procs[arm].wait()
  for arm, proc in procs.items():
    if proc.wait() != 0:
      raise SystemExit(f"spec_grpo: the {arm} arm failed; see {logs[arm].name}")
    logs[arm].close()
  load = os.getloadavg()
  off, on = _rows(arms["off"]), _rows(arms["suffix"])
  table = []
  print(
    "| step | tok/s off | tok/s suffix | ratio | acceptance | tok/row-step "
    "| verify / plain steps | drafts self/sib/hist | same metrics |"
  )
  print("|---:|---:|---:|---:|---:|---:|---|---|---|")
  for a, b in zip(off, on):
    same = all(
      a[k] == b[k] for k in set(a) & set(b) if not any(t in k for t in _TIMED)
    )
    row = {
      "step": a["step"],
      "tokens_per_s_off": a["rollout_tokens_per_s"],
      "tokens_per_s_suffix": b["rollout_tokens_per_s"],
      "ratio": b["rollout_tokens_per_s"] / a["rollout_tokens_per_s"],
      "same_metrics": same,
      **{k: v for k, v in b.items() if k.startswith("spec_")},
    }
    table.append(row)
    shares = "/".join(
      f"{b.get(f'spec_share_{s}', 0):.2f}"
      for s in ("self", "sibling", "history")
    )
    print(
      f"| {row['step']} | {row['tokens_per_s_off']:.1f} | "
      f"{row['tokens_per_s_suffix']:.1f} | {row['ratio']:.2f} | "
      f"{b.get('spec_acceptance', 0):.2f} | "
      f"{b.get('spec_tokens_per_row_step', 0):.2f} | "
      f"{b.get('spec_verify_steps', 0):.0f} / "
      f"{b.get('spec_plain_steps', 0):.0f} | {shares} | {same} |"
    )
  total = lambda rows, key: sum(r[key] for r in rows)
  tokens = total(off, "rollout_tokens")
  ratio = (tokens / total(on, "time_rollout")) / (
    tokens / total(off, "time_rollout")
  )
  print(f"whole run: rollout tokens/s suffix / off = {ratio:.2f}x")
  print(json.dumps({"load_after": load}))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(
        {"machine": machine, "rows": table, "ratio": ratio, "load": load},
        f,
        indent=1,
      )


if __name__ == "__main__":
  app.run(main)
