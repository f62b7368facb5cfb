"""What a claim may say about the runs it compares.

Before a verdict is read off an interval, three questions are asked of the
run files themselves, never of the config's name:

  * What ran? `effective_config(run_dir)`: the run's `config.json`, flat, with
    `rollout.uaq_scale` replaced by the scale the trainer applied. An older
    trainer folded UAQ only into quantized rollouts while `config.json`
    recorded the field's value (1.5 by default) for every run; its runs are
    recognised by the absence of the ACR exposure metrics that the same
    change added to every update (`acr_grad_share`).
  * Do the two arms differ only where the claim says? `differing_fields`:
    a claim names the fields it compares (e.g. `loss.correction`); two arms
    that also differ in an unnamed field (a UAQ scale, a learning rate) are a
    confounded comparison, and `check_named` refuses it with the fields and
    both values.
  * Could the mechanism act? For a claim about ACR (one arm `acr`, the
    other `tis`): with `update.ppo_epochs × update.minibatches == 1` the
    only gradient is taken at π_prox = sg(π_θ), R ≡ 1, and ACR equals TIS
    for every C: "not tested". With several updates per rollout, ACR is
    "not exercised" when its logged gradient share (rljax.core.exposure) is
    below EXPOSURE_GATE; runs that did not log it cannot show exposure:
    "not attributable". A comparison of GPU runs is "not attributable"
    unless it exceeds the nondeterminism floor an A/A pair of the same
    machine measured (`same_update`): two arms that compute the same update
    (the same config, or TIS and ACR with R ≡ 1). A bit-identical pair
    (deterministic ops) measures no floor at all.
"""

from __future__ import annotations

import functools
import gzip
import os

import numpy as np

from rljax import instrument
from rljax.train import config as config_lib
from rljax.train.metrics import read_metrics
from rljax.train.rundir import RUN_CONTROL_FIELDS

from qurl_report_lib.studies import read_json

QUANTIZED = ("int8", "int8_wo", "fp8")
EXPOSURE_GATE = 1e-3
NOT_TESTED = "not tested (one update per rollout: R ≡ 1)"
NOT_EXERCISED = "not exercised"
NOT_ATTRIBUTABLE = "not attributable"

# Fields that never change what a run trains: the seed (paired by design),
# where it writes, how often it logs or saves. `run.steps` is not here: a
# different horizon is a different experiment.
_IGNORED = (set(RUN_CONTROL_FIELDS) - {"run.steps"}) | {"run.seed"}

# Metrics the exposure-aware trainer logs on every update.
_EXPOSURE_KEY = "acr_grad_share"

# Q6's calibration, pre-registered in experiments/configs/q6_acr_fair.json
# (`_comment`): over the first 30 steps of seed 0, fp32's clip_fraction_high
# in [0.2%, 2%] and each TIS arm's tis_truncated_fraction in [1%, 3%].
CALIBRATION_STEPS = 30
FP32_CLIP_HIGH = (0.002, 0.02)
TIS_TRUNCATED = (0.01, 0.03)


class ConfoundedClaimError(ValueError):
  """Two compared arms differ in a field the claim does not name."""


@functools.lru_cache(maxsize=None)
def _train_rows(run_dir: str) -> tuple[dict, ...]:
  # Cached: a claim, the A/A floor and the tables read the same runs.
  return tuple(r for r in read_metrics(run_dir) if "loss" in r)


@functools.lru_cache(maxsize=None)
def _effective_config(run_dir: str) -> tuple:
  return tuple(sorted(_effective(run_dir).items(), key=lambda kv: kv[0]))


def effective_config(run_dir: str) -> dict:
  """{dotted field: value} of what the run trained with (module docstring)."""
  return dict(_effective_config(run_dir))


def _effective(run_dir: str) -> dict:
  saved = read_json(os.path.join(run_dir, "config.json"), None)
  if saved is None:
    raise FileNotFoundError(f"{run_dir}: no config.json")
  # A field added after the run was written reads as its default.
  flat = {
    **config_lib.flatten(config_lib.TrainConfig()),
    **config_lib.flatten(saved),
  }
  logs_exposure = any(_EXPOSURE_KEY in r for r in _train_rows(run_dir))
  quant = flat.get("rollout.quant")
  scale = float(flat.get("rollout.uaq_scale", 1.0))
  if not logs_exposure and quant not in QUANTIZED:
    scale = 1.0  # the older trainer's rule
  flat["rollout.uaq_scale"] = scale
  return flat


def updates_per_rollout(cfg: dict) -> int:
  return int(cfg.get("update.ppo_epochs", 1)) * int(
    cfg.get("update.minibatches", 1)
  )


def differing_fields(a: dict, b: dict) -> dict[str, tuple]:
  """{field: (value in a, value in b)} over the fields that matter."""
  out = {}
  for key in sorted(set(a) | set(b)):
    if key in _IGNORED:
      continue
    if a.get(key) != b.get(key):
      out[key] = (a.get(key), b.get(key))
  return out


