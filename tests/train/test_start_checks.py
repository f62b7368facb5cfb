"""A start that cannot succeed fails before anything loads, and a start that
failed leaves the run directory as it found it (issue 43, item 6)."""

import os

import pytest

from rljax.train import loop as loop_lib
from rljax.train import preflight
from rljax.train.config import ConfigError, apply_preset


def _cfg(run_dir, **fields):
  return apply_preset(
    "grpo",
    {
      "model.name": "tiny",
      "rollout.quant": "none",
      "task.reward_workers": 0,
      "task.eval_size": 0,
      "run.run_dir": str(run_dir),
      "run.tensorboard": False,
      **fields,
    },
  )


class TestPreflight:
  def test_unknown_model_is_named_before_the_run_dir_is_made(self, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"--model.name='/no/such/model'"):
      loop_lib.Trainer(_cfg(run_dir, **{"model.name": "/no/such/model"}))
    assert not run_dir.exists()

  def test_missing_data_file_is_named_before_the_model_loads(self, tmp_path):
    run_dir = tmp_path / "run"
    cfg = _cfg(
      run_dir,
      **{"task.name": "gsm8k", "task.data_path": str(tmp_path / "no.jsonl")},
    )
    with pytest.raises(ConfigError, match=r"--task.data_path=.*no such file"):
      loop_lib.Trainer(cfg)
    assert not run_dir.exists()

  def test_every_problem_at_once(self, tmp_path):
    cfg = _cfg(
      tmp_path,
      **{
        "model.name": "x.gguf",
        "task.name": "gsm8k",
        "task.data_path": "/no/such.jsonl",
      },
    )
    fields = [p.field for p in preflight.problems(cfg)]
    assert fields[:2] == ["model.name", "task.data_path"]

  def test_missing_vllm_is_named(self, tmp_path, monkeypatch):
    real = preflight.importlib.util.find_spec
    monkeypatch.setattr(
      preflight.importlib.util,
      "find_spec",
      lambda name, *a: None if name == "vllm" else real(name, *a),
    )
    cfg = _cfg(tmp_path / "run", **{"rollout.engine": "vllm"})
    with pytest.raises(ConfigError, match=r"--rollout.engine='vllm'.*vLLM"):
      loop_lib.Trainer(cfg)
    assert not (tmp_path / "run").exists()
    # Servers already running need no local vLLM.
    cfg = cfg.replace({"rollout.vllm_urls": "http://127.0.0.1:8001"})
    assert preflight.problems(cfg) == []

  def test_a_sandbox_mode_without_a_python_tool_is_named_first(self, tmp_path):
    # Naming the unsafe mode where no python tool runs would do nothing.
    cfg = _cfg(
      tmp_path / "run", **{"task.python_sandbox": "unsafe_rlimits_only"}
    )
    with pytest.raises(ConfigError, match=r"--task.python_sandbox="):
      loop_lib.Trainer(cfg)
    assert not (tmp_path / "run").exists()

  def test_a_strong_sandbox_that_cannot_run_is_named_first(
    self, tmp_path, monkeypatch
  ):
    from rljax.envs import sandbox  # pylint: disable=g-import-not-at-top

    monkeypatch.setattr(sandbox, "strong_problem", lambda: "no seccomp here")
    cfg = _cfg(
      tmp_path / "run",
      **{"task.name": "tool_arithmetic", "task.tool": "python"},
    )
    with pytest.raises(ConfigError, match=r"python_sandbox.*no seccomp here"):
      loop_lib.Trainer(cfg)
    assert not (tmp_path / "run").exists()
    cfg = cfg.replace({"task.python_sandbox": "unsafe_rlimits_only"})
    assert preflight.problems(cfg) == []

  def test_an_unknown_sandbox_mode_is_a_config_error(self, tmp_path):
    with pytest.raises(ConfigError, match=r"python_sandbox='open'"):
      _cfg(tmp_path, **{"task.python_sandbox": "open"})

  def test_names_that_load(self, tmp_path):
    for name in ("tiny", "smollm2-135m-instruct", "instrument:/x"):
      assert preflight.model_problem(name) is None, name
    hf = tmp_path / "hf"
    hf.mkdir()
    assert "config.json" in preflight.model_problem(str(hf))
    (hf / "config.json").write_text("{}")
    assert preflight.model_problem(str(hf)) is None


class TestFailedStartLeavesNoDebris:
  def test_a_fresh_directory_is_removed(self, tmp_path, monkeypatch):
    def fail(self, cfg, model, task):
      raise RuntimeError("the model failed to load")

    monkeypatch.setattr(loop_lib.Trainer, "_init", fail)
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="failed to load"):
      loop_lib.Trainer(_cfg(run_dir))
    assert not run_dir.exists()  # no config.json, checkpoints/, rljax.lock

  def test_files_that_were_there_are_kept(self, tmp_path, monkeypatch):
    def fail(self, cfg, model, task):
      raise RuntimeError("the model failed to load")

    monkeypatch.setattr(loop_lib.Trainer, "_init", fail)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError):
      loop_lib.Trainer(_cfg(run_dir))
    assert sorted(os.listdir(run_dir)) == ["notes.txt"]
