"""A response whose tokens were sampled by two policy versions: the loss
needs nothing but each token's own behaviour log-prob.

The kernel tests: tokens 0-2 come from version v (policy A), tokens 3-5
from v + 1 (policy B, pushed mid-generation); π_prox = θ_old at batch time
for all of them. The token-level corrections (decoupled, tis, acr, mis)
give every token exactly the weight its own ρ_t = π_prox/π_behav,t defines,
whichever version sampled it. `TestThroughTheTrainer` sends such a
response from the engine, with its per-token versions, through
`build_batch` into two PPO epochs of the trainer's update.
"""

import functools

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np

from rljax.core import objectives
from rljax.core.objectives import PolicyLossConfig

SETTINGS = hypothesis.settings(max_examples=30, deadline=None, derandomize=True)
TOKEN_LEVEL = ("decoupled", "tis", "acr", "mis")

CAP = 2.5
EPS = 0.2
# π_prox(o_t) of θ_old, and each version's probability of the token it
# sampled: A (version v) sampled tokens 0-2, B (version v + 1) tokens 3-5.
PROX = np.array([0.5, 0.4, 0.2, 0.3, 0.6, 0.1])
PROB_A = np.array([0.25, 0.4, 0.05])  # ρ = 2, 1, 4
PROB_B = np.array([0.6, 0.2, 0.1])  # ρ = 0.5, 3, 1
VERSION = np.array([7, 7, 7, 8, 8, 8])  # v = 7: the first push, then 8
RHO = np.array([2.0, 1.0, 4.0, 0.5, 3.0, 1.0])
# The current policy's ratio R = π_θ/π_prox: 1.5 on tokens 2 and 4, where
# the clip's upper bound (1 + ε)·u decides.
R = np.array([1.0, 1.0, 1.5, 1.0, 1.5, 1.0])


def mixed_row():
  """(logp, prox_logp, behav_logp, mask) [1, 6]: behav_logp of each token
  from the version that sampled it."""
  prob_a = np.concatenate([PROB_A, np.full(3, np.nan)])
  prob_b = np.concatenate([np.full(3, np.nan), PROB_B])
  behav = np.where(VERSION == 7, np.log(prob_a), np.log(prob_b))
  prox = np.log(PROX)
  logp = prox + np.log(R)
  as_row = lambda x: jnp.asarray(x[None], jnp.float32)
  return as_row(logp), as_row(prox), as_row(behav), jnp.ones((1, 6), bool)


class MixedVersionWeightsTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_importance_weights_per_token(self):
    # By hand from each token's own ρ_t, C = 2.5:
    #   decoupled  w = ρ
    #   tis, acr   w = min(ρ, C); acr's upper scale max(1, ρ/C)
    #   mis        w = ρ, tokens with ρ > C (2 and 4) dropped
    expected = {
      "decoupled": ([2, 1, 4, 0.5, 3, 1], [1] * 6, [1] * 6),
      "tis": ([2, 1, 2.5, 0.5, 2.5, 1], [1] * 6, [1] * 6),
      "acr": ([2, 1, 2.5, 0.5, 2.5, 1], [1, 1, 1.6, 1, 1.2, 1], [1] * 6),
      "mis": ([2, 1, 0, 0.5, 0, 1], [1] * 6, [1, 1, 0, 1, 0, 1]),
    }
    _, prox, behav, mask = mixed_row()
    for correction, (weight, scale, keep) in expected.items():
      fn = self.variant(
        functools.partial(
          objectives.importance_weights, correction=correction, cap=CAP
        )
      )
      iw = fn(prox, behav, mask)
      np.testing.assert_allclose(
        iw.weight[0], weight, rtol=1e-5, err_msg=correction
      )
      np.testing.assert_allclose(
        iw.upper_scale[0], scale, rtol=1e-5, err_msg=correction
      )
      np.testing.assert_array_equal(
        iw.keep[0], np.array(keep, bool), err_msg=correction
      )

  @chex.variants(with_jit=True, without_jit=True)
  def test_ppo_loss_per_token(self):
    # A = 1, ε = 0.2: ℓ_t = −w_t · min(R_t, clip(R_t, 0.8, 1.2·u_t)).
    # R = 1.5 on tokens 2 (ρ = 4) and 4 (ρ = 3): clipped to 1.2, except
    # under acr, whose bound is 1.2·1.6 = 1.92 (kept, 1.5) on token 2 and
    # 1.2·1.2 = 1.44 (clipped) on token 4.
    expected = {
      "decoupled": [2, 1, 4 * 1.2, 0.5, 3 * 1.2, 1],
      "tis": [2, 1, 2.5 * 1.2, 0.5, 2.5 * 1.2, 1],
      "acr": [2, 1, 2.5 * 1.5, 0.5, 2.5 * 1.44, 1],
      "mis": [2, 1, 0, 0.5, 0, 1],
    }
    logp, prox, behav, mask = mixed_row()
    adv = jnp.ones((1,), jnp.float32)
    for correction, weighted in expected.items():
      config = PolicyLossConfig(
        surrogate="ppo",
        correction=correction,
        eps_low=EPS,
        eps_high=EPS,
        tis_cap=CAP,
      )
      fn = self.variant(
        functools.partial(objectives.policy_loss_per_token, config=config)
      )
      loss, keep, _ = fn(logp, prox, behav, adv, mask)
      np.testing.assert_allclose(
        loss[0], -np.array(weighted), rtol=1e-5, err_msg=correction
      )
      np.testing.assert_array_equal(
        keep[0], np.array(weighted) != 0, err_msg=correction
      )

  def test_the_row_equals_each_version_alone(self):
    """The mixed row's weights are those of the A-part and the B-part
    computed as two separate single-version sequences."""
    _, prox, behav, mask = mixed_row()
    for correction in TOKEN_LEVEL:
      whole = objectives.importance_weights(prox, behav, mask, correction, CAP)
      parts = [
        objectives.importance_weights(
          prox[:, s], behav[:, s], mask[:, s], correction, CAP
        ).weight
        for s in (slice(0, 3), slice(3, 6))
      ]
      np.testing.assert_allclose(
        whole.weight, jnp.concatenate(parts, axis=1), rtol=1e-6
      )


@st.composite
def two_versions(draw):
  """Per-token log-probs of θ_old and of two behaviour versions, and an
  assignment of tokens to versions with a permutation of it."""
  t = draw(st.integers(2, 8))
  logp = st.floats(-6.0, -0.01, allow_nan=False)
  rows = [draw(st.lists(logp, min_size=t, max_size=t)) for _ in range(3)]
  which = draw(st.lists(st.booleans(), min_size=t, max_size=t))
  order = draw(st.permutations(range(t)))
  return [np.array(r, np.float32) for r in rows], np.array(which), order


class PermutedVersionsTest(chex.TestCase):
  @hypothesis.given(case=two_versions())
  @SETTINGS
  def test_permuting_versions_changes_only_the_moved_tokens(self, case):
    """Reassigning which version sampled which token (a permutation of the
    assignment) changes the weight, the upper scale and the loss of the
    tokens whose version changed, and of no other token; and every token's
    weight is the scalar formula of its own ρ_t."""
    (prox, behav_a, behav_b), which, order = case
    moved_which = which[list(order)]
    same = which == moved_which
    mask = jnp.ones((1, len(prox)), bool)
    row = lambda x: jnp.asarray(x[None], jnp.float32)
    behav = [np.where(w, behav_a, behav_b) for w in (which, moved_which)]
    for correction in TOKEN_LEVEL:
      iw = [
        objectives.importance_weights(row(prox), row(b), mask, correction, CAP)
        for b in behav
      ]
      for field in ("weight", "upper_scale", "keep"):
        first, second = (np.asarray(getattr(x, field))[0] for x in iw)
        np.testing.assert_array_equal(
          first[same], second[same], err_msg=f"{correction} {field}"
        )
      config = PolicyLossConfig(
        surrogate="ppo", correction=correction, tis_cap=CAP
      )
      losses = [
        objectives.policy_loss_per_token(
          row(prox + 0.1), row(prox), row(b), jnp.ones((1,)), mask, config
        )[0][0]
        for b in behav
      ]
      np.testing.assert_array_equal(
        np.asarray(losses[0])[same], np.asarray(losses[1])[same]
      )
      # Each token's weight from its own ρ_t alone.
      rho = np.exp(prox.astype(np.float64) - behav[0])
      want = {
        "decoupled": rho,
        "tis": np.minimum(rho, CAP),
        "acr": np.minimum(rho, CAP),
        "mis": np.where(rho <= CAP, rho, 0.0),
      }[correction]
      np.testing.assert_allclose(
        np.asarray(iw[0].weight)[0], want, rtol=1e-5, err_msg=correction
      )


