"""A start that cannot succeed fails before anything loads, and a start that
failed leaves the run directory as it found it (no stray config.json,
checkpoints/ or lock: a corrected retry starts as if the failed one never
ran)."""

import os

import jax
import pytest

from rljax.train import loop as loop_lib
from rljax.train import preflight
from rljax.train.config import ConfigError, apply_preset


@pytest.fixture
def no_model_loads(monkeypatch):
  """A start that reaches the model's weights fails the test."""

  def load(cfg, seed):
    raise AssertionError(f"the model {cfg.model.name!r} was loaded")

  monkeypatch.setattr(loop_lib, "load_policy", load)


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


class TestNamedBeforeTheModelLoads:
  """Settings bounded by the model's shape, the held-out set a generated
  task can hold and the mesh against the devices are named before the
  weights load and before the run directory is made."""

  def test_lora_rank_and_generation_length_of_the_default_model(
    self, tmp_path, no_model_loads
  ):
    run_dir = tmp_path / "run"
    cfg = _cfg(
      run_dir,
      **{
        "model.name": "smollm2-135m-instruct",
        "model.lora_rank": 100000,
        "task.max_prompt_tokens": 128,
        "rollout.max_new_tokens": 8100,
      },
    )
    with pytest.raises(ConfigError) as e:
      loop_lib.Trainer(cfg)
    fields = [p.field for p in e.value.problems]
    assert fields == ["model.lora_rank", "rollout.max_new_tokens"]
    assert "hidden_size 576" in str(e.value)
    assert "max_position_embeddings=8192" in str(e.value)
    assert not run_dir.exists()

  def test_the_tiny_models_context(self, tmp_path, no_model_loads):
    cfg = _cfg(tmp_path / "run", **{"rollout.max_new_tokens": 128})
    with pytest.raises(ConfigError, match=r"--rollout.max_new_tokens=128"):
      loop_lib.Trainer(cfg)
    assert not (tmp_path / "run").exists()

  def test_a_held_out_set_that_takes_every_problem(
    self, tmp_path, no_model_loads
  ):
    # "easy" arithmetic has 155 distinct problems: 2000 held-out draws
    # take them all, and the held-out ones leave the training pool.
    run_dir = tmp_path / "run"
    cfg = _cfg(run_dir, **{"task.eval_size": 2000})
    with pytest.raises(ConfigError) as e:
      loop_lib.Trainer(cfg)
    assert [p.field for p in e.value.problems] == ["task.eval_size"]
    assert "draws 155 distinct problems" in str(e.value)
    assert "no training problem" in str(e.value)
    assert not run_dir.exists()
    # 64 draws leave most for training; a larger space holds 2000.
    assert (
      preflight.heldout_problem(cfg.replace({"task.eval_size": 64})) is None
    )
    harder = cfg.replace({"task.difficulty": "hard"})
    assert preflight.heldout_problem(harder) is None

  def test_a_mesh_larger_than_the_devices(self, tmp_path, no_model_loads):
    n = jax.device_count()
    run_dir = tmp_path / "run"
    cfg = _cfg(run_dir, **{"mesh.data": n + 1})
    with pytest.raises(ConfigError) as e:
      loop_lib.Trainer(cfg)
    (problem,) = e.value.problems
    assert problem.field == "mesh.data"
    text = str(e.value)
    assert f"--mesh.data={n + 1} --mesh.fsdp=1 --mesh.tensor=1" in text
    assert f"need {n + 1} devices" in text and f"<= {n}" in text
    assert f"e.g. --mesh.data={n} " in text
    assert "mesh_shape" not in text
    assert not run_dir.exists()

  def test_a_mesh_the_devices_do_not_split_into(self, tmp_path, no_model_loads):
    n = jax.device_count()
    if n % 3 == 0:
      pytest.skip(f"{n} devices split into 3s")
    cfg = _cfg(tmp_path / "run", **{"mesh.data": 3, "mesh.fsdp": -1})
    with pytest.raises(ConfigError) as e:
      loop_lib.Trainer(cfg)
    assert [p.field for p in e.value.problems] == ["mesh.data"]
    assert f"{n} is not divisible by 3" in str(e.value)
    assert "--mesh.data=3 --mesh.fsdp=-1 --mesh.tensor=1" in str(e.value)

  def test_a_minibatch_the_mesh_does_not_split(self, tmp_path, no_model_loads):
    if jax.device_count() < 4:
      pytest.skip("needs 4 (fake) devices: tests/conftest.py")
    cfg = _cfg(
      tmp_path / "run",
      **{
        "mesh.data": 4,
        "rollout.prompts_per_step": 3,
        "rollout.group_size": 2,
      },
    )
    with pytest.raises(ConfigError, match=r"--mesh.data=4; .*minibatch of 6"):
      loop_lib.Trainer(cfg)

  def test_three_devices(self):
    from rljax.models import sharding

    # One process may use its first devices; 4 on 3 cannot.
    assert sharding.mesh_fit_problem((2, 1, 1), 3, use_all=False) is None
    axis, expected = sharding.mesh_fit_problem((4, 1, 1), 3, use_all=False)
    assert axis == "data"
    assert "--mesh.data=4 --mesh.fsdp=1 --mesh.tensor=1 need 4" in expected
    assert "<= 3, the devices visible" in expected
    assert "--mesh.data=3" in expected
    axis, expected = sharding.mesh_fit_problem((2, -1, 1), 3, use_all=False)
    assert axis == "data" and "3 is not divisible by 2" in expected
    # A run of several processes spans every device.
    axis, expected = sharding.mesh_fit_problem((2, 1, 1), 3, use_all=True)
    assert "= 3, the devices to span" in expected


