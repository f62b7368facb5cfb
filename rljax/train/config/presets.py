"""The algorithm presets, and `resolve`: the one way from layers of settings
(presets, script defaults, JSON files, flags, grid cells) to a config.

Every algorithm of the seeds is a named preset that only sets fields, so an
ablation is a grid over field values. The order of the layers is written
once, in `resolve`'s docstring.
"""

from __future__ import annotations

from typing import Any, Mapping

from rljax.train.config import keys
from rljax.train.config import sections
from rljax.train.config import validation
from rljax.train.config.train_config import TrainConfig, build

# Each preset names only what differs from TrainConfig's defaults; the user's
# explicit values are applied on top (see `resolve`).
PRESETS: dict[str, dict[str, Any]] = {
  # Williams 1992 with a group-mean baseline, no clipping.
  "reinforce": {
    "advantage.estimator": "drgrpo",
    "loss.surrogate": "reinforce",
    "loss.correction": "tis",
    "loss.aggregation": "seq-mean-token-mean",
  },
  # Schulman et al. 2017 + Ouyang et al. 2022: critic, GAE, value clipping,
  # KL to the reference as a per-token reward penalty.
  "ppo": {
    "advantage.estimator": "gae",
    "loss.surrogate": "ppo",
    "advantage.gamma": 1.0,
    "advantage.gae_lambda": 0.95,
    "critic.gae_lambda": 0.95,
    "kl.in_reward_coef": 1e-3,
    "kl.estimator": "k1",
    "critic.value_clip": 0.2,
    "loss.aggregation": "token-mean",
  },
  # Shao et al. 2024 (DeepSeekMath): group z-score, KL loss with k3.
  "grpo": {
    "advantage.estimator": "grpo",
    "loss.surrogate": "ppo",
    "kl.coef": 1e-3,
    "kl.estimator": "k3",
    "loss.aggregation": "seq-mean-token-mean",
  },
  # Liu et al. 2025 (Dr. GRPO): no std, no length normalisation.
  "drgrpo": {
    "advantage.estimator": "drgrpo",
    "loss.surrogate": "ppo",
    "loss.aggregation": "seq-mean-token-sum-norm",
  },
  # Ahmadian et al. 2024: leave-one-out baseline.
  "rloo": {
    "advantage.estimator": "rloo",
    "loss.surrogate": "ppo",
    "loss.aggregation": "token-mean",
  },
  # Hu et al. 2025: KL in the reward as reward-to-go (Eq. 8), whitening
  # over every valid token of the batch (Eq. 10); build_batch.py.
  "reinforce_pp": {
    "advantage.estimator": "reinforce_pp",
    "loss.surrogate": "ppo",
    "kl.in_reward_coef": 1e-3,
    "kl.estimator": "k1",
    "loss.aggregation": "token-mean",
  },
  # Yu et al. 2025 (DAPO): clip-higher, token-mean, dynamic sampling,
  # overlong shaping, no KL.
  "dapo": {
    "advantage.estimator": "grpo",
    "loss.surrogate": "ppo",
    "loss.eps_low": 0.2,
    "loss.eps_high": 0.28,
    "loss.aggregation": "token-mean",
    "advantage.dynamic_sampling": True,
    "kl.coef": 0.0,
    "advantage.overlong_shaping": True,
    "advantage.overlong_filter": False,
  },
  # MiniMax 2025 (CISPO): clipped, stop-gradient IS weight on A·logp.
  "cispo": {
    "advantage.estimator": "grpo",
    "loss.surrogate": "cispo",
    "loss.eps_low": 1.0,
    "loss.eps_high": 0.28,
    "loss.aggregation": "token-mean",
  },
  # Zheng et al. 2025 (GSPO): sequence-level geometric-mean ratio.
  "gspo": {
    "advantage.estimator": "grpo",
    "loss.surrogate": "gspo",
    "loss.eps_low": 3e-4,
    "loss.eps_high": 4e-4,
    "loss.aggregation": "seq-mean-token-mean",
    "loss.correction": "tis",
  },
  # Yue et al. 2025 (VAPO), on VC-PPO (Yuan et al. 2025): value
  # pretraining on the initial policy's rollouts, decoupled λ (critic 1),
  # length-adaptive policy λ (α = 0.05), clip-higher (0.2 / 0.28),
  # token-level loss, group sampling (rljax's rollout.group_size, 8 by
  # default), and the positive-example NLL (μ = 0.1). Warm-up length: the
  # paper trains the value model "until value loss and explained variance
  # are sufficiently low" and reports 50 pretraining steps. Not set here:
  # its learning rates (actor 1e-6, critic 2e-6, for a 32B model) and its
  # batch and group sizes (a GPU cluster's).
  "vapo": {
    "advantage.estimator": "gae",
    "loss.surrogate": "ppo",
    "critic.gae_lambda": 1.0,
    "critic.pretrain_steps": 50,
    "advantage.gae_lambda": 0.95,
    "advantage.vapo_alpha": 0.05,
    "loss.eps_low": 0.2,
    "loss.eps_high": 0.28,
    "loss.aggregation": "token-mean",
    "loss.positive_nll_coef": 0.1,
  },
  # Open-Reasoner-Zero (Hu et al. 2025): vanilla PPO with GAE λ = γ = 1
  # for actor and critic, group sampling (several responses per prompt),
  # no KL (neither loss nor reward), a critic initialised from the policy
  # with its own parameters (what `models.init_critic` always builds: a
  # copy of the policy's backbone plus a value head, nothing shared).
  "orz": {
    "advantage.estimator": "gae",
    "loss.surrogate": "ppo",
    "advantage.gamma": 1.0,
    "advantage.gae_lambda": 1.0,
    "critic.gae_lambda": 1.0,
    "kl.coef": 0.0,
    "kl.in_reward_coef": 0.0,
    "loss.aggregation": "token-mean",
  },
  # Olmo 3 RL-Zero recipe: token-level loss, TIS, clip-higher, no std
  # normalisation, zero-gradient (zero-variance group) filtering, no KL.
  "olmo3": {
    "advantage.estimator": "drgrpo",
    "loss.surrogate": "ppo",
    "loss.correction": "tis",
    "loss.eps_low": 0.2,
    "loss.eps_high": 0.28,
    "loss.aggregation": "token-mean",
    "advantage.dynamic_sampling": True,
    "kl.coef": 0.0,
  },
}


