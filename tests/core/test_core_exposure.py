"""ACR exposure kernels (rljax.core.exposure) on hand-computed tokens."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from rljax.core import exposure, objectives
from rljax.core.objectives import PolicyLossConfig

EPS, CAP = 0.2, 2.0


def _batch():
  """Seven tokens of one sequence, ε_low = ε_high = 0.2, C = 2.

  token  ρ   R    A    w=min(ρ,C)  ACR bound 1.2·max(1,ρ/C)  outcome
  0      4   1.5  +1   2           2.4   eligible; TIS clips, ACR not: ACTIVE;
                                         mass w·R·|A| = 3
  1      4   3.0  +1   2           2.4   eligible; clipped by both
  2      1   1.5  +1   1           1.2   ρ ≤ C; clipped by both
  3      4   1.5  −1   2           2.4   A < 0: upper bound irrelevant;
                                         unclipped, mass 3
  4      1   1.0  +2   1           1.2   unclipped, mass 2
  5      1   0.5  −1   1           1.2   R < 0.8 with A < 0: clipped low
  6      (padding: its values are garbage and must not count)

  would change 1/6; eligible 2/6; P(active | eligible) 1/2;
  gradient share 3 / (3 + 3 + 2) = 0.375.
  """
  behav = jnp.log(jnp.array([[0.1, 0.1, 0.4, 0.1, 0.4, 0.4, 0.01]]))
  prox = jnp.log(jnp.array([[0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.9]]))
  logp = prox + jnp.log(jnp.array([[1.5, 3.0, 1.5, 1.5, 1.0, 0.5, 9.0]]))
  adv = jnp.array([[1.0, 1.0, 1.0, -1.0, 2.0, -1.0, 5.0]])
  mask = jnp.array([[True] * 6 + [False]])
  return logp, prox, behav, adv, mask


class AcrExposureTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_tokens(self):
    fn = self.variant(
      lambda *a: exposure.acr_exposure(*a, eps_low=EPS, eps_high=EPS, cap=CAP)
    )
    e = fn(*_batch())
    np.testing.assert_allclose(float(e.would_change_fraction), 1 / 6, 1e-6)
    np.testing.assert_allclose(float(e.eligible_fraction), 2 / 6, 1e-6)
    np.testing.assert_allclose(float(e.active_given_eligible), 0.5, 1e-6)
    np.testing.assert_allclose(float(e.gradient_share), 0.375, 1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_one_update_per_rollout_has_no_exposure(self):
    """R ≡ 1 (π_prox = sg(π_θ)): ACR is TIS whatever ρ is."""
    _, prox, behav, adv, mask = _batch()
    e = self.variant(
      lambda *a: exposure.acr_exposure(*a, eps_low=EPS, eps_high=EPS, cap=CAP)
    )(prox, prox, behav, adv, mask)
    self.assertEqual(float(e.would_change_fraction), 0.0)
    self.assertEqual(float(e.gradient_share), 0.0)
    self.assertEqual(float(e.active_given_eligible), 0.0)
    # Eligibility does not depend on R: the same two tokens.
    np.testing.assert_allclose(float(e.eligible_fraction), 2 / 6, 1e-6)

  def test_empty_mask_and_infinite_cap_give_zero_not_nan(self):
    logp, prox, behav, adv, mask = _batch()
    empty = exposure.acr_exposure(
      logp,
      prox,
      behav,
      adv,
      jnp.zeros_like(mask),
      eps_low=EPS,
      eps_high=EPS,
      cap=CAP,
    )
    uncapped = exposure.acr_exposure(
      logp, prox, behav, adv, mask, eps_low=EPS, eps_high=EPS, cap=np.inf
    )
    for e in (empty, uncapped):
      for name, x in e._asdict().items():
        self.assertEqual(float(x), 0.0, name)

  def test_single_quantity_functions_agree(self):
    args = _batch()
    np.testing.assert_allclose(
      float(exposure.acr_would_change_fraction(*args, eps_high=EPS, cap=CAP)),
      1 / 6,
      1e-6,
    )
    np.testing.assert_allclose(
      float(
        exposure.acr_gradient_share(*args, eps_low=EPS, eps_high=EPS, cap=CAP)
      ),
      0.375,
      1e-6,
    )
    np.testing.assert_allclose(
      float(exposure.acr_active_given_eligible(*args, eps_high=EPS, cap=CAP)),
      0.5,
      1e-6,
    )

  def test_gradient_share_is_that_of_the_acr_loss_gradient(self):
    """Σ_active |∂ℓ/∂logp| / Σ |∂ℓ/∂logp| of the trained ACR loss itself."""
    logp, prox, behav, adv, mask = _batch()
    cfg = PolicyLossConfig(
      correction="acr", eps_low=EPS, eps_high=EPS, tis_cap=CAP
    )
    grad = jax.grad(
      lambda lp: objectives.policy_loss_per_token(
        lp, prox, behav, adv, mask, cfg
      )[0].sum()
    )(logp)
    g = np.abs(np.asarray(grad))[0]
    np.testing.assert_allclose(g[0] / g.sum(), 0.375, rtol=1e-5)

  def test_would_change_equals_acr_active_fraction_of_an_acr_run(self):
    """Under correction=acr (keep = valid) the kernel counts exactly the
    tokens the loss's own acr_active_fraction counts."""
    args = _batch()
    cfg = PolicyLossConfig(
      correction="acr", eps_low=EPS, eps_high=EPS, tis_cap=CAP
    )
    m = objectives.policy_loss(*args, cfg)[1]
    e = exposure.acr_exposure(*args, eps_low=EPS, eps_high=EPS, cap=CAP)
    np.testing.assert_allclose(
      float(m["acr_active_fraction"]), float(e.would_change_fraction), 1e-6
    )

  def test_sequence_advantages_broadcast(self):
    logp, prox, behav, _, mask = _batch()
    e = exposure.acr_exposure(
      logp,
      prox,
      behav,
      jnp.array([1.0]),
      mask,
      eps_low=EPS,
      eps_high=EPS,
      cap=CAP,
    )
    # All A = +1: tokens 0 (active) and 1 eligible; 3 is now eligible too
    # (ρ = 4, R = 1.5 in (1.2, 2.4]): active.
    np.testing.assert_allclose(float(e.would_change_fraction), 2 / 6, 1e-6)
    np.testing.assert_allclose(float(e.active_given_eligible), 2 / 3, 1e-6)

  def test_bad_input_names_the_argument(self):
    logp, prox, behav, adv, mask = _batch()
    with self.assertRaisesRegex(ValueError, "cap"):
      exposure.acr_exposure(
        logp, prox, behav, adv, mask, eps_low=EPS, eps_high=EPS, cap=0.5
      )
    with self.assertRaisesRegex(ValueError, "shape"):
      exposure.acr_exposure(
        logp,
        prox[:, :3],
        behav,
        adv,
        mask,
        eps_low=EPS,
        eps_high=EPS,
        cap=CAP,
      )

  def test_metric_names(self):
    e = exposure.acr_exposure(*_batch(), eps_low=EPS, eps_high=EPS, cap=CAP)
    self.assertEqual(
      sorted(exposure.exposure_metrics(e)),
      sorted(exposure.METRIC_NAMES.values()),
    )


if __name__ == "__main__":
  absltest.main()
