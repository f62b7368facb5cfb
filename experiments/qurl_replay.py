"""A mechanism replay of ACR against TIS, minutes long.

QuRL's Adaptive Clipping Range (Eq. 9) differs from TIS only where
R = π_θ/π_prox leaves 1, i.e. from the second mini-batch update of a
rollout on. A long RL study measures its end effect through hundreds of
noisy steps; this replay measures the mechanism directly:

  1. the instrument of experiments/long_horizon.py (SFT'd here by its own
     phase 1 if --instrument_dir holds none), or the θ and Adam state of an
     RL run's checkpoint (--init_run_dir), in the real `Trainer` with a
     quantized rollout (--quant int8|fp8, UAQ off, cap --cap);
  2. --batches rollouts of that one θ, frozen to <out_dir>/batches/ (npz; a
     rerun with the same θ and rollout settings reuses them);
  3. per batch and per correction (tis, acr), from the same θ and optimizer
     state, --minibatches = K updates of the trainer's own jitted update
     step (`update.run_epochs`, the same mini-batch order for both), then:
       acr_grad_share, acr_would_change_fraction, acr_active_given_eligible
                   the exposure kernels (`rljax.core.exposure`) as the update
                   step logs them, mean over the K updates;
       dlogp_eligible  mean of log π_θ' − log π_θ over the tokens with
                   ρ = π_prox/π_behav > C and A > 0 (the only tokens whose
                   upper clip ACR widens), full precision;
       kl_after    KL(π_behav'‖π_prox') after re-quantizing: θ' quantized as
                   the rollout engine quantizes it, log-probs of the same
                   responses under Q(θ') and θ', the k3 estimator of the
                   trainer's `behav_prox_kl`; kl_before is the same at θ;
  4. a table (mean ± std over batches, the paired ACR − TIS difference with
     a bootstrap interval over batches, the exposure beside the verdict),
     <out_dir>/replay.json and <out_dir>/replay.png (matplotlib, if any);
     the analysis is qurl_report_lib/replay.py, which also renders the
     archived replay.json files into docs/qurl_results.md.

  python experiments/qurl_replay.py --instrument_dir=runs/instrument \\
      --quant=int8 --batches=20 --minibatches=4 --out_dir=runs/qurl_replay

Rollout, loss and optimizer settings come from --configs (default the
pre-registered study experiments/configs/q6_acr_fair.json) and any trainer
flag (--optim.learning_rate=...), with warm-up off: a fresh Adam state at
step 0 of a warm-up would take no step. --dry: a tiny instrument and batch,
under a minute on a CPU (the test's path). docs/qurl/replay.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time

from absl import app, flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import long_horizon  # noqa: E402  (trainer, study and instrument flags)
import ablate  # noqa: E402
from qurl_report_lib import stats  # noqa: E402
from qurl_report_lib.replay import (  # noqa: E402
  CORRECTIONS,
  EXPOSURE,
  plot,
  summarize,
  table,
  verdicts,
)

from rljax import hostmem  # noqa: E402
from rljax.train import config as config_lib  # noqa: E402
from rljax.train import flags as train_flags  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
flags.FLAGS.set_default(
  "configs", os.path.join(_ROOT, "experiments/configs/q6_acr_fair.json")
)
flags.FLAGS.set_default("out_dir", "runs/qurl_replay")
_QUANT = flags.DEFINE_enum(
  "quant", "int8", ["int8", "fp8"], "Rollout format (UAQ off)."
)
_CAP = flags.DEFINE_float(
  "cap",
  0.0,
  "C of TIS and ACR; 0 = the cap of the --configs run '<quant>_tis' "
  "(q6: INT8 1.02, FP8 1.05).",
)
_BATCHES = flags.DEFINE_integer("batches", 20, "Frozen rollout batches.")
_MINIBATCHES = flags.DEFINE_integer(
  "minibatches", 4, "K: mini-batch updates per batch (1: R = 1, ACR = TIS)."
)
_INIT_RUN_DIR = flags.DEFINE_string(
  "init_run_dir",
  "",
  "An RL run directory of the instrument (UAQ off, no LoRA): replay from "
  "its latest checkpoint's θ and Adam state instead of the SFT θ.",
)
_DRY = flags.DEFINE_bool(
  "dry", False, "Tiny instrument and batches (< 1 min on a CPU)."
)

_DRY_INSTRUMENT = {
  "hidden_size": 32,
  "num_layers": 1,
  "sft_steps": 4,
  "sft_eval_every": 2,
  "sft_batch_size": 8,
  "batches": 2,
}
_DRY_TRAIN = {
  "task.difficulty": "easy",
  "task.eval_size": 8,
  "rollout.prompts_per_step": 4,
  "rollout.group_size": 4,
  "rollout.max_new_tokens": 3,
  "rollout.temperature": 1.0,
  # An instrument of 4 SFT steps scores 0: DAPO's soft overlong punishment
  # (lengths 1, 2, 3 -> 0, -0.5, -1) gives its groups reward variance, so
  # the dry replay's updates move θ and its K = 1 check compares real steps.
  "advantage.overlong_shaping": True,
  "advantage.overlong_max_len": 3,
  "advantage.overlong_cache_len": 2,
}


def replay_config(shared: dict, run_dir: str):
  """The trainer's TrainConfig: --configs base ← replay defaults ← typed
  flags ← this replay's quant, cap, K (UAQ off, one epoch, correction tis;
  the acr arm swaps only the correction)."""
  base = config_lib.flatten(shared)
  base.update(
    {
      "model.compute_dtype": "float32",  # as long_horizon.py's studies
      "optim.warmup_steps": 0,
      "run.eval_every": 0,
      "run.tensorboard": False,
      "run.export_hf": False,
    }
  )
  if _DRY.value:
    base.update(_DRY_TRAIN)
  return train_flags.config_from_flags(
    base,
    {
      "model.name": f"instrument:{long_horizon._DIR.value}",
      "rollout.quant": _QUANT.value,
      "rollout.uaq_scale": 1.0,
      "loss.correction": "tis",
      "loss.tis_cap": _cap(),
      "update.minibatches": _MINIBATCHES.value,
      "update.ppo_epochs": 1,
      "run.run_dir": run_dir,
      "run.resume": False,
    },
  )


def _cap() -> float:
  if _CAP.value:
    return _CAP.value
  _, runs, _ = ablate.load_config_file(flags.FLAGS.configs)
  for run in runs:
    if run["name"] == f"{_QUANT.value}_tis":
      cap = config_lib.lookup(run, "loss.tis_cap")
      if cap is not None:
        return float(cap)
  raise app.UsageError(
    f"--cap=0: {flags.FLAGS.configs} has no run '{_QUANT.value}_tis' with "
    "a loss.tis_cap; give --cap"
  )


def digest(tree) -> str:
  """sha256 of a pytree's leaves (bytes, in tree order)."""
  import jax

  h = hashlib.sha256()
  for x in jax.tree.leaves(jax.device_get(tree)):
    h.update(np.ascontiguousarray(x).tobytes())
  return h.hexdigest()[:16]


