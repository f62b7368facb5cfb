"""absl flags that map one to one onto `TrainConfig` fields.

Every experiment script calls `define_train_flags(**script_defaults)` and
`config_from_flags()`. Precedence, lowest first: TrainConfig's defaults, the
algorithm preset, the script's defaults (a script is one paper setup), the
flags the user typed. When the user picks another algorithm than the
script's, the script's defaults no longer override that preset's fields.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any

from absl import flags

from rljax.train.config import ALGORITHMS, PRESETS, TrainConfig, apply_preset

FLAGS = flags.FLAGS
_SCRIPT_DEFAULTS: dict[str, Any] = {}


def _field_type(field: dataclasses.Field) -> Any:
  hints = typing.get_type_hints(TrainConfig)
  return hints[field.name]


def define_train_flags(**script_defaults) -> None:
  """Defines one flag per TrainConfig field (name, type and help)."""
  unknown = set(script_defaults) - {f.name for f in dataclasses.fields(TrainConfig)}
  if unknown:
    raise ValueError(f"unknown TrainConfig fields in script defaults: {sorted(unknown)}")
  _SCRIPT_DEFAULTS.clear()
  _SCRIPT_DEFAULTS.update(script_defaults)
  for field in dataclasses.fields(TrainConfig):
    default = script_defaults.get(field.name, field.default)
    ftype = _field_type(field)
    help_ = f"TrainConfig.{field.name}"
    if field.name == "algorithm":
      flags.DEFINE_enum(field.name, default, ALGORITHMS,
                        "Algorithm preset (sets several fields; explicit "
                        "flags override it).")
    elif ftype is bool:
      flags.DEFINE_bool(field.name, default, help_)
    elif ftype is int:
      flags.DEFINE_integer(field.name, default, help_)
    elif ftype is float:
      flags.DEFINE_float(field.name, default, help_)
    elif ftype == (float | None):
      flags.DEFINE_float(field.name, default, help_ + " (unset = None)")
    else:
      flags.DEFINE_string(field.name, default, help_)


def config_from_flags() -> TrainConfig:
  """TrainConfig = preset(algorithm) ← script defaults ← explicit flags."""
  algorithm = FLAGS.algorithm
  own_algorithm = _SCRIPT_DEFAULTS.get("algorithm", algorithm) == algorithm
  preset = {} if own_algorithm else PRESETS[algorithm]
  overrides = {}
  for field in dataclasses.fields(TrainConfig):
    name = field.name
    if name == "algorithm":
      continue
    if FLAGS[name].present:
      overrides[name] = FLAGS[name].value
    elif name in _SCRIPT_DEFAULTS and name not in preset:
      overrides[name] = _SCRIPT_DEFAULTS[name]
  return apply_preset(algorithm, **overrides)