class TestModelConfigWithoutWeights:
  """`models.config_only.read_config`: the shape a model name stands for,
  read from its header or config.json, as the loaders read it."""

  def test_the_default_model(self):
    from rljax.models import config_only

    config = config_only.read_config("smollm2-135m-instruct")
    assert (config.hidden_size, config.max_position_embeddings) == (576, 8192)
    assert (config.num_layers, config.vocab_size) == (30, 49152)
    assert config.tie_word_embeddings

  def test_a_gguf_header_reads_as_the_loader_reads_it(self, tmp_path):
    import gguf
    import numpy as np

    from rljax.models import config_only, gguf_io

    path = str(tmp_path / "m.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_eos_token_id(2)
    # Arrays the parser steps over: strings, numbers, and strings again.
    w.add_token_list(["a", "bb", "ccc"] * 10)
    w.add_token_scores([0.5] * 30)
    w.add_token_merges(["a b", "bb c"])
    w.add_tensor("token_embd.weight", np.zeros((30, 64), np.float32))
    w.add_tensor("blk.0.attn_q.bias", np.zeros((64,), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = gguf_io._reader(path)  # pylint: disable=protected-access
    metadata = gguf_io.read_metadata(reader)
    metadata["llama.vocab_size"] = 30  # load_gguf's fallback: the embedding
    loaded = gguf_io.config_from_gguf_metadata(
      metadata, {t.name for t in reader.tensors}
    )
    assert config_only.read_config(path) == loaded
    assert loaded.vocab_size == 30 and loaded.attention_bias

  def test_an_hf_directory_and_what_cannot_be_read(self, tmp_path):
    from rljax import models
    from rljax.models import config_only

    config = models.tiny_config(max_position_embeddings=256)
    params = models.init_params(config, jax.random.key(0))
    models.save_hf(config, params, str(tmp_path / "hf"))
    assert config_only.read_config(str(tmp_path / "hf")) == config
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\x03\x00")
    assert config_only.read_config(str(tmp_path / "bad.gguf")) is None
    assert config_only.read_config("instrument:/somewhere") is None


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
