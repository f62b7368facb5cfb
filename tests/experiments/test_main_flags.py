"""experiments/main.py checks every flag before anything loads: a command
line with many bad flags gives one error that names each field (so a user
fixes them in one go), and no model is loaded and no run directory is
made."""

import os
import subprocess
import sys

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

BAD = {  # flag -> the field the error must name
  "--optim.b1=2": "optim.b1",
  "--optim.b2=1": "optim.b2",
  "--optim.weight_decay=-1": "optim.weight_decay",
  "--update.entropy_coef=-5": "update.entropy_coef",
  "--critic.value_clip=-1": "critic.value_clip",
  "--optim.warmup_steps=-5": "optim.warmup_steps",
  "--advantage.max_resample_rounds=-1": "advantage.max_resample_rounds",
  "--task.reward_workers=-1": "task.reward_workers",
  "--kl.coef=-1": "kl.coef",
  "--optim.max_grad_norm=-1": "optim.max_grad_norm",
  "--mesh.fsdp=0": "mesh.fsdp",
  "--run.checkpoint_every=0": "run.checkpoint_every",
  "--update.logprob_chunk=-1": "update.logprob_chunk",
  "--task.max_prompt_tokens=1": "task.max_prompt_tokens",
  "--task.name=foo": "task.name",
  "--run.eval_every=1": "task.eval_size",  # with --task.eval_size=0 below
}


def test_every_bad_flag_is_named_in_one_error_before_any_model_loads(tmp_path):
  run_dir = tmp_path / "run"
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
  )
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "experiments", "main.py"),
      *BAD,
      "--task.eval_size=0",
      "--model.name=/no/such/model.gguf",
      f"--run.run_dir={run_dir}",
    ],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=300,
  )
  assert proc.returncode != 0
  err = proc.stderr
  assert f"{len(BAD)} problems in the training config" in err, err[-3000:]
  for field in BAD.values():
    assert f"--{field}=" in err, f"{field} not named:\n{err[-3000:]}"
  assert "chunk_size" not in err
  # Refused before the model or the run directory was touched.
  assert "no/such/model" not in err
  assert not run_dir.exists()
