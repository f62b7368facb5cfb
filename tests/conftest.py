"""Test-wide set-up: 8 fake CPU devices for the sharding tests.

XLA reads this flag once, when the backend starts, so it must be set before
any test imports jax.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
  """Keeps the collection order below as the order files are handed out.

  xdist's loadfile would otherwise hand out the files with the most tests
  first, which puts the single-test multi-minute files (a whole ablation,
  a reward experiment) last, on one worker, while the other idles.
  """
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False


# Files of a minute or more without a real engine (pytest --durations=0).
_HEAVY_FILES = frozenset({
    "test_faults.py", "test_vllm_units.py", "test_ablate_script.py",
    "test_qurl_scripts.py", "test_reward_experiments.py", "test_update.py",
    "test_trainer.py"})


def pytest_collection_modifyitems(config, items):
  """Runs the files that start real engines or models first.

  With `-n 2 --dist loadfile` (the README's command) each file goes to one
  worker in collection order; a multi-minute vLLM file collected last
  leaves the other worker idle at the end. Heaviest first keeps both busy.
  The sort is stable and deterministic, as xdist requires of every worker.
  """
  del config
  weight = {}
  for item in items:
    path = str(item.path)
    w = (0 if item.get_closest_marker("vllm") else
         1 if os.path.basename(path) in _HEAVY_FILES else
         2 if item.get_closest_marker("slow") else 3)
    weight[path] = min(weight.get(path, 3), w)
  items.sort(key=lambda item: weight[str(item.path)])
