"""What a run needs from the machine, checked before anything loads or is
written: the model it names and the settings its shape bounds, its dataset
file, the problems a generated task can hold out, the devices of its mesh,
a vLLM it would start, the Python tool's sandbox it would run model-written
code in.

`config.validate` checks values against each other; these checks look at
the filesystem, the model's config (its header or config.json, never its
weights), the devices and the installed packages, so they run where a run
starts (`Trainer`, and `experiments/ablate.py` for every run of a study
before the first trains), reported like config problems (`ConfigError`:
the flag, its value, what was expected), all at once.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from rljax.train import config as config_lib
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


def model_shape_problems(cfg: TrainConfig) -> list[Problem]:
  """`config.model_problems` (the LoRA rank, the sequence against the
  context) against the model's config read without its weights
  (`models.config_only`); none where it cannot be read here (the loader
  reports that, and the trainer checks again once the model is loaded)."""
  from rljax.models import config_only  # pylint: disable=g-import-not-at-top

  model_config = config_only.read_config(cfg.model.name)
  if model_config is None:
    return []
  return config_lib.model_problems(cfg, model_config)


@functools.lru_cache(maxsize=16)
def _generated_problems(name: str, difficulty: str, eval_size: int, seed: int):
  """(distinct problems drawn for training, of them left once the held-out
  ones are removed) of a generated task, drawn as `tasks.build_task` and
  `tool_task.build_tool_task` draw them (same seeds and pool sizes)."""
  from rljax import data as data_lib  # pylint: disable=g-import-not-at-top
  from rljax.train import tasks  # pylint: disable=g-import-not-at-top

  if name in tasks.TOOL_TASKS:
    from rljax.train import tool_task  # pylint: disable=g-import-not-at-top

    held = tool_task.held_out_problems(eval_size, seed, difficulty, name)
    pool = tool_task.generate_problems(
      name, tool_task.TOOL_POOL, seed, difficulty
    )
  else:
    generate = (
      data_lib.generate_arithmetic
      if name == "arithmetic"
      else data_lib.generate_countdown
    )
    held = generate(eval_size, difficulty, seed=10_000 + seed)
    pool = generate(tasks.GENERATED_POOL, difficulty, seed=seed)
  drawn = {e.question for e in pool}
  return len(drawn), len(drawn - {e.question for e in held})


def heldout_problem(cfg: TrainConfig) -> str | None:
  """What is wrong with `task.eval_size` for a generated task, or None: a
  held-out split that takes every problem the task draws for training
  (held-out problems are removed from the training pool), found by drawing
  the problems (no tokenizer; a fraction of a second at the config's bound
  on eval_size) instead of after the model loads."""
  from rljax.train import tasks  # pylint: disable=g-import-not-at-top

  t = cfg.task
  if t.name not in tasks.GENERATED_TASKS or t.eval_size <= 0:
    return None
  try:
    drawn, left = _generated_problems(
      t.name, t.difficulty, t.eval_size, cfg.run.seed
    )
  except ValueError:  # a difficulty the config reports
    return None
  if left:
    return None
  return (
    f"fewer: task.name={t.name!r} at task.difficulty={t.difficulty!r} "
    f"draws {drawn} distinct problems, and this many held-out draws take "
    "every one of them, leaving no training problem (held-out problems are "
    "removed from the training pool; a harder difficulty draws from more)"
  )


def mesh_problems(cfg: TrainConfig) -> list[Problem]:
  """The mesh against the devices there are (`sharding.mesh_fit_problem`:
  the mesh.* flags, the device count, sizes that fit), then a minibatch
  against data*fsdp (it is split over both), as `placement.Placement`
  lays them out."""
  import jax  # pylint: disable=g-import-not-at-top

  from rljax.models import sharding  # pylint: disable=g-import-not-at-top
  from rljax.train import placement  # pylint: disable=g-import-not-at-top

  m = cfg.mesh
  sizes = (m.data, m.fsdp, m.tensor)
  if sum(s == -1 for s in sizes) > 1:
    return []  # the config's own problem, reported there
  found = sharding.mesh_fit_problem(
    sizes, jax.device_count(), use_all=jax.process_count() > 1
  )
  if found:
    axis, expected = found
    return [Problem(f"mesh.{axis}", getattr(m, axis), expected)]
  data, fsdp, _ = placement.resolve_mesh_sizes(m)
  r = cfg.rollout
  rows = r.prompts_per_step * r.group_size // max(cfg.update.minibatches, 1)
  if rows % (data * fsdp) == 0:
    return []
  axis = "fsdp" if fsdp > 1 and m.fsdp != -1 else "data"
  expected = (
    f"data*fsdp dividing a minibatch of {rows} sequences (rollout."
    f"prompts_per_step*group_size/update.minibatches), which is split over "
    f"both; here data*fsdp={data * fsdp} (--mesh.data={m.data} "
    f"--mesh.fsdp={m.fsdp})"
  )
  return [Problem(f"mesh.{axis}", getattr(m, axis), expected)]


def problems(cfg: TrainConfig, model: bool = True, data: bool = True):
  """Every problem of `cfg` on this machine (`model`/`data`: check the
  model and the dataset, False when the caller passes its own)."""
  out = []
  if model:
    why = model_problem(cfg.model.name)
    if why:
      out.append(Problem("model.name", cfg.model.name, why))
    else:
      out.extend(model_shape_problems(cfg))
  if data:
    why = data_problem(cfg)
    if why:
      out.append(Problem("task.data_path", cfg.task.data_path, why))
    why = heldout_problem(cfg)
    if why:
      out.append(Problem("task.eval_size", cfg.task.eval_size, why))
  out.extend(mesh_problems(cfg))
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
