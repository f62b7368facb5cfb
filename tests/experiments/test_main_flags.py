"""experiments/main.py checks every flag before anything loads (issue 16,
item 7): all the bad flags of the issue at once give one error that names
each field, and no model is loaded and no run directory is made."""

import os
import subprocess
import sys

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

BAD = {  # flag -> the field the error must name
  "--adam_b1=2": "adam_b1",
  "--adam_b2=1": "adam_b2",
  "--weight_decay=-1": "weight_decay",
  "--entropy_coef=-5": "entropy_coef",
  "--value_clip=-1": "value_clip",
  "--warmup_steps=-5": "warmup_steps",
  "--max_resample_rounds=-1": "max_resample_rounds",
  "--reward_workers=-1": "reward_workers",
  "--kl_coef=-1": "kl_coef",
  "--max_grad_norm=-1": "max_grad_norm",
  "--mesh_shape=foo": "mesh_shape",
  "--checkpoint_every=0": "checkpoint_every",
  "--logprob_chunk=-1": "logprob_chunk",
  "--max_prompt_tokens=1": "max_prompt_tokens",
  "--task=foo": "task",
  "--eval_every=1": "eval_size",  # with --eval_size=0 below
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
      "--eval_size=0",
      "--model=/no/such/model.gguf",
      f"--run_dir={run_dir}",
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
