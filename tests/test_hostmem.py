"""rljax.hostmem: the scripts re-execute themselves with glibc's huge-page
tunable where it takes effect, and XLA's buffers then sit on huge pages."""

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from rljax import hostmem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLIBC = ("glibc", "2.36")


class TestThpMode:
  @pytest.mark.parametrize(
    "text, mode",
    [
      ("always [madvise] never\n", "madvise"),
      ("[always] madvise never\n", "always"),
      ("always madvise [never]\n", "never"),
      ("garbled\n", ""),
    ],
  )
  def test_reads_the_bracketed_mode(self, tmp_path, text, mode):
    path = tmp_path / "enabled"
    path.write_text(text)
    assert hostmem.thp_mode(str(path)) == mode

  def test_missing_file_is_no_mode(self, tmp_path):
    assert hostmem.thp_mode(str(tmp_path / "absent")) == ""


class TestHugePagesEnv:
  def test_adds_the_tunable(self):
    env = hostmem.huge_pages_env({"A": "1"}, GLIBC, "madvise")
    assert env == {"A": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}

  def test_keeps_other_tunables(self):
    env = hostmem.huge_pages_env(
      {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, GLIBC, "madvise"
    )
    assert env["GLIBC_TUNABLES"] == (
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    )

  @pytest.mark.parametrize(
    "env, libc, mode",
    [
      # already set (also what ends the re-execution), whatever its value
      ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, GLIBC, "madvise"),
      ({hostmem.OPT_OUT: "0"}, GLIBC, "madvise"),  # asked not to
      ({}, ("glibc", "2.31"), "madvise"),  # ignores the tunable
      ({}, ("", ""), "madvise"),  # not glibc (musl, macOS)
      ({}, GLIBC, "always"),  # huge pages without asking
      ({}, GLIBC, "never"),  # none to be had
      ({}, GLIBC, ""),  # no THP at all
    ],
  )
  def test_nothing_to_change(self, env, libc, mode):
    assert hostmem.huge_pages_env(env, libc, mode) is None


_CHILD = textwrap.dedent(
  """
  import json, os, sys
  from rljax import hostmem
  hostmem.relaunch_with_huge_pages()
  import jax, jax.numpy as jnp
  x = jax.block_until_ready(jnp.ones((64, 1024, 1024)) * 2)  # 256 MiB
  huge = 0
  with open("/proc/self/smaps_rollup") as f:
    for line in f:
      if line.startswith("AnonHugePages:"):
        huge = int(line.split()[1]) // 1024
  print(json.dumps([sys.argv[1:], os.environ.get("GLIBC_TUNABLES", ""), huge]))
  """
)


@pytest.mark.skipif(
  hostmem.huge_pages_env({}, platform.libc_ver(), hostmem.thp_mode()) is None,
  reason="glibc < 2.35 or THP not in madvise mode: nothing to relaunch for",
)
@pytest.mark.parametrize("opt_out", [False, True])
def test_relaunched_process_puts_xla_buffers_on_huge_pages(tmp_path, opt_out):
  script = tmp_path / "child.py"
  script.write_text(_CHILD)
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES",)}
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env["JAX_PLATFORMS"] = "cpu"
  env.pop("XLA_FLAGS", None)
  if opt_out:
    env[hostmem.OPT_OUT] = "0"
  proc = subprocess.run(
    [sys.executable, str(script), "--flag=1", "two"],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  argv, tunables, huge_mib = json.loads(proc.stdout.strip().splitlines()[-1])
  assert argv == ["--flag=1", "two"]  # the command line survives the exec
  if opt_out:
    assert tunables == "" and huge_mib == 0
  else:
    assert tunables == hostmem.TUNABLE
    assert huge_mib >= 128, proc.stdout


def test_state_names_the_mode(monkeypatch):
  monkeypatch.setattr(hostmem, "started_tunables", lambda: hostmem.TUNABLE)
  monkeypatch.setattr(hostmem, "thp_mode", lambda: "madvise")
  assert hostmem.huge_pages_state().startswith("on (THP madvise")
  monkeypatch.setattr(hostmem, "started_tunables", lambda: "")
  assert hostmem.huge_pages_state().startswith("off")
  monkeypatch.setattr(hostmem, "thp_mode", lambda: "never")
  assert hostmem.huge_pages_state() == "off (THP never)"


def test_a_failed_exec_leaves_the_process_running(monkeypatch, capsys):
  def refuse(*args):
    raise PermissionError("exec refused")

  monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  monkeypatch.delenv(hostmem.OPT_OUT, raising=False)
  monkeypatch.setattr(hostmem, "thp_mode", lambda: "madvise")
  monkeypatch.setattr(hostmem.platform, "libc_ver", lambda: GLIBC)
  monkeypatch.setattr(hostmem.os, "execve", refuse)
  hostmem.relaunch_with_huge_pages()  # returns instead of raising
  assert "running without huge pages" in capsys.readouterr().err


def test_started_tunables_reads_the_environment_the_process_began_with(
  tmp_path,
):
  environ = tmp_path / "environ"
  environ.write_bytes(b"A=1\0GLIBC_TUNABLES=glibc.malloc.hugetlb=1\0B=2\0")
  assert hostmem.started_tunables(str(environ)) == "glibc.malloc.hugetlb=1"
  environ.write_bytes(b"A=1\0")
  assert hostmem.started_tunables(str(environ)) == ""
