"""`experiments/ablate.py --grid="algorithm=grpo,reinforce_pp"` with VAPO
and ORZ from a --configs file, on the tiny random model: every run trains
its own preset a step, VAPO and ORZ after a step of value pretraining, and
the table has one row per algorithm. Runs the script as a user would
(subprocess)."""

import json
import os
import subprocess
import sys

import compile_cache_util

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def test_grid_of_algorithms_runs_each_preset(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")  # and the run's jax cache
  env["XLA_FLAGS"] = compile_cache_util.FAST_COMPILE_XLA_FLAGS
  out = tmp_path / "out"
  # VAPO's preset pretrains the critic 50 steps; one is enough here. ORZ
  # has a critic too, so it gets the step. GRPO and REINFORCE++ have none
  # to pretrain, and a shared --critic.pretrain_steps would be refused for
  # them (a setting nothing reads): the critic runs come from a file.
  critics = tmp_path / "critics.json"
  critics.write_text(
    json.dumps(
      [
        {"name": f"algorithm={a}", "algorithm": a, "critic.pretrain_steps": 1}
        for a in ("vapo", "orz")
      ]
    )
  )
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "ablate.py"),
      "--grid=algorithm=grpo,reinforce_pp",
      f"--configs={critics}",
      f"--out_dir={out}",
      "--model.name=tiny",
      "--run.steps=1",
      "--run.tensorboard=false",
      "--rollout.quant=none",
      "--rollout.prompts_per_step=2",
      "--rollout.group_size=2",
      "--rollout.max_new_tokens=4",
      "--task.eval_size=0",
      "--task.reward_workers=0",
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=900,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  table = {r["name"]: r for r in json.loads((out / "table.json").read_text())}
  names = {a: f"algorithm={a}" for a in ("grpo", "reinforce_pp", "vapo", "orz")}
  assert set(table) == set(names.values())
  # Run directories spell the cell without "=" or "." (portable path names).
  dirs = {a: out / f"algorithm-{a}_s0" for a in names}
  steps = {a: table[n]["steps"] for a, n in names.items()}
  assert steps == {"grpo": 1, "reinforce_pp": 1, "vapo": 2, "orz": 2}
  for a, n in names.items():
    cfg = json.loads((dirs[a] / "config.json").read_text())
    assert cfg["algorithm"] == a
    rows = [
      json.loads(line)
      for line in (dirs[a] / "metrics.jsonl").read_text().splitlines()
      if line.strip()
    ]
    last = rows[-1]
    assert last["applied"] == 1.0, (a, last)
  vapo = json.loads((dirs["vapo"] / "config.json").read_text())
  assert vapo["loss"]["positive_nll_coef"] == 0.1
  assert vapo["critic"]["pretrain_steps"] == 1
  orz = json.loads((dirs["orz"] / "config.json").read_text())
  assert orz["advantage"]["gae_lambda"] == orz["critic"]["gae_lambda"] == 1.0
  assert orz["kl"]["coef"] == orz["kl"]["in_reward_coef"] == 0.0