class TestThroughTheTrainer:
  """A response sampled by two versions, from the engine through
  `build_batch` to the loss, over two PPO epochs: the streaming trainer
  (max_staleness 1, `stream_gate`'s deterministic schedule, which swaps θ_1
  into step 2's responses part-way) on the tiny model."""

  def test_each_token_is_weighted_by_its_own_behaviour_log_prob(
    self, tmp_path, monkeypatch
  ):
    from rljax.train import group_stream  # pylint: disable=g-import-not-at-top
    from rljax.train import update as update_lib  # pylint: disable=g-import-not-at-top
    from tests.train import stream_gate  # pylint: disable=g-import-not-at-top
    from tests.train.test_trainer import make_trainer, small_config  # pylint: disable=g-import-not-at-top

    monkeypatch.setattr(group_stream, "GroupStream", stream_gate.GatedStream)
    cfg = small_config(
      "grpo",
      tmp_path,
      steps=2,
      max_new_tokens=40,
      **{
        "rollout.batching": "continuous",
        "optim.steps": 4,
        "run.async_mode": "streaming",
        "run.max_staleness": 1,
        "rollout.inflight_kv": "keep",
        "update.ppo_epochs": 2,
        "loss.correction": "tis",
      },
    )
    trainer = make_trainer(cfg)
    collected, batches, updates = [], [], []
    collect = trainer.collector.collect
    trainer.collector.collect = lambda step: (
      collected.append(collect(step)) or collected[-1]
    )
    run_epochs = update_lib.run_epochs

    def spy(update_step, state, batch, *rest):
      batches.append(jax.device_get(batch))
      state, out = run_epochs(update_step, state, batch, *rest)
      updates.append(update_lib.fetch_metrics(out))
      return state, out

    monkeypatch.setattr(update_lib, "run_epochs", spy)
    try:
      rows = trainer.run()
    finally:
      trainer.close()
    assert [r["step"] for r in rows] == [1, 2]
    rollout, batch, epochs = collected[1], batches[1], updates[1]
    versions = rollout.batch.policy_version
    assert any(set(v.tolist()) == {0, 1} for v in versions), versions
    mask = np.asarray(batch["loss_mask"]) > 0
    behav = np.asarray(batch["behav_logp"])
    prox = np.asarray(batch["prox_logp"])
    gap = {0: [], 1: []}
    for b, (logp, v) in enumerate(zip(rollout.batch.behav_logp, versions)):
      # The engine's own log-prob of every token, across the swap.
      np.testing.assert_array_equal(behav[b][mask[b]], logp)
      for version in (0, 1):
        gap[version] += list(np.abs(prox[b][mask[b]] - logp)[v == version])
    # θ_old is θ_1: its tokens match their behaviour policy up to float
    # noise; θ_0's tokens are a step of Adam away.
    assert np.mean(gap[0]) > 3 * np.mean(gap[1]), (
      np.mean(gap[0]),
      np.mean(gap[1]),
    )
    # Both epochs weighted every token by its own ρ_t = π_prox/π_behav,t
    # (TIS: min(ρ, C)), and the second ran from the first's θ.
    rho = np.exp(prox[mask].astype(np.float64) - behav[mask])
    want = np.minimum(rho, cfg.loss.tis_cap).mean()
    assert len(epochs) == 2
    for metrics in epochs:
      np.testing.assert_allclose(metrics["weight_mean"], want, rtol=1e-4)
    assert epochs[0]["loss"] != epochs[1]["loss"]
    assert all(np.isfinite(m["loss"]) for m in epochs)
