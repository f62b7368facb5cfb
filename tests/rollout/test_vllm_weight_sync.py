"""Weight sync to a vLLM sidecar without a server: checkpoints written in
the engine's formats and dtypes, timed syncs, weights shared with the
engine, and the finite check of every synced tensor."""

import json
import os

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from rljax.models import safetensors_io
from rljax.rollout import vllm_sidecar, weight_sync
from rljax.rollout.vllm import sync as vllm_sync
from rljax.rollout.vllm_sidecar import SidecarError, VLLMSidecar

BF16 = np.dtype(ml_dtypes.bfloat16)


def _manifest(**specs):
  return weight_sync.CheckpointManifest(
    {
      name: safetensors_io.TensorSpec(shape, np.dtype(dtype))
      for name, (shape, dtype) in specs.items()
    },
    source="test-ckpt",
  )


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

    from rljax import (
      models,  # pylint: disable=g-import-not-at-top
      quant,  # pylint: disable=g-import-not-at-top
    )

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
