"""acr_active_fraction: how often ACR's enlarged upper bound changes a token's
outcome against plain TIS (whether ACR acts at all in a run), on
hand-computed tokens."""

import chex
import jax.numpy as jnp
from absl.testing import absltest

from rljax.core import objectives
from rljax.core.objectives import PolicyLossConfig


class AcrActiveFractionTest(chex.TestCase):
  """Four valid tokens and one padding token, ε_high = 0.2, C = 2.

  token  ρ = π_prox/π_behav   R = π/π_prox   A    u = max(1, ρ/C)  bound (1.2·u)
  0      4                    1.5            +1   2                2.4  → ACR lets it through, TIS clips: active
  1      4                    3.0            +1   2                2.4  → clipped by both: not active
  2      1                    1.5            +1   1                1.2  → clipped by both: not active
  3      4                    1.5            −1   2                2.4  → A < 0: the upper bound never matters
  4      (padding)
  → acr: 1/4 of the kept tokens; tis: 0.
  """

  def _inputs(self):
    behav = jnp.log(jnp.array([[0.1, 0.1, 0.4, 0.1, 0.5]]))
    prox = jnp.log(jnp.array([[0.4, 0.4, 0.4, 0.4, 0.5]]))
    logp = prox + jnp.log(jnp.array([[1.5, 3.0, 1.5, 1.5, 1.0]]))
    adv = jnp.array([[1.0, 1.0, 1.0, -1.0, 1.0]])
    mask = jnp.array([[True, True, True, True, False]])
    return logp, prox, behav, adv, mask

  @chex.variants(with_jit=True, without_jit=True)
  def test_acr_counts_only_tokens_its_bound_lets_through(self):
    logp, prox, behav, adv, mask = self._inputs()

    def fraction(correction):
      cfg = PolicyLossConfig(
        correction=correction, eps_low=0.2, eps_high=0.2, tis_cap=2.0
      )
      fn = self.variant(lambda *a: objectives.policy_loss(*a, cfg)[1])
      return float(fn(logp, prox, behav, adv, mask)["acr_active_fraction"])

    self.assertAlmostEqual(fraction("acr"), 0.25, places=6)
    for other in ("tis", "naive", "decoupled", "mis"):
      self.assertEqual(fraction(other), 0.0, other)

  def test_clip_high_of_tis_minus_acr_is_the_active_fraction(self):
    """The tokens ACR unclips are exactly the ones TIS clips and ACR does not."""
    logp, prox, behav, adv, mask = self._inputs()
    get = lambda c: objectives.policy_loss(
      logp,
      prox,
      behav,
      adv,
      mask,
      PolicyLossConfig(correction=c, eps_high=0.2, tis_cap=2.0),
    )[1]
    tis, acr = get("tis"), get("acr")
    self.assertAlmostEqual(
      float(tis["clip_fraction_high"] - acr["clip_fraction_high"]),
      float(acr["acr_active_fraction"]),
      places=6,
    )

  def test_cispo_counts_either_sign(self):
    logp, prox, behav, adv, mask = self._inputs()
    cfg = PolicyLossConfig(
      surrogate="cispo", correction="acr", eps_high=0.2, tis_cap=2.0
    )
    m = objectives.policy_loss(logp, prox, behav, adv, mask, cfg)[1]
    # Tokens 0 and 3 (R = 1.5 inside (1.2, 2.4]) whatever the sign of A.
    self.assertAlmostEqual(float(m["acr_active_fraction"]), 0.5, places=6)

  def test_reinforce_has_no_bound(self):
    logp, prox, behav, adv, mask = self._inputs()
    cfg = PolicyLossConfig(surrogate="reinforce", correction="acr")
    m = objectives.policy_loss(logp, prox, behav, adv, mask, cfg)[1]
    self.assertEqual(float(m["acr_active_fraction"]), 0.0)


if __name__ == "__main__":
  absltest.main()
