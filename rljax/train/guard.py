"""The non-finite guard: nothing NaN or inf is applied, pushed or saved.

The update step itself keeps the old state when an update would produce a
non-finite value (`update.guarded_update`) and reports it as `applied = 0`;
here the trainer turns that report, after the step's one metrics fetch, into
a stop with a debug dump of the offending minibatch. Rollout weights and
checkpoints are checked with `require_finite` before they leave the process.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import jax
import numpy as np

from rljax.train import update as update_lib
from rljax.train.metrics import nonfinite_keys


class NonFiniteError(FloatingPointError):
  """A loss or gradient went NaN/inf; the step was not applied."""


@jax.jit
def _all_finite(tree) -> jax.Array:
  return update_lib.all_finite(tree)


def require_finite(tree, what: str) -> None:
  """Raises NonFiniteError if any float leaf of `tree` is NaN or inf: such
  weights must never reach an engine or a checkpoint."""
  if not bool(_all_finite(tree)):
    raise NonFiniteError(f"{what} hold NaN or inf values; not written")


def dump_debug(run_dir: str, step: int, batch: dict, metrics: dict) -> str:
  """Writes `<run_dir>/debug_step<step>/{batch.npz, metrics.json}`."""
  path = os.path.join(run_dir, f"debug_step{step}")
  os.makedirs(path, exist_ok=True)
  np.savez(
    os.path.join(path, "batch.npz"),
    **{k: np.asarray(v) for k, v in batch.items()},
  )
  with open(os.path.join(path, "metrics.json"), "w") as f:
    json.dump({k: float(v) for k, v in metrics.items()}, f, indent=1)
  return path


def check_updates(
  updates: Sequence[dict[str, float]],
  batch: dict,
  seeds: Sequence[int],
  minibatches: int,
  step: int,
  run_dir: str,
) -> None:
  """Raises NonFiniteError at the first update that was not applied.

  Args:
    updates: the host metrics of the step's updates, epoch-major
      (`update.run_epochs` of `batch`, `seeds`, `minibatches`).
    batch: the step's batch; the offending minibatch of it is dumped.
    seeds: the minibatch-order seed of each epoch.
    minibatches: minibatches per epoch.
    step: the training step (names the dump directory).
    run_dir: where the dump goes.

  A non-finite loss or gradient norm is named; finite ones can still give
  non-finite params or optimizer moments, which the update step's guard
  kept out (`applied` < 1), so the later minibatches ran on finite weights.
  """
  for i, m in enumerate(updates):
    bad = nonfinite_keys({k: m[k] for k in ("loss", "grad_norm") if k in m})
    if not bad and m.get("applied", 1.0) >= 1.0:
      continue
    what = (
      f"{', '.join(bad)} is not finite "
      f"({', '.join(f'{k}={m[k]}' for k in bad)})"
      if bad
      else "the updated parameters or optimizer state are not finite"
    )
    epoch, j = divmod(i, minibatches)
    mb = update_lib.minibatch(batch, minibatches, seeds[epoch], j)
    where = dump_debug(run_dir, step, mb, m)
    raise NonFiniteError(
      f"step {step}: {what} (epoch {epoch}, minibatch {j}); the update "
      f"was not applied; batch and metrics saved to {where}"
    )
