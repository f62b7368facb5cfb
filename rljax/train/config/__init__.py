"""Training configuration: nested frozen sections and the algorithm presets.

A run is fully described by one `TrainConfig`, a composition of small frozen
sections. Each section groups the settings one part of the trainer reads:

  algorithm  the preset name (the only top-level value)
  model      PolicyModelConfig: which model is trained, and LoRA
  task       TaskConfig: prompts (generated task or dataset), held-out size
  reward     RewardConfig: verifier, or a learned / likelihood / judge reward
  rollout    RolloutConfig: engine, quantized actor, UAQ, sampling
  loss       core's `objectives.PolicyLossConfig` itself: the trainer passes
             `cfg.loss` straight to `rljax.core`
  kl         KLConfig: KL to the reference, as loss term or reward penalty
  advantage  AdvantageConfig: estimator, γ/λ, dynamic sampling, overlong
  critic     CriticConfig: PPO/VAPO value model (its λ, clip, rate)
  update     UpdateConfig: epochs, minibatches, entropy bonus, memory knobs
  optim      `optim.OptimConfig`: the policy's AdamW (the critic's is
             `cfg.optim_config(critic=True)`: same betas, its own rate)
  mesh       `models.sharding.MeshConfig`: the device mesh
  run        RunConfig: length, seed, run directory, checkpoints, logging

A setting is named by its dotted path, `loss.eps_high`; that is its flag
(`--loss.eps_high=0.28`, train/flags.py), its key in JSON configs and
`--grid` axes (nested objects or dotted keys), and its name in errors and in
`--run.allow_config_change`. Every algorithm of the seeds is a named preset
that only sets fields, so an ablation is a grid over field values.
`resolve` is the one way from presets, script defaults, JSON files, flags
and grid cells to a config (its docstring has the order), and `validate`
reports every bad value at once, before anything is loaded.

Run directories and JSON files written before the sections existed use flat
keys (`eps_high`); `LEGACY_KEYS` is the one mapping that reads them.

One module per concern (lowest first); import the names from here:

  sections      the section dataclasses, vocabularies, dotted field names
  keys          nested / dotted / legacy flat keys of a layer (`flatten`)
  problems      `Problem`, `ConfigError`: how every check reports
  field_rules   each field's own rule (type, finiteness, FIELD_RULES)
  cross_checks  the checks over several fields (CROSS_CHECKS)
  validation    `validate`, `check`, `model_problems`, `notes`
  train_config  `TrainConfig` and `build` (dotted values -> config)
  presets       PRESETS, `resolve`, `apply_preset`, `from_dict`
"""

# pylint: disable=unused-import
# ruff: noqa: F401
from rljax.train.config.keys import LEGACY_KEYS
from rljax.train.config.keys import flatten
from rljax.train.config.keys import legacy_name
from rljax.train.config.keys import lookup
from rljax.train.config.keys import to_flat
from rljax.train.config.keys import unflatten
from rljax.train.config.presets import PRESETS
from rljax.train.config.presets import apply_preset
from rljax.train.config.presets import from_dict
from rljax.train.config.presets import resolve
from rljax.train.config.sections import ADVANTAGE_ESTIMATORS
from rljax.train.config.sections import ALGORITHMS
from rljax.train.config.sections import ASYNC_MODES
from rljax.train.config.sections import ENGINES
from rljax.train.config.sections import REWARDS
from rljax.train.config.sections import ROLLOUT_QUANT
from rljax.train.config.sections import SECTIONS
from rljax.train.config.sections import AdvantageConfig
from rljax.train.config.sections import CriticConfig
from rljax.train.config.sections import KLConfig
from rljax.train.config.sections import MeshConfig
from rljax.train.config.sections import OptimConfig
from rljax.train.config.sections import PolicyLossConfig
from rljax.train.config.sections import PolicyModelConfig
from rljax.train.config.sections import RewardConfig
from rljax.train.config.sections import RolloutConfig
from rljax.train.config.sections import RunConfig
from rljax.train.config.sections import TaskConfig
from rljax.train.config.sections import UpdateConfig
from rljax.train.config.sections import field_default
from rljax.train.config.sections import field_names
from rljax.train.config.sections import field_type
from rljax.train.config.train_config import TrainConfig
from rljax.train.config.validation import CROSS_CHECKS
from rljax.train.config.validation import FIELD_RULES
from rljax.train.config.validation import ConfigError
from rljax.train.config.validation import Problem
from rljax.train.config.validation import check
from rljax.train.config.validation import model_problems
from rljax.train.config.validation import notes
from rljax.train.config.validation import validate
