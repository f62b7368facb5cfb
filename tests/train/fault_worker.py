"""A training process for tests/train/test_faults.py, to be killed.

  python tests/train/fault_worker.py '<json: algorithm + TrainConfig fields>' \
      [DIE_AT]

Trains (`model="tiny"` in the JSON: a tiny random model) on a task whose
reward (the share of 'e' in a completion) varies between samples, so every
step moves the parameters. Prints `[worker] step N` after each step (not in
pipelined or streaming mode, which run `Trainer.run`: its worker thread is
started there). With $RLJAX_TEST_WAIT_FOR set, waits after start-up (the
run directory locked) until that file exists.

DIE_AT=`point:step` makes the process SIGKILL itself (no cleanup, like
`kill -9`) at a point inside the checkpoint of `step` that an outside kill
cannot hit reliably:
  in_orbax: orbax has written the files but not committed (renamed) them;
  before_manifest: orbax committed the step, its checksum manifest is not yet
    written.
Kills at other points come from the test, with a real `kill -9`.

The tokenizer is loaded from $RLJAX_TEST_TOKENIZER_DIR when set (the same
SmolLM2 tokenizer, saved once as an HF directory: rebuilding it from the GGUF
takes ~12 s per process). With $RLJAX_TEST_STREAM_GATE set, a streaming
run's worker follows `stream_gate.GatedStream`'s deterministic schedule
(the variable is its `every`), so that two runs can be compared token for
token.
"""

import json
import os
import signal
import sys
import time

import numpy as np


def _die() -> None:
  sys.stdout.flush()
  os.kill(os.getpid(), signal.SIGKILL)


def main(argv) -> None:
  overrides = json.loads(argv[1])
  die_at = argv[2] if len(argv) > 2 else ""
  from absl import logging

  logging.set_verbosity(logging.WARNING)
  import orbax.checkpoint as ocp
  from rljax import data as data_lib
  from rljax.train import checkpoint as ckpt_lib
  from rljax.train import loop as loop_lib
  from rljax.models import pretrained
  from rljax.train import testing
  from rljax.train.config import apply_preset
  from rljax.train.tasks import Task

  class LetterTask(Task):
    def score(self, completions, examples, n):
      scores = np.array(
        [c.count("e") / max(len(c), 1) for c in completions], np.float32
      )
      return scores, {"e_share": scores}

  if die_at:
    point, step = die_at.split(":")
    step = int(step)
    if point == "in_orbax":
      finalize = ocp.CheckpointManager._finalize_checkpoint  # pylint: disable=protected-access

      def dying_finalize(self, s, *a, **k):
        if s == step:
          _die()
        return finalize(self, s, *a, **k)

      ocp.CheckpointManager._finalize_checkpoint = dying_finalize  # pylint: disable=protected-access
    elif point == "before_manifest":
      write_manifest = ckpt_lib.write_manifest

      def dying_manifest(step_dir):
        if os.path.basename(step_dir) == str(step):
          _die()
        write_manifest(step_dir)

      ckpt_lib.write_manifest = dying_manifest
    else:
      raise ValueError(f"unknown DIE_AT point {point!r}")

  tok_dir = os.environ.get("RLJAX_TEST_TOKENIZER_DIR")
  if tok_dir:
    from transformers import AutoTokenizer

    pretrained._TINY_TOKENIZER = AutoTokenizer.from_pretrained(tok_dir)  # pylint: disable=protected-access
  gate = os.environ.get("RLJAX_TEST_STREAM_GATE")
  if gate:
    from rljax.train import group_stream

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import stream_gate  # pylint: disable=g-import-not-at-top

    stream_gate.GatedStream.every = int(gate)
    group_stream.GroupStream = stream_gate.GatedStream
  cfg = apply_preset(overrides.pop("algorithm", "grpo"), **overrides)
  tokenizer = testing.tiny_tokenizer()
  examples = data_lib.generate_arithmetic(64, "easy", seed=cfg.run.seed)
  task = LetterTask(
    examples[8:],
    examples[:8],
    tokenizer,
    data_lib.ChatTemplate(tokenizer),
    cfg.rollout.prompts_per_step,
    cfg.run.seed,
    cfg.task.max_prompt_tokens,
    reward_workers=0,
  )
  trainer = loop_lib.Trainer(cfg, task=task, show_progress=False)
  print(
    f"[worker] pid {os.getpid()} starts at step {trainer.step_num}", flush=True
  )
  go = os.environ.get("RLJAX_TEST_WAIT_FOR")
  while go and not os.path.exists(go):  # holding the run directory's lock
    time.sleep(0.05)
  try:
    if cfg.run.pipelined or cfg.run.async_mode == "streaming":
      trainer.run()  # (its steps are not printed one by one)
    else:
      trainer.actor.sync(trainer.policy_params(), trainer.step_num)
      while trainer.step_num < cfg.run.steps:
        trainer.train_step()
        print(f"[worker] step {trainer.step_num}", flush=True)
  finally:
    trainer.close()


if __name__ == "__main__":
  main(sys.argv)
