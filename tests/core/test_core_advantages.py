"""Tests of rljax.core.advantages: group baselines, whitening, GAE."""

import functools

import chex
import hypothesis
import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

from rljax.core import advantages

SETTINGS = hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
REWARDS = jnp.array([1.0, 0.0, 1.0, 1.0, 2.0, 4.0, 2.0, 4.0])  # two groups of 4


class GrpoTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    out = self.variant(functools.partial(advantages.grpo, group_size=4))(
      REWARDS
    )
    # Group 1: mean .75, population std √.1875; group 2: mean 3, std 1.
    s = np.sqrt(0.1875)
    np.testing.assert_allclose(
      out,
      [0.25 / s, -0.75 / s, 0.25 / s, 0.25 / s, -1.0, 1.0, -1.0, 1.0],
      rtol=1e-5,
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_unbiased_std(self):
    out = self.variant(
      functools.partial(advantages.grpo, group_size=4, ddof=1)
    )(REWARDS)
    np.testing.assert_allclose(out[:4], [0.5, -1.5, 0.5, 0.5], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_constant_group_is_zero_without_nan(self):
    rewards = jnp.array([0.1, 0.1, 0.1, 7.0, 7.0, 7.0])
    for eps in (1e-6, 0.0):
      out = self.variant(
        functools.partial(advantages.grpo, group_size=3, eps=eps)
      )(rewards)
      np.testing.assert_array_equal(out, np.zeros(6))

  @parameterized.parameters(
    (jnp.zeros(6), 4, ValueError, "N=6.*group_size=4"),
    (jnp.zeros((2, 4)), 4, ValueError, "rewards must have rank 1"),
    (jnp.zeros(4), 2.0, TypeError, "group_size"),
    (jnp.zeros(4), 0, ValueError, "group_size must be >= 1"),
  )
  def test_bad_inputs(self, rewards, group_size, error, match):
    with pytest.raises(error, match=match):
      advantages.grpo(rewards, group_size)
    with pytest.raises(ValueError, match="eps"):
      advantages.grpo(jnp.zeros(4), 2, eps=-1.0)


class DrGrpoTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    out = self.variant(functools.partial(advantages.drgrpo, group_size=4))(
      REWARDS
    )
    np.testing.assert_allclose(
      out, [0.25, -0.75, 0.25, 0.25, -1.0, 1.0, -1.0, 1.0], rtol=1e-6
    )

  def test_bad_group(self):
    with pytest.raises(ValueError, match="N=5.*group_size=2"):
      advantages.drgrpo(jnp.zeros(5), 2)


class RlooTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    out = self.variant(functools.partial(advantages.rloo, group_size=4))(
      REWARDS
    )
    # r_0 − mean(0, 1, 1) = 1/3; r_1 − mean(1, 1, 1) = −1; r_4 − mean(4, 2, 4) = −4/3.
    np.testing.assert_allclose(
      out[:5], [1 / 3, -1.0, 1 / 3, 1 / 3, -4 / 3], rtol=1e-5
    )

  @hypothesis.given(
    group_size=st.integers(2, 5),
    n_groups=st.integers(1, 2),
    seed=st.integers(0, 2**31 - 1),
  )
  @SETTINGS
  def test_is_scaled_drgrpo(self, group_size, n_groups, seed):
    rewards = np.random.default_rng(seed).normal(size=group_size * n_groups)
    np.testing.assert_allclose(
      advantages.rloo(rewards, group_size),
      group_size / (group_size - 1) * advantages.drgrpo(rewards, group_size),
      rtol=1e-5,
      atol=1e-6,
    )
    loo = np.array(
      [
        rewards[i]
        - np.delete(
          rewards.reshape(-1, group_size)[i // group_size], i % group_size
        ).mean()
        for i in range(rewards.size)
      ]
    )
    np.testing.assert_allclose(
      advantages.rloo(rewards, group_size), loo, rtol=1e-4, atol=1e-5
    )

  def test_needs_two_samples(self):
    with pytest.raises(ValueError, match="group_size must be >= 2"):
      advantages.rloo(jnp.zeros(3), 1)


class ReinforcePPTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    out = self.variant(advantages.reinforce_pp)(jnp.array([1.0, 2.0, 3.0, 4.0]))
    s = np.sqrt(1.25)
    np.testing.assert_allclose(
      out, np.array([-1.5, -0.5, 0.5, 1.5]) / s, rtol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_masked_tokens_excluded(self):
    returns = jnp.array([[1.0, 2.0, 99.0], [3.0, 4.0, jnp.nan]])
    mask = jnp.array([[1, 1, 0], [1, 1, 0]], bool)
    out = self.variant(advantages.reinforce_pp)(returns, mask)
    s = np.sqrt(1.25)
    np.testing.assert_allclose(
      out, [[-1.5 / s, -0.5 / s, 0.0], [0.5 / s, 1.5 / s, 0.0]], rtol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_constant_batch_is_zero(self):
    out = self.variant(advantages.reinforce_pp)(jnp.full((5,), 0.3))
    np.testing.assert_array_equal(out, np.zeros(5))

  def test_shape_mismatch(self):
    with pytest.raises(ValueError, match="mask has shape"):
      advantages.reinforce_pp(jnp.zeros((2, 3)), jnp.ones((2, 2)))


class ReinforcePPBaselineTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    fn = self.variant(
      functools.partial(advantages.reinforce_pp_baseline, group_size=2)
    )
    out = fn(jnp.array([1.0, 0.0, 3.0, 3.0]))
    # Centered [.5, −.5, 0, 0]: batch mean 0, population std √.125.
    np.testing.assert_allclose(
      out, [0.5 / np.sqrt(0.125), -0.5 / np.sqrt(0.125), 0, 0], rtol=1e-5
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_filler_groups_do_not_enter_the_statistics(self):
    # The second group is dynamic-sampling filler (valid False) and must not
    # shift the statistics of the real groups. Whitened over the first group
    # only: centred [.5, −.5], mean 0, std .5 → [1, −1]; counted, the std
    # would be √.125 → ±1.414.
    fn = self.variant(
      functools.partial(advantages.reinforce_pp_baseline, group_size=2)
    )
    valid = jnp.array([True, True, False, False])
    out = fn(jnp.array([1.0, 0.0, 3.0, 3.0]), valid=valid)
    np.testing.assert_allclose(out, [1.0, -1.0, 0.0, 0.0], rtol=1e-5)


def _group_estimators():
  return {
    "grpo": lambda r, g: advantages.grpo(r, g),
    "drgrpo": advantages.drgrpo,
    "rloo": advantages.rloo,
    "reinforce_pp_baseline": lambda r, g: advantages.reinforce_pp_baseline(
      r, g
    ),
  }


class GroupAdvantagePropertiesTest(parameterized.TestCase):
  """Properties every group-baseline estimator must have, on random rewards."""

  @hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    group_size=st.integers(2, 5),
    n_groups=st.integers(1, 4),
    shift=st.floats(-50, 50),
  )
  @hypothesis.settings(SETTINGS, max_examples=15)
  def test_zero_sum_shift_invariant_and_permutation_equivariant(
    self, seed, group_size, n_groups, shift
  ):
    rng = np.random.default_rng(seed)
    # Binary-ish and graded rewards; some groups may be constant.
    rewards = rng.choice([0.0, 0.5, 1.0], size=n_groups * group_size).astype(
      np.float32
    )
    perm = np.concatenate(
      [
        g * group_size + rng.permutation(group_size)
        for g in rng.permutation(n_groups)
      ]
    )
    for name, fn in _group_estimators().items():
      adv = np.asarray(fn(jnp.asarray(rewards), group_size))
      # Σ_{i∈g} Â_i = 0 within every group.
      np.testing.assert_allclose(
        adv.reshape(n_groups, group_size).sum(-1), 0.0, atol=1e-4, err_msg=name
      )
      # A constant added to every reward changes nothing.
      shifted = np.asarray(
        fn(jnp.asarray(rewards + np.float32(shift)), group_size)
      )
      np.testing.assert_allclose(
        shifted, adv, atol=2e-3, rtol=1e-3, err_msg=name
      )
      # Permuting samples (within and across groups) permutes the advantages.
      permuted = np.asarray(fn(jnp.asarray(rewards[perm]), group_size))
      np.testing.assert_allclose(
        permuted, adv[perm], atol=1e-5, rtol=1e-5, err_msg=name
      )


def gae_by_definition(rewards, values, mask, gamma, lam):
  """Â_t = Σ_l (γλ)^l δ_{t+l}, δ_t = r_t + γ V_{t+1} − V_t, over the valid
  tokens of each row in order (V = 0 after the last one): a direct sum, not
  the recursion the kernel uses."""
  adv = np.zeros_like(rewards, dtype=np.float64)
  for b in range(rewards.shape[0]):
    idx = np.flatnonzero(mask[b])
    r = rewards[b, idx].astype(np.float64)
    val = values[b, idx].astype(np.float64)
    nxt = np.append(val[1:], 0.0)
    delta = r + gamma * nxt - val
    for j, t in enumerate(idx):
      powers = (gamma * lam) ** np.arange(len(idx) - j)
      adv[b, t] = np.sum(powers * delta[j:])
  return adv


def reward_to_go(r, gamma):
  out = np.zeros_like(r)
  running = 0.0
  for t in reversed(range(len(r))):
    running = r[t] + gamma * running
    out[t] = running
  return out


class GaeTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    rewards = jnp.array([[0.0, 0.0, 1.0]])
    values = jnp.array([[0.5, 0.6, 0.7]])
    fn = self.variant(functools.partial(advantages.gae, gamma=0.9, lam=0.8))
    adv, ret = fn(rewards, values, jnp.ones((1, 3), bool))
    # δ = [.04, .03, .3]; Â_2 = .3, Â_1 = .03 + .72·.3, Â_0 = .04 + .72·Â_1.
    a1 = 0.03 + 0.72 * 0.3
    np.testing.assert_allclose(adv, [[0.04 + 0.72 * a1, a1, 0.3]], rtol=1e-5)
    np.testing.assert_allclose(
      ret, [[0.54 + 0.72 * a1, a1 + 0.6, 1.0]], rtol=1e-5
    )

  @hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
  )
  @hypothesis.settings(SETTINGS, max_examples=15)
  def test_general_lambda_is_discounted_sum_of_td_residuals(
    self, seed, gamma, lam
  ):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(3, 7)).astype(np.float32)
    values = rng.normal(size=(3, 7)).astype(np.float32)
    mask = rng.random((3, 7)) < 0.7  # holes anywhere, possibly empty rows
    adv, ret = advantages.gae(
      jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma, lam
    )
    expected = gae_by_definition(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
      ret, np.where(mask, expected + values, 0.0), rtol=1e-4, atol=1e-4
    )

  @hypothesis.given(
    seed=st.integers(0, 2**31 - 1), gamma=st.sampled_from([1.0, 0.9])
  )
  @SETTINGS
  def test_lambda_one_is_reward_to_go_minus_value(self, seed, gamma):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(2, 6)).astype(np.float32)
    values = rng.normal(size=(2, 6)).astype(np.float32)
    adv, ret = advantages.gae(
      rewards, values, np.ones((2, 6), bool), gamma, 1.0
    )
    for i in range(2):
      np.testing.assert_allclose(
        adv[i],
        reward_to_go(rewards[i], gamma) - values[i],
        rtol=1e-4,
        atol=1e-5,
      )
      np.testing.assert_allclose(
        ret[i], reward_to_go(rewards[i], gamma), rtol=1e-4, atol=1e-5
      )

  @chex.variants(with_jit=True, without_jit=True)
  def test_lambda_zero_is_td_residual(self):
    rewards = jnp.array([[1.0, 2.0, 3.0]])
    values = jnp.array([[0.5, -1.0, 2.0]])
    fn = self.variant(functools.partial(advantages.gae, gamma=0.5, lam=0.0))
    adv, _ = fn(rewards, values, jnp.ones((1, 3), bool))
    # δ_t = r_t + γ V_{t+1} − V_t, V after the last token = 0.
    np.testing.assert_allclose(
      adv, [[1.0 - 0.5 - 0.5, 2.0 + 1.0 + 1.0, 3.0 - 2.0]], rtol=1e-6
    )

  @chex.variants(with_jit=True, without_jit=True)
  def test_masked_positions_are_skipped(self):
    # Row 0 has an interior masked token (e.g. tool output) and trailing
    # padding with garbage; it must equal row 1, the same tokens compacted.
    rewards = jnp.array(
      [[0.5, 9.0, 0.0, 1.0, jnp.nan], [0.5, 0.0, 1.0, 0.0, 0.0]]
    )
    values = jnp.array(
      [[0.2, 9.0, 0.4, 0.3, jnp.inf], [0.2, 0.4, 0.3, 0.0, 0.0]]
    )
    mask = jnp.array([[1, 0, 1, 1, 0], [1, 1, 1, 0, 0]], bool)
    fn = self.variant(functools.partial(advantages.gae, gamma=0.9, lam=0.7))
    adv, ret = fn(rewards, values, mask)
    chex.assert_tree_all_finite((adv, ret))
    np.testing.assert_allclose(
      adv[0, np.array([0, 2, 3])], adv[1, :3], rtol=1e-6
    )
    np.testing.assert_allclose(
      ret[0, np.array([0, 2, 3])], ret[1, :3], rtol=1e-6
    )
    np.testing.assert_array_equal(adv[0, np.array([1, 4])], 0.0)
    np.testing.assert_array_equal(ret[1, 3:], 0.0)

  def test_per_sequence_lambda(self):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(3, 4)).astype(np.float32)
    values = rng.normal(size=(3, 4)).astype(np.float32)
    mask = np.ones((3, 4), bool)
    lams = np.array([0.0, 0.5, 1.0], np.float32)
    adv, ret = advantages.gae(rewards, values, mask, 0.9, jnp.asarray(lams))
    for i, lam in enumerate(lams):
      a, r = advantages.gae(
        rewards[i : i + 1], values[i : i + 1], mask[i : i + 1], 0.9, float(lam)
      )
      np.testing.assert_allclose(adv[i], a[0], rtol=1e-6)
      np.testing.assert_allclose(ret[i], r[0], rtol=1e-6)

  def test_bad_inputs(self):
    x = jnp.zeros((2, 3))
    with pytest.raises(
      ValueError, match=r"lam must be a scalar or shape \(2,\)"
    ):
      advantages.gae(x, x, x, 1.0, jnp.ones(3))
    with pytest.raises(ValueError, match="gamma"):
      advantages.gae(x, x, x, 1.5, 0.9)
    with pytest.raises(ValueError, match="lam"):
      advantages.gae(x, x, x, 1.0, -0.1)
    with pytest.raises(ValueError, match="values has shape"):
      advantages.gae(x, jnp.zeros((2, 4)), x, 1.0, 0.9)


class DiscountedReturnsTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    fn = self.variant(
      functools.partial(advantages.discounted_returns, gamma=0.5)
    )
    out = fn(jnp.array([[1.0, 2.0, 3.0, 5.0]]), jnp.array([[1, 1, 1, 0]], bool))
    np.testing.assert_allclose(out, [[2.75, 3.5, 3.0, 0.0]], rtol=1e-6)


class VcppoGaeTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_decoupled_lambdas(self):
    rewards = jnp.array([[0.0, 0.0, 1.0]])
    values = jnp.array([[0.5, 0.6, 0.7]])
    mask = jnp.ones((1, 3), bool)
    fn = self.variant(
      functools.partial(
        advantages.vcppo_gae, gamma=1.0, lam_actor=0.0, lam_critic=1.0
      )
    )
    adv, ret = fn(rewards, values, mask)
    # Critic: Monte-Carlo returns (λ=1); actor: TD residuals (λ=0).
    np.testing.assert_allclose(ret, [[1.0, 1.0, 1.0]], rtol=1e-6)
    np.testing.assert_allclose(adv, [[0.1, 0.1, 0.3]], rtol=1e-5)


class VapoLambdaTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    fn = self.variant(functools.partial(advantages.vapo_lambda, alpha=0.05))
    out = fn(jnp.array([100, 20, 0, 10, 1000]))
    np.testing.assert_allclose(out, [0.8, 0.0, 0.0, 0.0, 0.98], rtol=1e-6)

  def test_bad_alpha(self):
    with pytest.raises(ValueError, match="alpha"):
      advantages.vapo_lambda(jnp.array([10]), alpha=0.0)

  def test_feeds_gae(self):
    lam = advantages.vapo_lambda(jnp.array([40, 400]), 0.05)
    adv, _ = advantages.gae(
      jnp.ones((2, 3)), jnp.zeros((2, 3)), jnp.ones((2, 3)), 1.0, lam
    )
    self.assertEqual(adv.shape, (2, 3))
    self.assertLess(
      float(adv[0, 0]), float(adv[1, 0])
    )  # smaller λ, shorter horizon


if __name__ == "__main__":
  absltest.main()
