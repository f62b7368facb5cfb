"""Every training flag says what it does and what it accepts, from one
source (`rljax.train.config.help`), rather than naming its dataclass path
('PolicyLossConfig.correction'), and `main.py --help` lists the training
flags section by section."""

import os
import re
import subprocess
import sys

from absl import flags

from rljax.train import config as config_lib
from rljax.train import flags as train_flags
from rljax.train.config import help as help_lib
from rljax.train.config import validation

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def test_every_field_has_its_own_help_and_no_other_key():
  fields = set(config_lib.field_names())
  assert fields - set(help_lib.FIELD_HELP) == set()
  assert set(help_lib.FIELD_HELP) - fields == set()


def test_every_flag_help_says_what_it_does():
  fv = flags.FlagValues()
  train_flags.define_train_flags(flag_values=fv)
  path_only = re.compile(r"^\w+Config\.\w+( \(unset = None\))?$")
  for name in config_lib.field_names():
    text = fv[name].help
    assert len(text.split()) >= 3, (name, text)
    assert not path_only.match(text), (name, text)


def test_a_field_with_choices_lists_them():
  for name, rule in validation.FIELD_RULES.items():
    if name not in config_lib.field_names():
      continue
    expected = help_lib.allowed(name)
    if expected.startswith("one of"):
      assert expected in help_lib.flag_help(name), name
  assert "'acr'" in help_lib.flag_help("loss.correction")
  assert "Allowed: >= 0" in help_lib.flag_help("kl.coef")


def test_help_lists_the_sections():
  text = help_lib.sections_help()
  for section in config_lib.SECTIONS:
    assert f"--{section}.*:" in text, section
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    RLJAX_HUGE_PAGES="0",
    PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
  )
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "experiments", "main.py"), "--help"],
    capture_output=True,
    text=True,
    env=env,
    timeout=120,
  )
  out = proc.stdout + proc.stderr
  assert "Traceback" not in out, out[-3000:]  # absl's --help exits 1
  assert "--loss.*:" in out and "eps_high" in out, out[-3000:]