def _step0_records(run_dir: str) -> str | None:
  """The text of the run's held-out records at step 0, from the live
  `eval_step0.jsonl` or the archived `eval_step0.jsonl.gz`."""
  for name, opener in (
    ("eval_step0.jsonl", open),
    ("eval_step0.jsonl.gz", gzip.open),
  ):
    path = os.path.join(run_dir, name)
    if os.path.exists(path):
      with opener(path, "rt") as f:
        return f.read()
  return None


def same_start(run_a: str, run_b: str) -> bool:
  """True if both runs' held-out records before any update (per problem:
  uid, correct, score) are identical: the instrument was rebuilt at another
  path but starts as the same policy, as far as the run files can show."""
  a, b = _step0_records(run_a), _step0_records(run_b)
  return a is not None and a == b


# The pseudo-field two instrument runs differ in when one draws its
# training prompts in another order (rljax.instrument.parse_name): the
# perturbation of a perturbed A/A arm.
DATA_ORDER = "instrument.data_order"


def run_differences(run_a: str, run_b: str) -> dict[str, tuple]:
  """`differing_fields` of two runs' effective configs. Two instrument runs
  (`model.name` = `instrument:<dir>[#order=<k>]`) differ in DATA_ORDER when
  their orders differ, and in `model.name` only when their directories do
  and `same_start` does not hold."""
  diff = differing_fields(effective_config(run_a), effective_config(run_b))
  name = diff.get("model.name")
  if name and all(str(x).startswith("instrument:") for x in name):
    (dir_a, order_a), (dir_b, order_b) = map(instrument.parse_name, name)
    del diff["model.name"]
    if dir_a != dir_b and not same_start(run_a, run_b):
      diff["model.name"] = name
    if order_a != order_b:
      diff[DATA_ORDER] = (order_a, order_b)
  return diff


def perturbed_twins(run_a: str, run_b: str) -> bool:
  """True if two runs differ in their training data order alone: a
  perturbed A/A pair."""
  return set(run_differences(run_a, run_b)) == {DATA_ORDER}


def data_order(run_dir: str) -> int:
  """The run's training data order (0 unless a perturbed A/A arm)."""
  name = str(effective_config(run_dir).get("model.name", ""))
  return instrument.parse_name(name)[1] if name.startswith("instrument:") else 0


def check_named(
  claim: str, a_name: str, b_name: str, run_a: str, run_b: str, named
) -> None:
  """Raises ConfoundedClaimError if the runs of arms a, b differ in a field
  the claim does not name (`run_differences`)."""
  extra = {
    k: v for k, v in run_differences(run_a, run_b).items() if k not in named
  }
  if extra:
    shown = "; ".join(
      f"{k}: {a_name}={va!r}, {b_name}={vb!r}" for k, (va, vb) in extra.items()
    )
    raise ConfoundedClaimError(
      f"claim {claim!r} compares {a_name} ({run_a}) with {b_name} ({run_b}), "
      f"which also differ in {shown}; expected them to differ only in the "
      f"fields the claim names ({', '.join(sorted(named)) or 'none'}). Name "
      "the field in the claim (and its text), or compare arms that share it."
    )


def exposure(run_dir: str) -> dict:
  """ACR exposure of one run: the mean of each logged exposure metric over
  its updates (None when not logged), and the older metrics that show
  inertness where it was not (`ratio_mean` range, clip-high, ACR-active)."""
  rows = _train_rows(run_dir)

  def values(key):
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]

  def mean(key):
    vals = values(key)
    return float(np.mean(vals)) if vals else None

  ratio = values("ratio_mean")
  return {
    "grad_share": mean("acr_grad_share"),
    "would_change": mean("acr_would_change_fraction"),
    "active_given_eligible": mean("acr_active_given_eligible"),
    "acr_active": mean("acr_active_fraction"),
    "clip_high": mean("clip_fraction_high"),
    "ratio_range": (min(ratio), max(ratio)) if ratio else None,
  }


def acr_gate(runs: list[tuple[str, dict]]) -> tuple[str, str] | None:
  """(verdict, why) overriding the interval's verdict of an ACR-vs-TIS
  claim, or None if the runs could test ACR and exposed it.

  runs: (run_dir, effective config) of every run the claim compares.
  """
  if any(updates_per_rollout(cfg) == 1 for _, cfg in runs):
    shown = sorted({updates_per_rollout(c) for _, c in runs})
    return NOT_TESTED, (
      f"update.ppo_epochs × update.minibatches = {shown}: the only gradient "
      "is taken at π_prox = π_θ, so ACR is TIS for every C"
    )
  acr_runs = [d for d, cfg in runs if cfg.get("loss.correction") == "acr"]
  shares = [exposure(d)["grad_share"] for d in acr_runs]
  if any(s is None for s in shares):
    active = [exposure(d)["acr_active"] for d in acr_runs]
    active = [a for a in active if a is not None]
    seen = f"; ACR-active {np.mean(active):.1e} of tokens" if active else ""
    return NOT_ATTRIBUTABLE, (
      f"ACR's gradient share was not logged by these runs{seen}: the "
      f"exposure gate ({EXPOSURE_GATE:g}) cannot be checked"
    )
  share = float(np.mean(shares))
  if share < EXPOSURE_GATE:
    return f"{NOT_EXERCISED} (gradient share {share:.1e})", (
      f"ACR's gradient share {share:.1e} < {EXPOSURE_GATE:g}"
    )
  return None


