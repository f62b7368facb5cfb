"""models.fusion: q/k/v and gate/up as one matmul each, same outputs."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax import quant
from rljax.models import fusion
from rljax.models import lora as lora_lib
from rljax.quant.qtensor import QTensor

CONFIG = models.tiny_config(arch="qwen2")  # q/k/v biases fuse too
forward = jax.jit(models.forward, static_argnums=0)


@pytest.fixture(scope="module")
def params(random_params):
  return random_params(CONFIG)


def _batch():
  rng = np.random.default_rng(1)
  tokens = rng.integers(3, CONFIG.vocab_size, (2, 7)).astype(np.int32)
  return jnp.asarray(tokens), jnp.ones((2, 7), jnp.int32)


def _count_dots(config, params):
  tokens, mask = _batch()
  jaxpr = jax.make_jaxpr(functools.partial(models.forward, config))(
    params, tokens, mask
  )

  def walk(jx):
    n = 0
    for eqn in jx.eqns:
      n += eqn.primitive.name == "dot_general"
      for sub in jax.core.jaxprs_in_params(eqn.params):
        n += walk(sub)
    return n

  return walk(jaxpr.jaxpr)


class TestFuseProjections:
  def test_layout_and_shapes(self, params):
    fused = fusion.fuse_projections(params)
    layers = fused["layers"]
    for gone in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
      assert gone not in layers
    hd, n = CONFIG.head_dim, CONFIG.num_layers
    width = (CONFIG.num_heads + 2 * CONFIG.num_kv_heads) * hd
    d, f = CONFIG.hidden_size, CONFIG.intermediate_size
    chex.assert_shape(layers["qkv_proj"]["kernel"], (n, d, width))
    chex.assert_shape(layers["qkv_proj"]["bias"], (n, width))
    chex.assert_shape(layers["gate_up_proj"]["kernel"], (n, d, 2 * f))
    # Columns in [q | k | v] order.
    q_width = CONFIG.num_heads * hd
    np.testing.assert_array_equal(
      layers["qkv_proj"]["kernel"][
        ..., q_width : q_width + CONFIG.num_kv_heads * hd
      ],
      params["layers"]["k_proj"]["kernel"],
    )
    models.check_params(CONFIG, fused)
    # The contract tree is untouched, and fusing twice is fusing once.
    assert "q_proj" in params["layers"]
    again = fusion.fuse_projections(fused)
    chex.assert_trees_all_equal(again, fused)

  def test_forward_unchanged(self, params):
    tokens, mask = _batch()
    want = forward(CONFIG, params, tokens, mask)
    got = forward(CONFIG, fusion.fuse_projections(params), tokens, mask)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

  def test_five_matmuls_become_two(self, params):
    # Per layer 7 projections -> 4; the scan traces one layer (+ the head
    # and attention's two einsums stay).
    assert (
      _count_dots(CONFIG, params)
      - _count_dots(CONFIG, fusion.fuse_projections(params))
      == 3
    )

  @pytest.mark.parametrize("mode", ["int8", "fp8", "int8_wo"])
  def test_quantized_outputs_equal(self, params, mode):
    # W8A8: one activation quantization for the group, the same per-token
    # scale as each projection's own, so the products are the same.
    qparams = quant.quantize_params(CONFIG, params, mode=mode)
    fused = fusion.fuse_projections(qparams)
    kernel = fused["layers"]["qkv_proj"]["kernel"]
    assert isinstance(kernel, QTensor) and kernel.mode == mode
    tokens, mask = _batch()
    np.testing.assert_allclose(
      forward(CONFIG, fused, tokens, mask),
      forward(CONFIG, qparams, tokens, mask),
      rtol=1e-5,
      atol=1e-5,
    )

  def test_per_tensor_scales_become_per_channel(self, params):
    qparams = quant.quantize_params(CONFIG, params, mode="fp8", per_tensor=True)
    kernel = fusion.fuse_projections(qparams)["layers"]["gate_up_proj"][
      "kernel"
    ]
    f = CONFIG.intermediate_size
    chex.assert_shape(kernel.scale, (CONFIG.num_layers, 1, 2 * f))
    np.testing.assert_array_equal(
      kernel.scale[..., :f],
      jnp.broadcast_to(
        qparams["layers"]["gate_proj"]["kernel"].scale,
        (CONFIG.num_layers, 1, f),
      ),
    )

  def test_lora_groups_stay_apart(self, params):
    cfg = lora_lib.LoraConfig(rank=2, alpha=4.0, targets=("q_proj",))
    adapters = lora_lib.init_adapters(CONFIG, cfg, jax.random.PRNGKey(0))
    attached = lora_lib.attach(cfg, params, adapters)
    layers = fusion.fuse_projections(attached)["layers"]
    assert "qkv_proj" not in layers and "lora_a" in layers["q_proj"]
    assert "gate_up_proj" in layers
    tokens, mask = _batch()
    np.testing.assert_allclose(
      forward(CONFIG, {**attached, "layers": layers}, tokens, mask),
      forward(CONFIG, attached, tokens, mask),
      rtol=1e-5,
      atol=1e-5,
    )

  def test_mixed_formats_stay_apart(self, params):
    layers = dict(params["layers"])
    layers["up_proj"] = {
      "kernel": layers["up_proj"]["kernel"].astype(jnp.bfloat16)
    }
    fused = fusion.fuse_projections({**params, "layers": layers})["layers"]
    assert "gate_up_proj" not in fused and "qkv_proj" in fused

  def test_check_params_names_a_bad_fused_leaf(self, params):
    fused = fusion.fuse_projections(params)
    layers = dict(fused["layers"])
    layers["gate_up_proj"] = {
      "kernel": layers["gate_up_proj"]["kernel"][..., :-1]
    }
    with pytest.raises(ValueError, match=r"gate_up_proj.*expected"):
      models.check_params(CONFIG, {**fused, "layers": layers})
