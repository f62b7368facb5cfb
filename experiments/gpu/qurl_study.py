"""The QuRL GPU studies in one call of the device tool: the fair ACR test
with its A/A arm (Q6) and Q4's TIS arm with UAQ off (Q7).

  python experiments/gpu/qurl_study.py          # on the GPU, into $OUT
  python experiments/gpu/qurl_study.py --dry    # tiny, on this CPU

A GPU run of the same config twice is not bit-identical by default (XLA may
pick reductions with atomics), which is why the archived Q4 read a -0.117
TIS-vs-ACR gap while ACR was provably inert. Every process here runs with
`--xla_gpu_deterministic_ops=true` and autotuning off, so that two runs of
one config are equal, and the study carries an A/A arm (`int8_tis_aa`, the
`int8_tis` config under another name) that checks it. A bit-identical A/A
pair is not a noise floor: it says nothing about how far two harmlessly
perturbed runs drift apart (a perturbed A/A arm, `instrument#order=1` in a
config, measures that; docs/qurl_results.md's rules).

`--mode=calibrated` runs Q6's pre-registered calibration of the cap C
instead (the first study's C = 1.02 / 1.05 made TIS truncate ~10 % of
tokens, outside the registered 1-3 %): 30 steps of seed 0's TIS arm per
format and cap, `choose_cap` keeps the cap whose truncation is in [1 %, 3 %]
nearest 2 %, writes `$OUT/q6_acr_fair_calibrated.json` and runs its four
quantized arms on seeds 0-2 (plus Q7 on `--q7_seeds`).

Steps of the default mode (each saves before the next; a job cut by the deadline keeps what
its run directory holds, marked partial):
  1. one SFT of the instrument (experiments/long_horizon.py --sft_only),
     shared by every arm;
  2. jobs in order of value, `--lanes` at a time, each one process of
     long_horizon.py with `--only=ARM --seeds=S`: Q4's three 1,000-step arms
     (UAQ 1.0 and 1.5 beside fp32; experiments/configs/q7_uaq_long_horizon
     .json) first because they are the longest, then the fair test's seed
     0, 1, 2 (experiments/configs/q6_acr_fair.json, with the A/A arm);
  3. every job's run directory (checkpoints left out) merged into one study
     directory per config, tarred to $OUT/qurl_gpu.tar.gz, with
     $OUT/qurl_gpu.json listing each job's exit code, wall time and steps.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

from absl import app, flags
from cap_rule import choose_cap

_DRY = flags.DEFINE_bool("dry", False, "Tiny steps on the CPU (a check).")
_OUT = flags.DEFINE_string(
  "out", None, "Output folder (default $OUT, else runs/qurl_gpu[_dry])."
)
_BUDGET_S = flags.DEFINE_float(
  "budget_s", 540.0, "Wall seconds for everything; jobs are killed after."
)
_LANES = flags.DEFINE_integer("lanes", 6, "Jobs run at once.")
_MODE = flags.DEFINE_enum(
  "mode",
  "study",
  ["study", "calibrated"],
  "study: Q7 and Q6 as their configs stand, with the A/A arm. calibrated: "
  "Q6's pre-registered calibration of C first (30 steps of seed 0's TIS arm "
  "per format and cap in --caps_int8/--caps_fp8; the cap whose TIS "
  "truncation is in [1%, 3%] and nearest 2% is kept), then Q6's four "
  "quantized arms on 3 seeds with those caps.",
)
_CAPS_INT8 = flags.DEFINE_list(
  "caps_int8", ["1.05", "1.1", "1.2", "1.35", "1.5"], "INT8 caps tried."
)
_CAPS_FP8 = flags.DEFINE_list(
  "caps_fp8", ["1.1", "1.2", "1.35", "1.5", "2.0"], "FP8 caps tried."
)
_Q7_SEEDS = flags.DEFINE_list(
  "q7_seeds",
  [],
  "calibrated mode: also run Q7's three arms on these seeds (first: they "
  "are the longest).",
)
_CALIBRATION_STEPS = flags.DEFINE_integer(
  "calibration_steps", 30, "Steps of each calibration run."
)
_START_MARGIN_S = flags.DEFINE_float(
  "start_margin_s",
  100.0,
  "Start no job with fewer than this many seconds left of --budget_s.",
)

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
_LONG = os.path.join(_ROOT, "experiments", "long_horizon.py")
_Q6 = os.path.join(_ROOT, "experiments", "configs", "q6_acr_fair.json")
_Q7 = os.path.join(_ROOT, "experiments", "configs", "q7_uaq_long_horizon.json")
_Q6_ARMS = ("fp32", "int8_tis", "int8_acr", "fp8_tis", "fp8_acr", "int8_tis_aa")
_Q7_ARMS = ("int8_tis_uaq1", "int8_tis_uaq15", "fp32")
_DETERMINISTIC = "--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0"


def _jobs() -> list[tuple[str, str, str, int]]:
  """(study, config, arm, seed) in the order they start."""
  jobs = [("q7_uaq_long_horizon", _Q7, arm, 0) for arm in _Q7_ARMS]
  for seed in (0, 1, 2):
    jobs += [("q6_acr_fair", _Q6, arm, seed) for arm in _Q6_ARMS]
  return jobs


def _env() -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env["PYTHONUNBUFFERED"] = "1"
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  env["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
  if not _DRY.value:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + _DETERMINISTIC).strip()
  return env


def _dry_flags() -> list[str]:
  if not _DRY.value:
    return []
  return [
    "--sft_steps=4",
    "--sft_eval_every=2",
    "--hidden_size=32",
    "--num_layers=1",
    "--run.steps=2",
    "--run.eval_every=2",
    "--task.eval_size=8",
    "--rollout.prompts_per_step=2",
    "--rollout.group_size=2",
  ]


def _steps_done(run_dir: str) -> int:
  path = os.path.join(run_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    return sum(1 for line in f if line.strip())


def main(argv):
  del argv
  t0 = time.time()
  out = (
    _OUT.value
    or os.environ.get("OUT")
    or ("runs/qurl_gpu_dry" if _DRY.value else "runs/qurl_gpu")
  )
  work = os.path.join(out, "work") if _DRY.value else "/tmp/qurl_gpu"
  os.makedirs(out, exist_ok=True)
  os.makedirs(work, exist_ok=True)
  log = open(os.path.join(out, "qurl_gpu.log"), "a")
  env = _env()
  instrument_dir = os.path.join(work, "instrument")
  base = [
    sys.executable,
    _LONG,
    f"--instrument_dir={instrument_dir}",
    *_dry_flags(),
  ]
  summary: dict = {"jobs": {}, "machine": _machine(env)}

  def save():
    summary["wall_s"] = round(time.time() - t0, 1)
    with open(os.path.join(out, "qurl_gpu.json"), "w") as f:
      json.dump(summary, f, indent=1)

  sft = subprocess.run(
    base + [f"--configs={_Q6}", "--sft_only"],
    env=env,
    stdout=log,
    stderr=subprocess.STDOUT,
    timeout=max(30.0, _BUDGET_S.value / 3),
  )
  summary["sft"] = {"rc": sft.returncode, "wall_s": round(time.time() - t0, 1)}
  record = os.path.join(instrument_dir, "instrument.json")
  if os.path.exists(record):
    shutil.copy(record, os.path.join(out, "instrument.json"))
  save()
  if sft.returncode != 0:
    print("SFT failed; see qurl_gpu.log", flush=True)
    return 1

  if _MODE.value == "study":
    _run_jobs(_jobs(), base, env, work, summary, save, t0, log)
  else:
    caps = _calibrate(base, env, work, summary, save, t0, log)
    summary["caps"] = caps
    config = _calibrated_config(
      caps, os.path.join(out, "q6_acr_fair_calibrated.json")
    )
    jobs = [
      ("q7_uaq_long_horizon", _Q7, arm, int(seed))
      for seed in _Q7_SEEDS.value
      for arm in _Q7_ARMS
    ]
    jobs += [
      ("q6_acr_fair_calibrated", config, arm, seed)
      for seed in (0, 1, 2)
      for arm in ("int8_tis", "int8_acr", "fp8_tis", "fp8_acr")
    ]
    _run_jobs(jobs, base, env, work, summary, save, t0, log)
  _merge(work, out)
  save()
  print(json.dumps(summary, indent=1), flush=True)
  return 0


def _run_jobs(jobs, base, env, work, summary, save, t0, log) -> None:
  """Runs (study, config, arm, seed) jobs, --lanes at a time, in order."""
  pending = list(jobs)
  running: dict[str, tuple[subprocess.Popen, float, str]] = {}
  while pending or running:
    left = _BUDGET_S.value - (time.time() - t0)
    while pending and len(running) < _LANES.value:
      if left < _START_MARGIN_S.value:
        for study, _, arm, seed in pending:
          summary["jobs"][f"{study}/{arm}_s{seed}"] = {"rc": "not started"}
        pending = []
        break
      study, config, arm, seed = pending.pop(0)
      key = f"{study}/{arm}_s{seed}"
      job_dir = os.path.join(work, "jobs", study, f"{arm}_s{seed}")
      cmd = base + [
        f"--configs={config}",
        f"--only={arm}",
        f"--seeds={seed}",
        f"--out_dir={job_dir}",
      ]
      proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT
      )
      running[key] = (proc, time.time(), job_dir)
      print(f"[{time.time() - t0:6.0f}s] start {key}", flush=True)
    for key, (proc, started, job_dir) in list(running.items()):
      rc = proc.poll()
      if rc is None and left <= 0:
        proc.kill()
        rc = "killed at the deadline"
      if rc is None:
        continue
      del running[key]
      run_dir = os.path.join(job_dir, key.split("/")[1])
      summary["jobs"][key] = {
        "rc": rc,
        "wall_s": round(time.time() - started, 1),
        "steps": _steps_done(run_dir),
      }
      print(f"[{time.time() - t0:6.0f}s] end {key}: {summary['jobs'][key]}")
      save()
    time.sleep(1.0)


def _calibrate(base, env, work, summary, save, t0, log) -> dict:
  """Q6's pre-registered calibration: TIS's truncated fraction over the
  first --calibration_steps of seed 0, per format and cap; the kept cap is
  the one in [1 %, 3 %] nearest 2 % (else the nearest 2 %, flagged)."""
  q6 = _read(_Q6)
  calib_dir = os.path.join(work, "configs")
  os.makedirs(calib_dir, exist_ok=True)
  jobs, arms = [], {}
  for fmt, caps in (("int8", _CAPS_INT8.value), ("fp8", _CAPS_FP8.value)):
    for cap in caps:
      name = f"{fmt}_tis_c{cap}"
      config = {
        "_comment": "Q6 calibration run (experiments/gpu/qurl_study.py)",
        "base": json.loads(json.dumps(q6["base"])),
        "seeds": [0],
        "runs": [
          {
            "name": name,
            "rollout": {"quant": fmt, "uaq_scale": 1.0},
            "loss": {"correction": "tis", "tis_cap": float(cap)},
          }
        ],
      }
      config["base"]["run"]["steps"] = _CALIBRATION_STEPS.value
      config["base"]["run"]["eval_every"] = 10_000
      path = os.path.join(calib_dir, f"{name}.json")
      with open(path, "w") as f:
        json.dump(config, f, indent=1)
      jobs.append(("q6_calibration", path, name, 0))
      arms[name] = (fmt, float(cap))
  _run_jobs(jobs, base, env, work, summary, save, t0, log)
  measured: dict = {"int8": {}, "fp8": {}}
  for name, (fmt, cap) in arms.items():
    run_dir = os.path.join(
      work, "jobs", "q6_calibration", f"{name}_s0", f"{name}_s0"
    )
    values = _metric(run_dir, "tis_truncated_fraction")
    if values:
      measured[fmt][cap] = sum(values) / len(values)
  chosen = {fmt: choose_cap(by_cap, fmt) for fmt, by_cap in measured.items()}
  print(f"[calibration] {json.dumps(chosen)}", flush=True)
  return chosen


def _calibrated_config(caps: dict, path: str) -> str:
  """Q6 with the calibrated caps on its four quantized TIS/ACR arms."""
  q6 = _read(_Q6)
  runs = []
  for run in q6["runs"]:
    fmt = run["rollout"]["quant"]
    if run["name"] not in ("int8_tis", "int8_acr", "fp8_tis", "fp8_acr"):
      continue
    run = json.loads(json.dumps(run))
    run["loss"]["tis_cap"] = caps[fmt]["cap"]
    runs.append(run)
  config = {
    "_comment": (
      "Q6 with C chosen by the pre-registered calibration (30 steps of "
      "seed 0's TIS arm; TIS truncation in [1%, 3%], nearest 2%): "
      + json.dumps(caps)
      + ". Everything else as experiments/configs/q6_acr_fair.json."
    ),
    "base": q6["base"],
    "seeds": [0, 1, 2],
    "runs": runs,
  }
  with open(path, "w") as f:
    json.dump(config, f, indent=1)
  return path


def _read(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def _metric(run_dir: str, key: str) -> list[float]:
  path = os.path.join(run_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [float(r[key]) for r in rows if key in r]


def _merge(work: str, out: str) -> None:
  """One study directory per config: run dirs without checkpoints, the
  first job's ablation.json, every job's cpu_log.jsonl concatenated."""
  merged = os.path.join(work, "merged")
  shutil.rmtree(merged, ignore_errors=True)
  for study_jobs in sorted(glob.glob(os.path.join(work, "jobs", "*"))):
    study = os.path.basename(study_jobs)
    dest = os.path.join(merged, study)
    os.makedirs(dest, exist_ok=True)
    cpu_lines: list[str] = []
    for job_dir in sorted(glob.glob(os.path.join(study_jobs, "*"))):
      setup = os.path.join(job_dir, "ablation.json")
      if os.path.exists(setup) and not os.path.exists(
        os.path.join(dest, "ablation.json")
      ):
        shutil.copy(setup, dest)
      cpu_log = os.path.join(job_dir, "cpu_log.jsonl")
      if os.path.exists(cpu_log):
        with open(cpu_log) as f:
          cpu_lines += [line for line in f if line.strip()]
      for run_dir in glob.glob(os.path.join(job_dir, "*_s*")):
        if os.path.isdir(run_dir):
          shutil.copytree(
            run_dir,
            os.path.join(dest, os.path.basename(run_dir)),
            ignore=shutil.ignore_patterns("checkpoint*", "*.npz", "tb*"),
            dirs_exist_ok=True,
          )
    with open(os.path.join(dest, "cpu_log.jsonl"), "w") as f:
      f.writelines(cpu_lines)
  with tarfile.open(os.path.join(out, "qurl_gpu.tar.gz"), "w:gz") as tar:
    tar.add(merged, arcname="qurl_gpu")


def _machine(env: dict) -> str:
  try:
    return (
      subprocess.run(
        [
          "nvidia-smi",
          "--query-gpu=name,memory.total,driver_version",
          "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
        timeout=20,
        env=env,
      ).stdout.strip()
      or "no GPU"
    )
  except (OSError, subprocess.SubprocessError):
    return "no GPU"


if __name__ == "__main__":
  app.run(lambda argv: sys.exit(main(argv)))
