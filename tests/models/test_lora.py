"""LoRA: identity at B = 0, gradients only to adapters, merge = unmerged
forward, the UAQ fold with adapters, quantized merges, PEFT export."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models, quant
from rljax.core import objectives
from rljax.models import lora as lora_lib
from rljax.train import optim as optim_lib
from rljax.train import update as update_lib

CONFIG = models.tiny_config()
QWEN3 = models.tiny_config(arch="qwen3", head_dim=16)
TOKENS = jnp.asarray(
  [[5, 17, 99, 3, 64, 21, 8, 40], [42, 7, 7, 120, 11, 9, 1, 2]], jnp.int32
)


def _random_adapters(config, lora, seed=0):
  """Adapters with B != 0 too (init has B = 0, which would hide errors)."""
  adapters = lora_lib.init_adapters(config, lora, jax.random.PRNGKey(seed))
  rng = np.random.default_rng(seed)
  return jax.tree.map(
    lambda x: jnp.asarray(0.1 * rng.standard_normal(x.shape), jnp.float32),
    adapters,
  )


class TestLoraConfig:
  @pytest.mark.parametrize(
    "targets,expected",
    [
      ("all", lora_lib.LORA_TARGETS),
      ("attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
      ("v_proj, q_proj", ("q_proj", "v_proj")),
    ],
  )
  def test_targets(self, targets, expected):
    assert lora_lib.LoraConfig(targets=targets).targets == expected

  @pytest.mark.parametrize(
    "kw,match",
    [
      (dict(rank=0), "rank=0"),
      (dict(alpha=-1.0), "alpha"),
      (dict(dropout=1.0), "dropout=1.0"),
      (dict(targets="qproj"), "targets"),
      (dict(base_dtype="int4"), "base_dtype='int4'"),
    ],
  )
  def test_bad_values_name_the_field(self, kw, match):
    with pytest.raises(ValueError, match=match):
      lora_lib.LoraConfig(**kw)

  def test_scaling(self):
    assert lora_lib.LoraConfig(rank=8, alpha=16.0).scaling == 2.0


@pytest.mark.parametrize("config", [CONFIG, QWEN3], ids=["llama", "qwen3"])
def test_b_zero_is_the_base_model(config, random_params):
  params = random_params(config)
  lora = lora_lib.LoraConfig(rank=4)
  adapters = lora_lib.init_adapters(config, lora, jax.random.PRNGKey(1))
  assert float(jnp.abs(adapters["layers"]["q_proj"]["lora_a"]).max()) > 0
  base = models.forward(config, params, TOKENS)
  merged = lora_lib.merge(config, lora, params, adapters)
  np.testing.assert_array_equal(models.forward(config, merged, TOKENS), base)
  unmerged = lora_lib.attach(lora, params, adapters)
  np.testing.assert_allclose(
    models.forward(config, unmerged, TOKENS), base, atol=1e-6
  )


@pytest.mark.parametrize("targets", ["all", "q_proj,down_proj"])
def test_merge_equals_unmerged_forward(targets, random_params):
  params = random_params(CONFIG)
  lora = lora_lib.LoraConfig(rank=4, alpha=8.0, targets=targets)
  adapters = _random_adapters(CONFIG, lora)
  merged = models.forward(
    CONFIG, lora_lib.merge(CONFIG, lora, params, adapters), TOKENS
  )
  unmerged = models.forward(
    CONFIG, lora_lib.attach(lora, params, adapters), TOKENS
  )
  np.testing.assert_allclose(merged, unmerged, atol=2e-5)
  # and the adapters matter: not the base model.
  assert np.abs(merged - models.forward(CONFIG, params, TOKENS)).max() > 1e-2


def test_merged_kernel_is_w_plus_scaled_ab(random_params):
  params = random_params(CONFIG)
  lora = lora_lib.LoraConfig(rank=2, alpha=6.0, targets="v_proj")
  adapters = _random_adapters(CONFIG, lora)
  a = np.asarray(adapters["layers"]["v_proj"]["lora_a"])
  b = np.asarray(adapters["layers"]["v_proj"]["lora_b"])
  merged = lora_lib.merge(CONFIG, lora, params, adapters)
  expected = np.asarray(params["layers"]["v_proj"]["kernel"]) + 3.0 * a @ b
  np.testing.assert_allclose(
    merged["layers"]["v_proj"]["kernel"], expected, rtol=1e-6, atol=1e-6
  )
  np.testing.assert_array_equal(
    merged["layers"]["q_proj"]["kernel"], params["layers"]["q_proj"]["kernel"]
  )


def _grpo_spec(config, lora):
  return update_lib.UpdateSpec(
    model_config=config,
    loss=objectives.PolicyLossConfig(aggregation="token-mean"),
    param_transform=lora_lib.LoraTransform(config, lora),
  )


def _batch(config, seed=0):
  rng = np.random.default_rng(seed)
  b, t = 4, 10
  tokens = rng.integers(3, config.vocab_size, (b, t)).astype(np.int32)
  mask = np.zeros((b, t - 1), np.float32)
  mask[:, 4:] = 1
  logp = -rng.uniform(1, 5, (b, t - 1)).astype(np.float32)
  adv = (rng.standard_normal((b, 1)) * mask).astype(np.float32)
  return {
    "tokens": jnp.asarray(tokens),
    "attention_mask": jnp.ones((b, t), jnp.int32),
    "loss_mask": jnp.asarray(mask),
    "behav_logp": jnp.asarray(logp),
    "prox_logp": jnp.asarray(logp),
    "advantages": jnp.asarray(adv),
  }


def test_gradients_reach_only_adapters(random_params):
  """The loss is differentiated w.r.t. the adapters only: the gradient tree
  is the adapters' tree, and the frozen base's gradient (if one asked for it)
  is not what the step uses."""
  params = random_params(CONFIG)
  lora = lora_lib.LoraConfig(rank=4, targets="q_proj,up_proj")
  adapters = _random_adapters(CONFIG, lora)
  spec = _grpo_spec(CONFIG, lora)
  batch = _batch(CONFIG)
  d = jnp.sum(batch["loss_mask"])
  denom = {"pg": d, "mask": d}  # no token is rejected (GRPO, no MIS)

  def loss(adapters):
    merged = spec.param_transform(params, adapters)
    return update_lib.policy_loss_sum(spec, merged, batch, denom)[0]

  grads = jax.grad(loss)(adapters)
  chex.assert_trees_all_equal_structs(grads, adapters)
  assert sorted(grads["layers"]) == ["q_proj", "up_proj"]
  for leaf in jax.tree.leaves(grads):
    assert np.isfinite(leaf).all() and np.abs(leaf).max() > 0
  # Chain rule: dL/dB = (α/r) Aᵀ dL/dW, with dL/dW the full model's gradient.
  full = jax.grad(
    lambda p: update_lib.policy_loss_sum(spec, p, batch, denom)[0]
  )(lora_lib.merge(CONFIG, lora, params, adapters))
  a = adapters["layers"]["q_proj"]["lora_a"]
  gw = full["layers"]["q_proj"]["kernel"]
  np.testing.assert_allclose(
    grads["layers"]["q_proj"]["lora_b"],
    lora.scaling * jnp.einsum("lir,lio->lro", a, gw),
    rtol=1e-4,
    atol=1e-7,
  )


@pytest.mark.parametrize("base_dtype", ["float32", "bfloat16", "int8"])
def test_update_step_trains_adapters_only(base_dtype, random_params):
  """A LoRA GRPO update: finite, the frozen base unchanged, the optimizer
  state holds adapter-shaped leaves only."""
  params = random_params(CONFIG)
  lora = lora_lib.LoraConfig(rank=4, dropout=0.1, base_dtype=base_dtype)
  frozen = lora_lib.freeze_base(CONFIG, params, lora)
  frozen_before = jax.tree.map(np.asarray, frozen)
  adapters = lora_lib.init_adapters(CONFIG, lora, jax.random.PRNGKey(0))
  opt = optim_lib.make_optimizer(optim_lib.OptimConfig(1e-2, steps=3))
  state = update_lib.init_train_state(adapters, opt)
  adapter_shapes = {x.shape for x in jax.tree.leaves(adapters)}
  for leaf in jax.tree.leaves(state.opt_state):
    assert leaf.ndim == 0 or leaf.shape in adapter_shapes
  step = update_lib.make_update_step(
    _grpo_spec(CONFIG, lora), opt, donate=False
  )
  for i in range(3):
    state, metrics = step(state, _batch(CONFIG, seed=i), frozen)
    assert metrics["applied"] == 1.0 and np.isfinite(metrics["loss"])
  assert float(jnp.abs(state.params["layers"]["q_proj"]["lora_b"]).max()) > 0
  jax.tree.map(
    np.testing.assert_array_equal,
    jax.tree.map(np.asarray, frozen),
    frozen_before,
  )


def test_int8_base_unmerged_matches_merged(random_params):
  """QLoRA-style: an INT8 base runs unmerged (qdot + low-rank path) and
  agrees with the float32 merge of the same dequantized base."""
  params = random_params(CONFIG)
  lora = lora_lib.LoraConfig(rank=4, base_dtype="int8")
  frozen = lora_lib.freeze_base(CONFIG, params, lora)
  assert isinstance(frozen["layers"]["q_proj"]["kernel"], quant.QTensor)
  adapters = _random_adapters(CONFIG, lora)
  merged = models.forward(
    CONFIG, lora_lib.merge(CONFIG, lora, frozen, adapters), TOKENS
  )
  unmerged = models.forward(
    CONFIG, lora_lib.attach(lora, frozen, adapters), TOKENS
  )
  np.testing.assert_allclose(merged, unmerged, atol=2e-5)


@pytest.mark.parametrize("fold_vo,fold_up_down", [(False, False), (True, True)])
def test_uaq_fold_lora_merge_preserves_the_function(
  fold_vo, fold_up_down, random_params
):
  """merge(fold(W), fold_adapters(A, B)) computes what merge(W, A, B) does,
  and unfolding the merged folded weights gives the plain merged weights."""
  s = 1.5
  params = random_params(CONFIG)
  lora = lora_lib.LoraConfig(rank=4, alpha=8.0)
  adapters = _random_adapters(CONFIG, lora)
  plain = lora_lib.merge(CONFIG, lora, params, adapters)
  folded_base = quant.fold_uaq(CONFIG, params, s, fold_vo, fold_up_down)
  folded_adapters = lora_lib.fold_adapters(
    lora, adapters, lora_lib.uaq_kernel_factors(s, fold_vo, fold_up_down)
  )
  folded = lora_lib.merge(CONFIG, lora, folded_base, folded_adapters)
  np.testing.assert_allclose(
    models.forward(CONFIG, folded, TOKENS),
    models.forward(CONFIG, plain, TOKENS),
    atol=1e-4,
  )
  unfolded = quant.unfold_uaq(CONFIG, folded, s, fold_vo, fold_up_down)
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
    unfolded,
    plain,
  )
  # Back out: adapters with the inverse factors are the plain adapters.
  back = lora_lib.fold_adapters(
    lora,
    folded_adapters,
    lora_lib.uaq_kernel_factors(1 / s, fold_vo, fold_up_down),
  )
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), back, adapters
  )


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_quantized_merge_of_folded_lora_is_uaq_of_the_merged_model(
  mode, random_params
):
  """The rollout path: adapters merged into the UAQ-folded base, then
  quantized, are exactly UAQ applied to the LoRA model W + (α/r)·A B, i.e.
  what full fine-tuning with UAQ would quantize: the fold and LoRA commute."""
  s = 1.5
  params = random_params(CONFIG)
  lora = lora_lib.LoraConfig(rank=4, alpha=8.0)
  adapters = _random_adapters(CONFIG, lora)
  folded_merge = lora_lib.merge(
    CONFIG,
    lora,
    quant.fold_uaq(CONFIG, params, s),
    lora_lib.fold_adapters(lora, adapters, lora_lib.uaq_kernel_factors(s)),
  )
  fold_of_merge = quant.fold_uaq(
    CONFIG, lora_lib.merge(CONFIG, lora, params, adapters), s
  )
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
    folded_merge,
    fold_of_merge,
  )
  q1 = quant.quantize_params(CONFIG, folded_merge, mode=mode, fake=True)
  q2 = quant.quantize_params(CONFIG, fold_of_merge, mode=mode, fake=True)
  agree = np.mean(
    np.argmax(models.forward(CONFIG, q1, TOKENS), -1)
    == np.argmax(models.forward(CONFIG, q2, TOKENS), -1)
  )
  assert agree == 1.0


def test_peft_export_and_merged_hf_weights(tmp_path, random_params):
  """PEFT names, layouts and config; W_hf + (α/r)·B_hf A_hf rebuilds the
  merged HF weight that save_hf writes; the adapter reloads exactly."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  params = random_params(CONFIG)
  lora = lora_lib.LoraConfig(rank=4, alpha=8.0, targets="q_proj,down_proj")
  adapters = _random_adapters(CONFIG, lora)
  lora_lib.save_peft_adapter(
    CONFIG, lora, adapters, tmp_path / "adapter", "org/base"
  )
  meta = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
  assert meta["peft_type"] == "LORA" and meta["r"] == 4
  assert meta["lora_alpha"] == 8.0
  assert meta["target_modules"] == ["down_proj", "q_proj"]
  tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
  assert len(tensors) == 2 * 2 * CONFIG.num_layers
  a_hf = tensors[
    "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
  ]
  b_hf = tensors[
    "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"
  ]
  assert a_hf.shape == (4, 32) and b_hf.shape == (32, 4)  # [r, in], [out, r]
  assert (
    "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight" in tensors
  )

  models.save_hf(
    CONFIG,
    lora_lib.merge(CONFIG, lora, params, adapters),
    tmp_path / "merged",
    dtype="float32",
  )
  merged_hf = load_file(str(tmp_path / "merged" / "model.safetensors"))
  base_hf = models.to_hf_state_dict(CONFIG, params)
  name = "model.layers.1.self_attn.q_proj.weight"
  np.testing.assert_allclose(
    merged_hf[name],
    base_hf[name] + lora.scaling * b_hf @ a_hf,
    rtol=1e-5,
    atol=1e-6,
  )
  lora2, adapters2 = lora_lib.load_peft_adapter(CONFIG, tmp_path / "adapter")
  assert lora2 == lora_lib.LoraConfig(
    rank=4, alpha=8.0, targets="q_proj,down_proj"
  )
  jax.tree.map(np.testing.assert_array_equal, adapters2, adapters)
