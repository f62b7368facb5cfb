"""Update-Aware Quantization (UAQ, QuRL §4.3): invariant scaling folded into params.

Invariant scaling (QuRL Eq. 11, after SmoothQuant): W X = (W / s)(s X). An
RMSNorm computes n(x) = x / rms(x) · γ, so scaling γ by s scales every linear
fed by that norm on its input side, and dividing those kernels by s along their
input dimension keeps the function unchanged:

  attn_norm.γ ← s·γ,  q/k/v.W ← W / s        (Qwen2 q/k/v biases unchanged:
  mlp_norm.γ  ← s·γ,  gate/up.W ← W / s       they add after the product).

With per-output-channel quantization the quantization error of W/s is that of
W divided by s (QuRL Eq. 12), while ∇_{W/s} L = s·∇_W L because the layer's
input was scaled by s. An optimizer that normalises gradients (Adam) then takes
the same-sized steps on a matrix s times smaller: relative to the quantization
grid, updates grow by s and the ratio update² / quantization-error² by s².

Under Adam, UAQ is a learning-rate change, and nothing more. A leaf folded
by s^k (k = −1 for the q/k/v/gate/up kernels, +1 for the two norm gains)
has gradient s^(−k)·g in the folded coordinates; Adam's step
m̂/(√v̂ + ε) does not change when every gradient of a tensor is scaled by
the same constant (for ε ≪ √v̂), so the folded leaf moves by the plain
step, and mapped back (× s^(−k)) the plain leaf moves by s^(−k) times it:

  Adam(lr) on fold_uaq(θ, s)  ≡  Adam with lr·s on q/k/v/gate/up kernels and
                                 lr/s on attn_norm.γ, mlp_norm.γ, on θ,

with weight decay 0 (decoupled decay λ·θ is not rescaled with the step).
The quantized engine sees the same thing too: per-output-channel absmax
quantization gives Q(W/s) = Q(W)/s (the same codes, the scales / s), and
the norm gains carry the s back, so the engine of the UAQ run computes the
function of the engine of the per-tensor-learning-rate run.
`tests/quant/test_uaq_equivalence.py` checks it on two real Trainers with
INT8 rollout, step for step: the same θ (unfolded), the same INT8 codes,
the same sampled tokens. "Updates s times larger relative to the rounding
step" is therefore the same statement as "a learning rate s times larger
on those kernels": an accuracy gain from UAQ is a gain from that
learning-rate change, and QuRL Table 4's control (s = 1, lr × s) differs
from UAQ only in which tensors get the larger rate.

Two conditions. (1) Adam's ε: the folded run adds ε to s^(−k)·√v̂, so
where √v̂ is within a few orders of ε (1e-8) of it the steps differ
slightly. (2) Gradient clipping: a global-norm clip (the trainer's
`optim.max_grad_norm`, 1.0 by default) measures the folded gradient
g·s^(−k), so on every step where it binds the UAQ run is clipped by
another factor than the plain run with per-tensor learning rates; the two
are the same again when the plain run's clip measures g·s^(−k) (the test
checks both). An unquantized run with s ≠ 1 (`--rollout.quant=none
--rollout.uaq_scale=s`) is the same learning-rate change without rounding.

Optional further folds through linear paths inside a block:
  * v → o: attention output is Σ_j softmax_ij v_j, linear in v, so scaling v's
    outputs (kernel columns and bias) by s and dividing o's input rows by s is
    exact. With a scalar s every head is scaled alike, so grouped-query heads
    shared by several query heads stay consistent. v's kernel then returns to
    W_v (the input-side /s and output-side ·s cancel): this moves the benefit
    from v to o.
  * up → down: SwiGLU is silu(gate) ⊙ up, linear in up, so scaling up's output
    columns by s and dividing down's input rows by s is exact; up's kernel
    likewise returns to W_up and down gains.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

from rljax.quant import params as qparams_lib
from rljax.quant.qtensor import QTensor

Params = dict[str, Any]


def _check_scale(scale: Any) -> float:
  try:
    s = float(scale)
  except (TypeError, ValueError):
    raise TypeError(
      f"UAQ scale: expected a positive number, got {scale!r}"
    ) from None
  if not math.isfinite(s) or s <= 0:
    raise ValueError(f"UAQ scale={scale!r}; expected a finite number > 0")
  return s


def uaq_powers(
  fold_vo: bool = False, fold_up_down: bool = False
) -> dict[tuple[str, str], int]:
  """k such that each leaf of `params["layers"]` is multiplied by s^k.

  Kernels are scaled as a whole because s is a scalar: dividing the input rows
  of all channels by s is dividing the matrix by s.
  """
  k = {
    ("attn_norm", "scale"): 1,
    ("mlp_norm", "scale"): 1,
    ("q_proj", "kernel"): -1,
    ("k_proj", "kernel"): -1,
    ("v_proj", "kernel"): -1,
    ("gate_proj", "kernel"): -1,
    ("up_proj", "kernel"): -1,
  }
  if fold_vo:
    k[("v_proj", "kernel")] = 0  # (1/s on the input side) · (s on outputs)
    k[("v_proj", "bias")] = 1
    k[("o_proj", "kernel")] = -1
  if fold_up_down:
    k[("up_proj", "kernel")] = 0
    k[("down_proj", "kernel")] = -1
  return k


def _apply_powers(
  config: Any, params: Params, scale: float, powers, where: str
) -> Params:
  del config
  s = jnp.float32(_check_scale(scale))
  qparams_lib._check_params(params, where)
  layers = params["layers"]
  new_leaves = {}
  for (module, leaf), k in powers.items():
    if k == 0 or leaf not in layers.get(module, {}):
      continue  # absent leaf: v bias only exists in Qwen2-style models
    x = layers[module][leaf]
    if isinstance(x, QTensor):
      raise TypeError(
        f"{where}: layers/{module}/{leaf} is a QTensor; fold the full-"
        "precision params, then quantize"
      )
    # One correctly rounded float32 op per weight (x·s or x/s; not x·(1/s),
    # which would round twice), so the fold perturbs the function as little
    # as float32 allows; bf16 params round once more, at the end.
    x32 = x.astype(jnp.float32)
    new_leaves[("layers", module, leaf)] = (
      x32 * s if k > 0 else x32 / s
    ).astype(x.dtype)
  return qparams_lib.replace_paths(params, new_leaves)


def fold_uaq(
  config: Any,
  params: Params,
  scale: float = 1.5,
  fold_vo: bool = False,
  fold_up_down: bool = False,
) -> Params:
  """Folds UAQ's invariant scaling into `params` (same function, new weights).

  attn_norm.γ, mlp_norm.γ ← s·γ;  q/k/v/gate/up kernels ← W / s; optionally
  the v→o and up→down folds (see module docstring). QuRL uses s = 1.5.

  Args:
    config: decoder config (kept for the contract).
    params: full-precision params tree (`docs/CONTRACTS.md`).
    scale: s > 0.
    fold_vo: also fold s through v → o.
    fold_up_down: also fold s through up → down.

  Returns:
    A new params tree computing the same logits up to float rounding.
  """
  return _apply_powers(
    config, params, scale, uaq_powers(fold_vo, fold_up_down), "fold_uaq"
  )


def unfold_uaq(
  config: Any,
  params: Params,
  scale: float = 1.5,
  fold_vo: bool = False,
  fold_up_down: bool = False,
) -> Params:
  """Inverse of `fold_uaq` with the same arguments: back to the plain model.

  Use it to export or evaluate a model trained in the folded parametrisation.
  """
  inverse = {leaf: -k for leaf, k in uaq_powers(fold_vo, fold_up_down).items()}
  return _apply_powers(config, params, scale, inverse, "unfold_uaq")