def resolve(preset: str, *overrides: Mapping[str, Any]) -> TrainConfig:
  """The TrainConfig of `preset` with layers of explicit values on top.

  A layer maps dotted fields ("loss.eps_high"), sections ({"loss":
  {"eps_high": ...}}) or legacy flat keys ("eps_high", `LEGACY_KEYS`) to
  values. Precedence, lowest first:

    1. TrainConfig's defaults;
    2. the preset `PRESETS[algorithm]`, where `algorithm` is the value of
       the last layer that sets `algorithm` (else `preset`);
    3. each layer of `overrides`, in order. The callers pass, in this order:
       the script's defaults (one paper setup), the shared "base" of a JSON
       ablation file, the flags the user typed, the grid cell or JSON run,
       and per-run control (run.seed, run.run_dir).

  A layer that names another algorithm than the resolved one was written
  for that algorithm: its values for the fields that define either
  algorithm (the keys of either preset) are dropped. So a grid cell
  `algorithm=dapo` over a GRPO script or base gets DAPO's dynamic sampling,
  ε_high and KL, and `--algorithm=grpo` on the DAPO script does not keep
  DAPO's dynamic sampling under a GRPO label. Its other values (sizes,
  model, data), and every value of a layer that names no algorithm (typed
  flags without --algorithm, a grid cell over other fields), apply as given.

  Raises `ConfigError` listing every unknown field or bad value.
  """
  layers = [keys.align_async_mode(keys.flatten(layer)) for layer in overrides]
  known = set(sections.field_names())
  unknown = [
    validation.Problem(
      k, v, "a TrainConfig field (section.field, e.g. loss.eps_high)"
    )
    for layer in layers
    for k, v in layer.items()
    if k not in known
  ]
  if unknown:
    raise validation.ConfigError(unknown)
  algorithm = preset
  for layer in layers:
    algorithm = layer.get("algorithm", algorithm)
  if algorithm not in PRESETS:
    raise validation.ConfigError(
      [
        validation.Problem(
          "algorithm", algorithm, f"one of {sections.ALGORITHMS}"
        )
      ]
    )
  values = dict(PRESETS[algorithm])
  for layer in layers:
    written_for = layer.get("algorithm", algorithm)
    if written_for not in PRESETS:
      continue  # the final algorithm is valid; this layer's name is moot
    defining = set(PRESETS[algorithm]) | set(PRESETS[written_for])
    values.update(
      {
        k: v
        for k, v in layer.items()
        if written_for == algorithm or k not in defining
      }
    )
  values["algorithm"] = algorithm
  return build(values)


def apply_preset(
  algorithm: str, *layers: Mapping[str, Any], **overrides
) -> TrainConfig:
  """`TrainConfig` of a named algorithm, with explicit overrides on top
  (layers of dotted/nested keys, then keyword sections or fields)."""
  return resolve(algorithm, *layers, overrides)


def from_dict(saved: Mapping[str, Any], source: str = "") -> TrainConfig:
  """The TrainConfig recorded in a run directory (config.json, checkpoint
  metadata): nested, or flat as written by an older rljax. Fields it does
  not name take their defaults, as when it was written (no preset); keys
  this rljax no longer knows are ignored."""
  flat = keys.flatten(saved, source)
  known = set(sections.field_names())
  return build({k: v for k, v in flat.items() if k in known})