def restore_state(trainer, cfg, run_dir: str):
  """θ and Adam state of `run_dir`'s latest checkpoint, restored as the
  trainer resumes (into its state tree; the replay's optimizer
  hyperparameters), read-only. A run without UAQ and LoRA only: the
  replay's parametrisation."""
  from rljax.train import checkpoint, restore
  from rljax.train import optim as optim_lib

  if restore.read_config(run_dir).lora_config() is not None:
    raise app.UsageError(f"--init_run_dir={run_dir}: a LoRA run; expected full")
  ckpt = checkpoint.RunCheckpointer(
    os.path.join(run_dir, "checkpoints"), 1, 1_000_000, owner=False
  )
  try:
    step, _ = ckpt.latest_verified_step()
    if step is None:
      raise app.UsageError(f"--init_run_dir={run_dir}: no checkpoint")
    try:
      state, _ = checkpoint.restore_step(ckpt, step, trainer.state, 1.0)
    except ValueError as e:  # another UAQ scale, another model shape
      raise app.UsageError(f"--init_run_dir={run_dir}: {e}") from None
  finally:
    ckpt.close()
  print(f"[replay] θ and Adam state of {run_dir} step {step}", flush=True)
  return state.replace(
    opt_state=optim_lib.with_hyperparams(state.opt_state, cfg.optim_config())
  )


