"""What a run needs from the machine, checked before anything loads or is
written: the model it names, its dataset file, a vLLM it would start, the
Python tool's sandbox it would run model-written code in.

`config.validate` checks values against each other; these checks look at
the filesystem and the installed packages, so they run where a run starts
(`Trainer`, and `experiments/ablate.py` for every run of a study before
the first trains), reported like config problems (`ConfigError`: the flag,
its value, what was expected), all at once.
"""

from __future__ import annotations

import importlib.util
import os

from rljax.train.config import ConfigError, Problem, TrainConfig, sections

DATA_SUFFIXES = (".jsonl", ".parquet")
# The names a run's model.name takes besides a path (models.load_named).
MODEL_NAMES = ("smollm2-135m-instruct", "tiny")


def model_problem(name: str) -> str | None:
  """What is wrong with `name` as a model to load, or None."""
  if name.lower() in MODEL_NAMES or name.startswith("instrument:"):
    return None
  if name.endswith(".gguf"):
    return None if os.path.isfile(name) else "an existing .gguf file"
  if os.path.isdir(name):
    if os.path.exists(os.path.join(name, "config.json")):
      return None
    return "an HF directory with a config.json"
  return (
    f"one of {MODEL_NAMES}, an HF directory or a .gguf file (no such path; "
    "the random-weight presets of rljax.models.config are for the "
    "benchmarks, not for training)"
  )


def data_problem(cfg: TrainConfig) -> str | None:
  """What is wrong with `task.data_path` for `task.name`, or None."""
  from rljax.train.tasks import GENERATED_TASKS  # pylint: disable=g-import-not-at-top

  path = cfg.task.data_path
  if cfg.task.name in GENERATED_TASKS:
    return None
  if not path:
    return f"the file of dataset {cfg.task.name!r} (.jsonl or .parquet)"
  if not os.path.isfile(path):
    return "an existing .jsonl or .parquet file (no such file)"
  if not path.endswith(DATA_SUFFIXES):
    return "a .jsonl or .parquet file"
  return None


def problems(cfg: TrainConfig, model: bool = True, data: bool = True):
  """Every problem of `cfg` on this machine (`model`/`data`: check the
  model and the dataset, False when the caller passes its own)."""
  out = []
  if model:
    why = model_problem(cfg.model.name)
    if why:
      out.append(Problem("model.name", cfg.model.name, why))
  if data:
    why = data_problem(cfg)
    if why:
      out.append(Problem("task.data_path", cfg.task.data_path, why))
  if cfg.task.python_sandbox in sections.PYTHON_SANDBOXES:
    # An unknown mode is the field rules' problem, reported once there.
    from rljax.train import tool_task  # pylint: disable=g-import-not-at-top

    out.extend(tool_task.sandbox_problems(cfg.task))
  if (
    cfg.rollout.engine == "vllm"
    and not cfg.rollout.vllm_urls
    and importlib.util.find_spec("vllm") is None
  ):
    out.append(
      Problem(
        "rollout.engine",
        "vllm",
        "an installed vLLM to start (`bash .ci/install` without "
        "--no-vllm), or --rollout.vllm_urls of running servers; or "
        "--rollout.engine=jax",
      )
    )
  return out


def check(cfg: TrainConfig, model: bool = True, data: bool = True) -> None:
  """Raises ConfigError with every `problems` of `cfg`."""
  found = problems(cfg, model=model, data=data)
  if found:
    raise ConfigError(found)
