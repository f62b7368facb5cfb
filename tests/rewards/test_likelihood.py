"""VR-CLI (rljax.rewards.likelihood): the kernels on hand-computed values, the
batch layout, and the batched reward against perplexities computed
independently with `models.forward` + log_softmax on a tiny random model."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.rewards import likelihood
from rljax.rewards.pool import make_inputs


class TestMeanNll(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_values(self):
    logp = jnp.array([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5], [-3.0, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    nll = self.variant(likelihood.mean_nll)(logp, mask)
    # (1 + 2) / 2; 1.5 / 3; an empty row is 0, not NaN.
    np.testing.assert_allclose(nll, [1.5, 0.5, 0.0], rtol=1e-6)

  def test_shape_mismatch_raises(self):
    with self.assertRaises(AssertionError):
      likelihood.mean_nll(jnp.zeros((2, 3)), jnp.zeros((2, 4)))


class TestLikelihoodImprovement(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_values(self):
    fn = self.variant(likelihood.likelihood_improvement)
    # Row 0: NLL with a = 1, without = 2 -> PPL ratio e^-1.
    # Row 1: the reasoning changes nothing -> 0.
    # Row 2: the reasoning hurts: NLL 2 vs 1 -> (1 - e) * 100 < 0.
    # Different lengths of the two contexts (T1 = 4, T2 = 3).
    with_a = jnp.array(
      [
        [-5.0, -1.0, -1.0, 0.0],
        [-5.0, -5.0, -0.7, 0.0],
        [-5.0, -2.0, -2.0, -2.0],
      ]
    )
    m_with = jnp.array([[0, 1, 1, 0], [0, 0, 1, 0], [0, 1, 1, 1]])
    without = jnp.array(
      [[-2.0, -2.0, 0.0], [-0.7, -9.0, 0.0], [-1.0, -1.0, 0.0]]
    )
    m_without = jnp.array([[1, 1, 0], [1, 0, 0], [1, 1, 0]])
    r = fn(with_a, m_with, without, m_without)
    expected = [(1 - math.exp(-1)) * 100, 0.0, (1 - math.exp(1)) * 100]
    np.testing.assert_allclose(r, expected, rtol=1e-5, atol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_bounded_above_by_100(self):
    fn = self.variant(likelihood.likelihood_improvement)
    r = fn(
      jnp.zeros((1, 2)),
      jnp.ones((1, 2)),
      jnp.full((1, 2), -50.0),
      jnp.ones((1, 2)),
    )
    np.testing.assert_allclose(r, [100.0], atol=1e-6)

  def test_batch_mismatch_raises(self):
    with self.assertRaises(AssertionError):
      likelihood.likelihood_improvement(
        jnp.zeros((2, 3)),
        jnp.zeros((2, 3)),
        jnp.zeros((3, 3)),
        jnp.zeros((3, 3)),
      )


class TestBuildVrcliBatch:
  def test_layout_and_target_mask(self):
    tokens, attn, target = likelihood.build_vrcli_batch(
      prompts=[[10, 11], [12]],
      reasonings=[[20], []],
      golds=[[30, 31], [32]],
      separator=[5],
      pad_id=0,
      rows=3,
    )
    assert tokens.shape == (6, 16) and target.shape == (6, 15)
    np.testing.assert_array_equal(tokens[0, :6], [10, 11, 20, 5, 30, 31])
    np.testing.assert_array_equal(tokens[1, :4], [12, 5, 32, 0])
    np.testing.assert_array_equal(tokens[3, :5], [10, 11, 5, 30, 31])
    np.testing.assert_array_equal(tokens[4, :3], [12, 5, 32])
    # Position t predicts token t+1: y of row 0 is tokens 4..5.
    np.testing.assert_array_equal(np.nonzero(target[0])[0], [3, 4])
    np.testing.assert_array_equal(np.nonzero(target[3])[0], [2, 3])
    np.testing.assert_array_equal(np.nonzero(target[4])[0], [1])
    assert target[2].sum() == 0 and target[5].sum() == 0  # padding rows
    np.testing.assert_array_equal(attn.sum(1), [6, 3, 1, 5, 3, 1])

  def test_empty_gold_raises(self):
    with pytest.raises(ValueError, match="item 0: the gold continuation"):
      likelihood.build_vrcli_batch([[1]], [[2]], [[]], [5], 0)


def _ppl(config, params, context, gold):
  """PPL(gold | context) from the full logits of one unpadded sequence."""
  tokens = jnp.asarray([list(context) + list(gold)], jnp.int32)
  logits = models.forward(config, params, tokens)
  log_probs = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), -1))[0]
  nll = [-log_probs[len(context) - 1 + k, tok] for k, tok in enumerate(gold)]
  return math.exp(sum(nll) / len(gold))


class TestVrcliOnTinyModel:
  def test_matches_independent_perplexities(self):
    config = models.tiny_config()
    params = models.init_params(config, jax.random.PRNGKey(0))
    # Large random weights: perplexities far apart, so the test has teeth.
    params = jax.tree.map(lambda x: x * 8.0 if x.ndim >= 2 else x, params)
    x = [[3, 17, 40], [9], [60, 61, 62, 63]]
    a = [[7, 7, 100], [44, 45], []]
    y = [[12, 90], [33, 34, 35], [5]]
    sep = [4]
    tokens, attn, target = likelihood.build_vrcli_batch(
      x, a, y, sep, pad_id=0, rows=4
    )
    got = np.asarray(
      likelihood.vrcli_rewards(
        config,
        params,
        jnp.asarray(tokens),
        jnp.asarray(attn),
        jnp.asarray(target),
      )
    )[:3]
    want = [
      (
        1
        - _ppl(config, params, xi + ai + sep, yi)
        / _ppl(config, params, xi + sep, yi)
      )
      * 100
      for xi, ai, yi in zip(x, a, y)
    ]
    assert abs(want[2]) < 1e-9  # no reasoning: no improvement
    assert max(abs(w) for w in want[:2]) > 1.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


class _CharTokenizer:
  """Bytes as token ids (+3), for a tiny model's 128-id vocabulary."""

  pad_token_id = 0

  def encode(self, text, add_special_tokens=False):
    return [min(b, 124) + 3 for b in text.encode()]


class TestLikelihoodImprovementReward:
  def test_scores_a_batch_in_chunks_like_the_kernel(self):
    config = models.tiny_config()
    params = jax.tree.map(
      lambda x: x * 8.0 if x.ndim >= 2 else x,
      models.init_params(config, jax.random.PRNGKey(1)),
    )
    tok = _CharTokenizer()
    reward = likelihood.LikelihoodImprovementReward(
      config, params, tok, separator="\n", batch_size=2
    )
    inputs = make_inputs(
      ["Q: 2+3?", "Q: 4+4?", "Q: 1+1?"], ["2+3=5", "", "think"], ["5", "8", "2"]
    )
    batch = reward.score(inputs)
    want = [
      (
        1
        - _ppl(
          config,
          params,
          tok.encode(i.prompt + i.completion + "\n"),
          tok.encode(i.ground_truth),
        )
        / _ppl(
          config,
          params,
          tok.encode(i.prompt + "\n"),
          tok.encode(i.ground_truth),
        )
      )
      * 100
      for i in inputs
    ]
    np.testing.assert_allclose(batch.scores, want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(batch.components["vrcli"], batch.scores)
    assert batch.status == ("ok",) * 3 and batch.metrics["items"] == 3
    gain = batch.components["nll_gain"]
    np.testing.assert_allclose(
      1 - np.exp(-gain), batch.scores / 100, rtol=1e-4, atol=1e-5
    )