def frozen_batches(trainer, cfg, out_dir: str, n: int, meta: dict):
  """`n` rollout batches of θ (the trainer's state), loaded from
  <out_dir>/batches/<key>/ when its meta matches, else collected and saved."""
  import dataclasses

  import jax.numpy as jnp
  from rljax.train import build_batch

  where = os.path.join(
    out_dir, "batches", f"{cfg.rollout.quant}_s{cfg.run.seed}"
  )
  meta_path = os.path.join(where, "meta.json")
  paths = [os.path.join(where, f"batch_{i:03d}.npz") for i in range(n)]
  if os.path.exists(meta_path) and all(map(os.path.exists, paths)):
    with open(meta_path) as f:
      if json.load(f) == meta:
        print(f"[replay] reusing {n} frozen batches of {where}", flush=True)
        return [
          {k: jnp.asarray(v) for k, v in np.load(p).items()} for p in paths
        ]
  os.makedirs(where, exist_ok=True)
  # prox_logp always computed (the K = 1 spec would skip it), so a batch
  # serves every K and log π_θ of its tokens is at hand for Δ log π.
  spec = dataclasses.replace(trainer.spec, prox_is_current=False)
  batches = []
  for i in range(n):
    rollout = trainer.collector.collect(i + 1)
    batch, _ = build_batch.make_batch(
      cfg, spec, rollout, trainer.pad_id, trainer._compute_policy_params
    )
    tmp = paths[i] + ".tmp.npz"
    np.savez(tmp, **{k: np.asarray(v) for k, v in batch.items()})
    os.replace(tmp, paths[i])
    batches.append(batch)
  with open(meta_path, "w") as f:
    json.dump(meta, f, indent=1)
  print(f"[replay] collected {n} batches into {where}", flush=True)
  return batches


class Probe:
  """log π of a batch's tokens under θ' (full precision, as the proximal
  pass) and under Q(θ') (as the rollout engine runs it)."""

  def __init__(self, trainer, cfg):
    self.cfg, self.trainer = cfg, trainer
    engine = trainer.actor.engine
    if cfg.rollout.engine != "jax":
      raise app.UsageError(
        f"rollout.engine={cfg.rollout.engine!r}: the replay re-quantizes "
        "for the JAX sampler only; expected 'jax'"
      )
    self.rollout_config = getattr(
      engine, "rollout_config", trainer.model_config
    )
    self.rollout_act = engine.activation_dtype

  def _logp(self, config, params, batch, act):
    from rljax.train import build_batch

    spec = self.trainer.spec
    return build_batch.sequence_logprobs(
      config,
      params,
      batch["tokens"],
      batch["attention_mask"],
      self.cfg.rollout.temperature,
      self.cfg.update.logprob_chunk or None,
      act,
      spec.logprob_start(batch["tokens"].shape[1]),
    )

  def full(self, params, batch):
    from rljax.train import update

    spec = self.trainer.spec
    return self._logp(
      spec.model_config,
      update.compute_params(spec, params),
      batch,
      spec.activation_dtype,
    )

  def quantized(self, params, batch):
    from rljax import quant

    rparams = quant.prepare_rollout_weights(
      self.trainer.model_config,
      params,
      self.trainer.actor.rollout_mode,
      fake=self.cfg.rollout.fake_quant,
    )
    return self._logp(self.rollout_config, rparams, batch, self.rollout_act)


