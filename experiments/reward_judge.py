"""Example: GRPO on a rubric / LLM-judge reward (`--reward.name=judge`).

A judge model served by an OpenAI-compatible endpoint rates each answer
against the rubrics of experiments/data/judge_rubrics.txt on 0–10, mapped to
[0, 1] (`rljax.rewards.judge`). By default this script starts a vLLM(-CPU)
sidecar on 127.0.0.1 serving SmolLM2-135M-Instruct as the judge (exported
once to --judge_export_dir), trains, and stops it. With --serve_judge=false
it uses the server at --reward.judge_url (loopback unless
--reward.judge_allow_remote).

A 135M judge is a weak grader: the point is the plumbing (requests, score
parsing, counted failures, timeouts); use a larger judge for real runs:
  vllm serve Qwen/Qwen2.5-7B-Instruct --port 8001 &
  python experiments/reward_judge.py --serve_judge=false \
      --reward.judge_url=http://127.0.0.1:8001 --reward.judge_api=chat

Held-out accuracy keeps the arithmetic verifier.
"""

import os

from absl import app, flags

from rljax import hostmem
from rljax.train import flags as train_flags
from rljax.train import tasks
from rljax.train.driver import run_experiment

RUBRICS = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "data", "judge_rubrics.txt"
)

train_flags.define_train_flags(
  {
    "algorithm": "grpo",
    "model.name": "smollm2-135m-instruct",
    "task.name": "arithmetic",
    "task.difficulty": "easy",
    "reward.name": "judge",
    "reward.judge_rubrics": RUBRICS,
    "reward.judge_api": "chat",
    "reward.judge_timeout_s": 120.0,
    "rollout.quant": "none",
    "kl.coef": 0.0,
    "rollout.prompts_per_step": 4,
    "rollout.group_size": 4,
    "rollout.max_new_tokens": 32,
    "rollout.temperature": 0.7,
    "optim.learning_rate": 1e-5,
    "run.steps": 5,
    "task.eval_size": 16,
    "run.export_hf": False,
    "run.run_dir": "runs/reward_judge",
  }
)

_SERVE = flags.DEFINE_bool(
  "serve_judge",
  True,
  "Start a vLLM sidecar serving --judge_checkpoint "
  "for the run (else use --reward.judge_url).",
)
_JUDGE_CKPT = flags.DEFINE_string(
  "judge_checkpoint",
  "smollm2-135m-instruct",
  "The served judge: an HF dir, or 'smollm2-135m-instruct' (exported from "
  "the embedded GGUF to --judge_export_dir).",
)
_EXPORT_DIR = flags.DEFINE_string(
  "judge_export_dir",
  "runs/judge_smollm2_hf",
  "Where the embedded SmolLM2 is exported for vLLM (reused if present).",
)


def judge_checkpoint_dir() -> str:
  """An HF dir vLLM can serve: --judge_checkpoint, or SmolLM2 exported."""
  if os.path.isfile(os.path.join(_JUDGE_CKPT.value, "config.json")):
    return _JUDGE_CKPT.value
  out = _EXPORT_DIR.value
  if not os.path.isfile(os.path.join(out, "config.json")):
    from rljax import models  # pylint: disable=g-import-not-at-top

    model = models.load_pretrained(_JUDGE_CKPT.value)
    models.save_hf(
      model.config,
      model.params,
      out,
      tokenizer=model.tokenizer,
      dtype="bfloat16",
    )
  return out


def main(argv):
  del argv
  cfg = train_flags.config_from_flags()
  if not _SERVE.value:
    run_experiment(cfg)
    return
  from rljax.rollout.vllm_sidecar import VLLMSidecar, VLLMSidecarConfig  # pylint: disable=g-import-not-at-top

  sidecar_cfg = VLLMSidecarConfig(
    max_model_len=1024,
    served_model_name="judge",
    log_dir=os.path.join(cfg.run.run_dir, "judge_log"),
  )
  with VLLMSidecar(judge_checkpoint_dir(), sidecar_cfg) as engine:
    print(
      f"[judge] serving {engine.model_dir} at {engine.url} "
      f"(started in {engine.startup_seconds:.0f} s)",
      flush=True,
    )
    # The sidecar refuses callers without its run key; the judge reward
    # reads it from the environment (never from a flag: flags are logged).
    os.environ[tasks.JUDGE_API_KEY_ENV] = engine.api_key
    run_experiment(
      cfg.replace(
        {"reward.judge_url": engine.url, "reward.judge_model": "judge"}
      )
    )


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
