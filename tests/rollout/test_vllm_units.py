"""Tests of the vLLM sidecar's parts that need no server: the weight-sync
checkpoint writer and its checks, the request/response translation and
configs."""

import json
import os

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from rljax.models import safetensors_io
from rljax.rollout import base, vllm_sidecar, weight_sync
from rljax.rollout.vllm import api as vllm_api
from rljax.rollout.vllm_sidecar import VLLMSidecarConfig

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