def behav_prox_kl(behav_logp, prox_logp, mask) -> float:
  """The trainer's `behav_prox_kl`: mean k3 over the valid tokens."""
  from rljax.core import aggregation, kl

  return float(aggregation.masked_mean(kl.k3(behav_logp, prox_logp), mask > 0))


def _masked_mean(x, m) -> float | None:
  m = np.asarray(m, bool)
  return float(np.asarray(x)[m].mean()) if m.any() else None


def replay_batch(steps, state0, batch, probe, cap, seeds, k) -> dict:
  """{correction: metrics} of K updates from `state0` on `batch`."""
  import jax
  import jax.numpy as jnp
  from rljax.core import objectives
  from rljax.train import update

  mask = np.asarray(batch["loss_mask"]) > 0
  prox, behav = batch["prox_logp"], batch["behav_logp"]
  # ρ > C as the ACR kernel decides it (u = max(1, ρ/C) > 1), and A > 0.
  iw = objectives.importance_weights(prox, behav, mask, "acr", cap)
  adv = np.asarray(batch["advantages"])
  eligible = mask & (np.asarray(iw.upper_scale) > 1.0) & (adv > 0)
  out = {
    "n_valid": int(mask.sum()),
    "n_eligible": int(eligible.sum()),
    "kl_rollout": behav_prox_kl(behav, prox, batch["loss_mask"]),
    "kl_before": behav_prox_kl(
      probe.quantized(state0.params, batch), prox, batch["loss_mask"]
    ),
  }
  for corr in CORRECTIONS:
    # Fresh buffers: the update step donates its state.
    state = jax.tree.map(jnp.copy, state0)
    state, ups = update.run_epochs(steps[corr], state, batch, None, seeds, k)
    ups = update.fetch_metrics(ups)
    logp = np.asarray(probe.full(state.params, batch))
    qlogp = probe.quantized(state.params, batch)
    dlogp = logp - np.asarray(prox)
    row = {
      m: float(np.mean([u[m] for u in ups]))
      for m in EXPOSURE + ("acr_active_given_eligible", "clip_fraction_high")
    }
    row.update(
      applied=float(np.min([u["applied"] for u in ups])),
      dlogp_eligible=_masked_mean(dlogp, eligible),
      dlogp_all=_masked_mean(dlogp, mask),
      kl_after=behav_prox_kl(qlogp, logp, batch["loss_mask"]),
      params_digest=digest(state.params),
    )
    out[corr] = row
  return out


