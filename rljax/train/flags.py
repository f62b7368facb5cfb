"""absl flags that map one to one onto `TrainConfig` fields.

A field's flag is its dotted path: `--loss.eps_high=0.28`,
`--rollout.quant=none`, `--run.run_dir=runs/x` (absl takes dots in flag
names). Every experiment script calls `define_train_flags({...})` with its
defaults (dotted or nested keys) and `config_from_flags()`, which resolves
through `config.resolve`: TrainConfig's defaults, the algorithm preset, the
script's defaults (a script is one paper setup), [a JSON base], the flags
the user typed, [grid cells]. When the user picks another algorithm than
the script's, the script's defaults no longer override that preset's
fields. Every problem of the result is reported at once
(`config.validate`), before any model loads.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from absl import flags

from rljax.train import config as config_lib
from rljax.train.config import ALGORITHMS, TrainConfig
from rljax.train.config import help as help_lib

FLAGS = flags.FLAGS
# Script defaults per FlagValues (a test may define the flags on its own).
_SCRIPT_DEFAULTS: dict[int, dict[str, Any]] = {}


def define_train_flags(
  *layers: Mapping[str, Any],
  flag_values: flags.FlagValues = FLAGS,
  **script_defaults,
) -> None:
  """Defines one flag per TrainConfig field (dotted name, type and help).

  `layers` and keyword sections are the script's defaults, e.g.
  `define_train_flags({"algorithm": "dapo", "loss.eps_high": 0.28})`.
  """
  defaults: dict[str, Any] = {}
  for layer in (*layers, script_defaults):
    defaults.update(config_lib.flatten(layer))
  known = set(config_lib.field_names())
  unknown = sorted(set(defaults) - known)
  if unknown:
    raise ValueError(
      f"script defaults name {unknown}, which are not TrainConfig fields; "
      "expected dotted fields such as 'loss.eps_high'"
    )
  _SCRIPT_DEFAULTS[id(flag_values)] = defaults
  fv = dict(flag_values=flag_values)
  for name in config_lib.field_names():
    default = defaults.get(name, config_lib.field_default(name))
    ftype = config_lib.field_type(name)
    help_ = help_lib.flag_help(name)
    if name == "algorithm":
      flags.DEFINE_enum(name, default, ALGORITHMS, help_, **fv)
    elif ftype is bool:
      flags.DEFINE_bool(name, default, help_, **fv)
    elif ftype is int:
      flags.DEFINE_integer(name, default, help_, **fv)
    elif ftype is float:
      flags.DEFINE_float(name, default, help_, **fv)
    elif ftype == (float | None):
      flags.DEFINE_float(name, default, help_ + " (unset = None)", **fv)
    else:
      flags.DEFINE_string(name, default, help_, **fv)
  if flag_values is FLAGS:
    _list_sections_in_help()


def _list_sections_in_help() -> None:
  """`--help` shows the script's docstring and its own flags; the training
  flags are defined here, so it would not show them at all. The section
  list goes under the script's docstring (what absl prints first)."""
  script = sys.modules.get("__main__")
  if script is None or getattr(script, "_RLJAX_SECTIONS_LISTED", False):
    return
  doc = (script.__doc__ or "").rstrip()
  script.__doc__ = (doc + "\n\n" if doc else "") + help_lib.sections_help()
  script._RLJAX_SECTIONS_LISTED = True  # pylint: disable=protected-access


def script_defaults(flag_values: flags.FlagValues = FLAGS) -> dict[str, Any]:
  """The defaults the script passed to `define_train_flags` (dotted)."""
  return dict(_SCRIPT_DEFAULTS.get(id(flag_values), {}))


def typed_flags(flag_values: flags.FlagValues = FLAGS) -> dict[str, Any]:
  """The TrainConfig flags the user typed on the command line (dotted)."""
  return {
    name: flag_values[name].value
    for name in config_lib.field_names()
    if name in flag_values and flag_values[name].present
  }


def config_from_flags(
  base: Mapping[str, Any] | None = None,
  *cells: Mapping[str, Any],
  flag_values: flags.FlagValues = FLAGS,
) -> TrainConfig:
  """resolve(preset ← script defaults ← `base` ← typed flags ← `cells`)."""
  defaults = script_defaults(flag_values)
  preset = defaults.get("algorithm", flag_values["algorithm"].value)
  return config_lib.resolve(
    preset, defaults, dict(base or {}), typed_flags(flag_values), *cells
  )


# ------------------------------------------------------------- benchmarks
#
# A paper script evaluates its policy after training on the paper's
# benchmarks (Avg@k). Each benchmark is one `--eval_<label>` path flag; the
# data are not shipped with rljax, so the defaults point at ../shared/data
# and a missing file is skipped with a message.


def define_benchmark_flags(
  benchmarks: Mapping[str, tuple[str, str]],
  samples: int,
  temperature: float,
  top_p: float,
  paper: str,
  flag_values: flags.FlagValues = FLAGS,
) -> None:
  """Defines --eval_<label> (one per benchmark: label -> (dataset, path))
  and the shared --bench_* and --allow_train_on_eval flags."""
  fv = dict(flag_values=flag_values)
  for label, (dataset, path) in benchmarks.items():
    flags.DEFINE_string(
      f"eval_{label}",
      path,
      f"{dataset} file evaluated after training (Avg@--bench_samples); "
      "empty or missing: skipped.",
      **fv,
    )
  flags.DEFINE_integer(
    "bench_samples",
    samples,
    f"k of Avg@k on the benchmarks ({paper}); 0 skips the benchmarks.",
    **fv,
  )
  flags.DEFINE_integer(
    "bench_limit", 0, "First N problems of each benchmark (0 = all).", **fv
  )
  flags.DEFINE_float(
    "bench_temperature",
    temperature,
    "Sampling temperature of the benchmark evaluation.",
    **fv,
  )
  flags.DEFINE_float(
    "bench_top_p", top_p, "Top-p of the benchmark evaluation.", **fv
  )
  flags.DEFINE_bool(
    "allow_train_on_eval",
    False,
    "Train even when --task.data_path is one of the evaluated benchmark files "
    "(refused by default: the scores would be on training data).",
    **fv,
  )
  _BENCHMARKS[id(flag_values)] = dict(benchmarks)


_BENCHMARKS: dict[int, dict[str, tuple[str, str]]] = {}


def benchmarks_from_flags(flag_values: flags.FlagValues = FLAGS):
  """The `driver.BenchmarkPlan` of the --eval_*/--bench_* flags."""
  from rljax import evaluation  # no jax at import
  from rljax.train.driver import BenchmarkPlan

  specs = []
  for label, (dataset, _) in _BENCHMARKS.get(id(flag_values), {}).items():
    specs.append(
      evaluation.EvalSpec(
        dataset,
        flag_values[f"eval_{label}"].value,
        flag_values["bench_limit"].value,
        label,
      )
    )
  return BenchmarkPlan(
    specs=tuple(specs),
    samples=flag_values["bench_samples"].value,
    temperature=flag_values["bench_temperature"].value,
    top_p=flag_values["bench_top_p"].value,
    allow_train_on_eval=flag_values["allow_train_on_eval"].value,
  )
