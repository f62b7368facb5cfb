"""The long-horizon instrument: ≥ 1,000 quantized-rollout RL steps on a CPU.

Phase 1 pre-trains a small decoder from scratch (`rljax.instrument`: a
character tokenizer, a Llama-architecture model of ~1M parameters) by
supervised fine-tuning on generated arithmetic until its held-out greedy
accuracy reaches --sft_target (partly competent, so RL has headroom). Phase 2
runs an RL study of that policy through the real Trainer, with the same
config files, seeds, resumability, table and flags as experiments/ablate.py
(this script imports it): every run's `model` is `instrument:<dir>`.

  python experiments/long_horizon.py \
      --configs=experiments/configs/q4_long_horizon.json \
      --out_dir=runs/q4_long_horizon

Both phases resume: run the same command again after a kill. Outputs:
<instrument_dir>/{instrument.json, params.npz}, and <out_dir> as ablate.py
writes it (a run directory per config × seed, table, progress, CPU log).
See docs/long_horizon.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ablate  # noqa: E402  (defines the trainer and study flags)

from rljax import hostmem
from rljax.train import config as config_lib  # noqa: E402

_DIR = flags.DEFINE_string(
  "instrument_dir",
  "runs/instrument",
  "Where the pre-trained instrument is (or is written).",
)
_SFT_DIFFICULTY = flags.DEFINE_string(
  "sft_difficulty",
  "",
  "Arithmetic difficulty of the SFT data ('' = the study's task_difficulty).",
)
_SFT_STEPS = flags.DEFINE_integer("sft_steps", 4000, "Most SFT steps.")
_SFT_TARGET = flags.DEFINE_float(
  "sft_target", 0.3, "Stop SFT once held-out greedy accuracy reaches this."
)
_SFT_LR = flags.DEFINE_float("sft_learning_rate", 1e-3, "SFT peak Adam rate.")
_SFT_BATCH = flags.DEFINE_integer(
  "sft_batch_size", 64, "SFT problems per step."
)
_SFT_EVAL_EVERY = flags.DEFINE_integer(
  "sft_eval_every", 100, "SFT steps between accuracy checks."
)
_HIDDEN = flags.DEFINE_integer("hidden_size", 128, "Instrument width.")
_LAYERS = flags.DEFINE_integer("num_layers", 4, "Instrument depth.")
_SFT_ONLY = flags.DEFINE_bool("sft_only", False, "Stop after phase 1.")


def instrument_configs(difficulty: str):
  from rljax import instrument

  shape = instrument.InstrumentConfig(
    hidden_size=_HIDDEN.value,
    num_layers=_LAYERS.value,
    num_heads=max(1, _HIDDEN.value // 32),
    num_kv_heads=max(1, _HIDDEN.value // 64),
    intermediate_size=4 * _HIDDEN.value,
  )
  sft = instrument.SFTConfig(
    difficulty=difficulty,
    steps=_SFT_STEPS.value,
    batch_size=_SFT_BATCH.value,
    learning_rate=_SFT_LR.value,
    eval_every=_SFT_EVAL_EVERY.value,
    target_accuracy=_SFT_TARGET.value,
  )
  return shape, sft


def pretrain(shared: dict) -> dict:
  """Phase 1: the instrument of --instrument_dir, SFT'd (resuming) if it is
  not there yet; `shared` is a config file's base settings (its difficulty
  and held-out size). Returns the instrument's record. Also used by
  experiments/qurl_replay.py."""
  from rljax import instrument

  difficulty = (
    _SFT_DIFFICULTY.value
    or config_lib.lookup(shared, "task.difficulty")
    or flags.FLAGS["task.difficulty"].value
  )
  shape, sft = instrument_configs(difficulty)
  record_path = os.path.join(_DIR.value, instrument.MODEL_FILE)
  if os.path.exists(record_path):
    with open(record_path) as f:
      record = json.load(f)
    if record.get("done") and record["shape"] != dataclasses.asdict(shape):
      raise app.UsageError(
        f"{_DIR.value} holds an instrument of shape {record['shape']}, not "
        f"{dataclasses.asdict(shape)}; pick another --instrument_dir"
      )
  eval_size = int(
    config_lib.lookup(
      shared, "task.eval_size", flags.FLAGS["task.eval_size"].value
    )
    or 256
  )
  record = instrument.train_sft(
    _DIR.value, shape, sft, rl_eval_size=eval_size, progress=True
  )
  print(
    f"[long_horizon] instrument: {record['parameters']:,} parameters, "
    f"SFT {record['steps']} steps, held-out greedy accuracy "
    f"{record['accuracy']:.3f} ({record['sft_seconds']:.0f} s)",
    flush=True,
  )
  return record


# A run's `model.name` of `instrument#order=<k>` in a config file: this
# study's instrument with its training prompts in data order k (a perturbed
# A/A arm, rljax.instrument.parse_name); the directory is --instrument_dir.
PLACEHOLDER = "instrument#"


def with_instrument(run: dict, instrument_dir: str) -> dict:
  """`run` with a PLACEHOLDER model name (nested or dotted) made concrete:
  `instrument:<instrument_dir>#order=<k>`."""
  nested = run.get("model") if isinstance(run.get("model"), dict) else {}
  name = run.get("model.name", nested.get("name"))
  if not (isinstance(name, str) and name.startswith(PLACEHOLDER)):
    return run
  concrete = f"instrument:{instrument_dir}#{name[len(PLACEHOLDER) :]}"
  from rljax import instrument

  instrument.parse_name(concrete)  # a bad order fails before any run
  out = dict(run)
  if "model.name" in run:
    out["model.name"] = concrete
  else:
    out["model"] = {**nested, "name": concrete}
  return out


def main(argv):
  del argv
  from rljax import distributed

  distributed.initialize_from_flags()  # before anything touches a device

  runs = ablate.grid_runs(ablate._GRID.value)
  shared, seeds = {}, ablate._SEEDS.value
  if ablate._CONFIGS.value:
    shared, listed, file_seeds = ablate.load_config_file(ablate._CONFIGS.value)
    runs += listed
    if file_seeds is not None and not flags.FLAGS["seeds"].present:
      seeds = [str(s) for s in file_seeds]
  pretrain(shared)
  if _SFT_ONLY.value:
    return
  if not runs:
    raise app.UsageError("give --grid and/or --configs for the RL study")
  shared = dict(shared, model=f"instrument:{_DIR.value}")
  runs = [with_instrument(run, _DIR.value) for run in runs]
  # The QuRL instrument studies run float32 end to end, whatever the CPU:
  # their "fp32" arms mean it, and every archived run was computed so
  # (`--model.compute_dtype` still overrides it).
  shared.setdefault("model.compute_dtype", "float32")
  ablate.run_study(runs, shared, seeds, ablate._OUT_DIR.value)


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