def main(argv):
  del argv
  import dataclasses

  from rljax import distributed

  distributed.initialize_from_flags()  # before anything touches a device
  import jax
  from rljax import instrument
  from rljax.train import batch as batch_lib
  from rljax.train import loop
  from rljax.train import optim as optim_lib
  from rljax.quant import cpu as cpu_lib
  from rljax.train import update

  t0 = time.perf_counter()
  if _DRY.value:
    for name, value in _DRY_INSTRUMENT.items():
      if not flags.FLAGS[name].present:
        flags.FLAGS[name].value = value
  if _BATCHES.value < 1 or _MINIBATCHES.value < 1:
    raise app.UsageError(
      f"--batches={_BATCHES.value}, --minibatches={_MINIBATCHES.value}: "
      "expected both >= 1"
    )
  shared, _, _ = ablate.load_config_file(flags.FLAGS.configs)
  record = long_horizon.pretrain(shared)
  out_dir = flags.FLAGS.out_dir
  os.makedirs(out_dir, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="replay_run_") as run_dir:
    cfg = replay_config(shared, run_dir)
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    if rows % _MINIBATCHES.value:
      raise app.UsageError(
        f"--minibatches={_MINIBATCHES.value} does not divide the batch of "
        f"{rows} samples (prompts_per_step × group_size)"
      )
    if cfg.lora_config() is not None:
      raise app.UsageError("the replay trains full weights; drop --lora.*")
    model = instrument.load_model(long_horizon._DIR.value)
    task = instrument.build_task(cfg, model.tokenizer)
    trainer = loop.Trainer(cfg, model=model, task=task, show_progress=False)
    try:
      if _INIT_RUN_DIR.value:
        trainer.state = restore_state(trainer, cfg, _INIT_RUN_DIR.value)
      trainer.actor.sync(*trainer._theta())
      theta = digest(trainer.state.params)
      meta = {
        "theta": theta,
        "quant": cfg.rollout.quant,
        "seed": cfg.run.seed,
        "rollout": dataclasses.asdict(cfg.rollout),
        "task": dataclasses.asdict(cfg.task),
      }
      batches = frozen_batches(trainer, cfg, out_dir, _BATCHES.value, meta)
      t_collect = time.perf_counter() - t0
      # The trainer's update step, once per correction (same optimizer).
      optimizer = optim_lib.make_optimizer(cfg.optim_config())
      steps = {}
      for corr in CORRECTIONS:
        spec = dataclasses.replace(
          trainer.spec,
          loss=dataclasses.replace(trainer.spec.loss, correction=corr),
          prox_is_current=_MINIBATCHES.value == 1,
        )
        steps[corr] = update.make_update_step(spec, optimizer)
      probe = Probe(trainer, cfg)
      state0 = trainer.state
      per_batch = []
      for i, batch in enumerate(batches):
        seeds = batch_lib.minibatch_seeds(cfg.run.seed, i + 1, 1)
        res = replay_batch(
          steps, state0, batch, probe, cfg.loss.tis_cap, seeds,
          _MINIBATCHES.value,
        )  # fmt: skip
        per_batch.append({"batch": i, **res})
        print(
          f"[replay] batch {i}: eligible {res['n_eligible']}/"
          f"{res['n_valid']}, ACR share {res['acr']['acr_grad_share']:.2e}"
          f", Δlogπ TIS {stats.fmt(res['tis']['dlogp_eligible'])} ACR "
          f"{stats.fmt(res['acr']['dlogp_eligible'])}",
          flush=True,
        )
    finally:
      trainer.close()
  summary = summarize(per_batch)
  result = {
    "config": {
      "quant": cfg.rollout.quant,
      "cap": cfg.loss.tis_cap,
      "minibatches": _MINIBATCHES.value,
      "batches": _BATCHES.value,
      "rows_per_batch": rows,
      "learning_rate": cfg.optim.learning_rate,
      "eps_low": cfg.loss.eps_low,
      "eps_high": cfg.loss.eps_high,
      "temperature": cfg.rollout.temperature,
      "configs": flags.FLAGS.configs,
      "instrument_dir": long_horizon._DIR.value,
      "init_run_dir": _INIT_RUN_DIR.value or None,
      "dry": _DRY.value,
    },
    "instrument": {
      k: record.get(k) for k in ("steps", "accuracy", "parameters", "shape")
    },
    "theta": theta,
    "machine": {
      "backend": jax.default_backend(),
      "cpus": os.cpu_count(),
      "cpu": cpu_lib.host_cpu().model,
      "dot_flags": [
        f
        for f in ("avx2", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
        if cpu_lib.host_cpu().has(f)
      ],
    },
    "date": time.strftime("%Y-%m-%d", time.gmtime()),
    "seconds": {
      "collect": t_collect,
      "total": time.perf_counter() - t0,
    },
    "per_batch": per_batch,
    "summary": summary,
  }
  result["verdict"] = verdicts(summary)
  with open(os.path.join(out_dir, "replay.json"), "w") as f:
    json.dump(result, f, indent=1)
  print(table(result))
  if plot(result, os.path.join(out_dir, "replay.png")):
    print(f"[replay] wrote {out_dir}/replay.json and replay.png")
  else:
    print(f"[replay] wrote {out_dir}/replay.json (no matplotlib: no plot)")


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
