"""Times each phase of the trainer's weight sync, as `train.actor.Actor` runs it.

  python experiments/bench_sync.py                       # SmolLM2-135M, INT8
  python experiments/bench_sync.py --quant=fp8 --syncs=5 --out=sync.json

One sync of a QuRL run is, in order (`Actor.prepare`, then `Actor.push`):

  quantize     quant.prepare_rollout_weights: Q(θ) in fresh buffers
  diagnostics  quant.SyncDiagnostics: QuRL Eq. 13-14 and the share of codes
               that moved since the last sync (skipped for full precision)
  finite       guard.require_finite: no NaN/inf reaches the engine
  push         engine.update_weights (the JAX sampler: a device copy)

The diagnostics keep a copy of θ and of the codes for the next sync; that
copy is dispatched asynchronously, so its time shows up in the phase after
it ("finite"), as it does in training. Read diagnostics + finite together.

θ moves between syncs by a small random step (relative size --step_size, of
the order of one Adam step at lr 1e-5), so the diagnostics see what they see
in training. The first sync (compiles) is reported apart; the table holds the
median of the others. Prints the machine (CPU model and its int8/bf16 flags)
and the jax version.
"""

from __future__ import annotations

import json
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp

from rljax import hostmem
from rljax import models
from rljax import quant
from rljax.quant.cpu import host_cpu
from rljax.rollout import factory as rollout_factory
from rljax.train import guard

_MODEL = flags.DEFINE_string(
  "model", "smollm2-135m-instruct", "load_named model name or preset."
)
_QUANT = flags.DEFINE_enum(
  "quant",
  "int8",
  list(quant.ROLLOUT_MODES),
  "Rollout weight format (rollout.quant).",
)
_UAQ = flags.DEFINE_float(
  "uaq_scale", 1.5, "UAQ fold before quantizing (1.0: none), as the trainer."
)
_SYNCS = flags.DEFINE_integer("syncs", 6, "Syncs, the first one included.")
_STEP = flags.DEFINE_float(
  "step_size", 1e-5, "Relative size of θ's random move between syncs."
)
_OUT = flags.DEFINE_string("out", "", "Write the results as JSON here.")

PHASES = ("quantize", "diagnostics", "finite", "push")


@jax.jit
def _moved(params, key, size):
  """θ + size·|θ|·ε, ε ~ N(0, 1) per leaf: a stand-in for one update."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(key, len(leaves))
  return jax.tree.unflatten(
    treedef,
    [
      w + size * jnp.abs(w) * jax.random.normal(k, w.shape, w.dtype)
      for w, k in zip(leaves, keys)
    ],
  )


def _timed(fn, *args):
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - t0


def main(argv):
  del argv
  cpu = host_cpu()
  print(
    f"machine: {cpu.summary()} (flags {' '.join(cpu.flags)}); "
    f"jax {jax.__version__}; devices {jax.devices()}; huge pages "
    f"{hostmem.huge_pages_state()}",
    flush=True,
  )
  model = models.load_named(_MODEL.value, 0)
  config, params = model.config, model.params
  quantized = quant.is_quantized(_QUANT.value)
  if quantized and _UAQ.value != 1.0:
    params = quant.fold_uaq(config, params, scale=_UAQ.value)
  engine = rollout_factory.make_engine(
    "jax",
    config,
    None,
    quant=_QUANT.value,
    max_prompt_len=128,
    max_new_tokens=32,
    pad_id=0,
  )
  diagnostics = quant.SyncDiagnostics() if quantized else None
  rows = []
  key = jax.random.key(0)
  for i in range(_SYNCS.value):
    key, sub = jax.random.split(key)
    params = jax.block_until_ready(_moved(params, sub, _STEP.value))
    row = {}
    rparams, row["quantize"] = _timed(
      quant.prepare_rollout_weights, config, params, _QUANT.value
    )
    diag = {}
    if diagnostics is not None:
      diag, row["diagnostics"] = _timed(diagnostics, params, rparams)
    else:
      row["diagnostics"] = 0.0
    _, row["finite"] = _timed(
      guard.require_finite, rparams, f"the rollout weights of sync {i}"
    )
    _, row["push"] = _timed(engine.update_weights, rparams)
    row["total"] = sum(row[p] for p in PHASES)
    row["quantized_change_fraction"] = diag.get(
      "quant/quantized_change_fraction", float("nan")
    )
    rows.append(row)
    print(
      f"sync {i}: "
      + "  ".join(f"{p} {row[p]:.3f} s" for p in PHASES + ("total",))
      + f"  codes moved {row['quantized_change_fraction']:.2e}",
      flush=True,
    )
  engine.close()
  warm = rows[1:] or rows
  median = {
    p: statistics.median(r[p] for r in warm) for p in PHASES + ("total",)
  }
  print(
    f"\n{_MODEL.value}, {_QUANT.value}, uaq_scale {_UAQ.value}: median of "
    f"{len(warm)} warm syncs (first sync: {rows[0]['total']:.2f} s)"
  )
  print("| phase | seconds |\n|---|---:|")
  for p in PHASES + ("total",):
    print(f"| {p} | {median[p]:.3f} |")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(
        {
          "machine": cpu.model,
          "cpu_flags": list(cpu.flags),
          "jax": jax.__version__,
          "host_huge_pages": hostmem.huge_pages_state(),
          "model": _MODEL.value,
          "quant": _QUANT.value,
          "uaq_scale": _UAQ.value,
          "median_s": median,
          "syncs": rows,
        },
        f,
        indent=1,
      )


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