def metric_rows(
  run_dir: str, key: str, last_step: int | None = None
) -> list[tuple[int, float]]:
  """(step, value) of `key` over the run's updates, steps 1..last_step."""
  return [
    (int(r["step"]), float(r[key]))
    for r in _train_rows(run_dir)
    if isinstance(r.get(key), (int, float))
    and r.get("step", 0) >= 1
    and (last_step is None or r["step"] <= last_step)
  ]


def _early_mean(run_dir: str, key: str) -> float | None:
  vals = [v for _, v in metric_rows(run_dir, key, CALIBRATION_STEPS)]
  return float(np.mean(vals)) if vals else None


def _inside(value, bounds) -> bool:
  return value is not None and bounds[0] <= value <= bounds[1]


def calibration(study: dict) -> dict:
  """Q6's pre-registered calibration recomputed from the run files, on seed
  0 (else the study's first seed): {"fp32": (clip_high, ok) or None, "tis":
  {arm: (truncated, ok, C)}} (A/A copies, `*_aa`, left out)."""
  out = {"fp32": None, "tis": {}}
  for name, by_seed in study["runs"].items():
    if not by_seed:
      continue
    run = by_seed[min(by_seed)]
    cfg = effective_config(run)
    if name == "fp32":
      v = _early_mean(run, "clip_fraction_high")
      out["fp32"] = (v, _inside(v, FP32_CLIP_HIGH))
    elif cfg.get("loss.correction") == "tis" and not name.endswith("_aa"):
      v = _early_mean(run, "tis_truncated_fraction")
      out["tis"][name] = (v, _inside(v, TIS_TRUNCATED), cfg.get("loss.tis_cap"))
  return out


def calibration_note(study: dict, *arms: str) -> str | None:
  """What makes C uncalibrated for a claim on `arms`: the TIS arms among
  them (or the TIS arm of an ACR arm's format: `int8_acr` -> `int8_tis`)
  that truncated outside the pre-registered range over their first steps;
  None if all were inside."""
  cal = calibration(study)["tis"]
  tis = {a if a.endswith("_tis") else a.replace("_acr", "_tis") for a in arms}
  bad = [(a, cal[a]) for a in sorted(tis) if a in cal and not cal[a][1]]
  if not bad:
    return None
  shown = ", ".join(
    f"`{a}` truncates {'–' if v is None else f'{v:.3f}'} (C = {c:g})"
    for a, (v, _, c) in bad
  )
  return (
    f"{shown} over the first {CALIBRATION_STEPS} steps; pre-registered "
    f"{TIS_TRUNCATED[0]:g}–{TIS_TRUNCATED[1]:g}"
  )


def same_update(run_a: str, run_b: str) -> bool:
  """True if two runs compute the same update by construction: identical
  configs, or TIS and ACR with one update per rollout (R ≡ 1)."""
  diff = run_differences(run_a, run_b)
  if not diff:
    return True
  if set(diff) != {"loss.correction"}:
    return False
  return set(diff["loss.correction"]) == {"tis", "acr"} and (
    updates_per_rollout(effective_config(run_a)) == 1
  )


def pick_cap(truncated: dict[float, float], target=TIS_TRUNCATED) -> float:
  """The registered rule for C (q9_acr_long_calibration.json): among the
  candidate caps {C: mean tis_truncated_fraction over the first steps},
  the one inside `target` nearest its middle, else the one nearest the
  middle overall (ties: the larger C, the gentler truncation)."""
  if not truncated:
    raise ValueError("pick_cap: no candidate caps")
  mid = (target[0] + target[1]) / 2.0
  inside = {c: v for c, v in truncated.items() if target[0] <= v <= target[1]}
  pool = inside or truncated
  return min(pool, key=lambda c: (abs(pool[c] - mid), -c))


def calibration_caps(study: dict) -> dict[float, float]:
  """{C: mean tis_truncated_fraction over the first CALIBRATION_STEPS
  steps} of every finished TIS run of a calibration study (one seed)."""
  out = {}
  for by_seed in study["runs"].values():
    for run in by_seed.values():
      cfg = effective_config(run)
      if cfg.get("loss.correction") != "tis":
        continue
      v = _early_mean(run, "tis_truncated_fraction")
      if v is not None:
        out[float(cfg["loss.tis_cap"])] = v
  return out
