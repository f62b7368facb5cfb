"""Speculative decoding in the continuous JAX engine (`spec_control`,
`spec_verify`, `slot_scheduler`'s hook): the same tokens and log-probs as
plain decoding, greedy and seeded sampling, with stops and per-sample
limits, across requests (history drafts), a weight swap and a stream; the
width choice that turns speculation down; the run's figures."""

from __future__ import annotations

import numpy as np
import pytest

from rljax.rollout import base
from rljax.rollout import spec_control
from rljax.rollout import spec_verify
from rljax.rollout.jax_sampler import JaxSampler
from tests.rollout.test_inflight_updates import _CONFIG, Pushes, _sharp
from tests.rollout.test_prompt_feed import Feed

# Six prompts of four samples through eight rows: full buckets, then a
# tail of 4, 2, 1 rows where the verify programs run.
PROMPTS = [[5, 17, 3], [9], [4, 8, 15, 16, 23, 42, 7], [11, 12], [1, 2, 3], [6]]
GREEDY = base.SamplingConfig(
  n=4, greedy=True, max_new_tokens=48, stop_token_ids=(3, 9)
)
SAMPLED = base.SamplingConfig(
  n=4, temperature=1.0, max_new_tokens=48, stop_token_ids=(3,), seed=11
)


@pytest.fixture(scope="module")
def params():
  return _sharp(0)


def _engine(params, speculative):
  return JaxSampler(
    _CONFIG,
    params,
    max_prompt_len=16,
    batching="continuous",
    decode_slots=8,
    chunk_steps=8,
    speculative=speculative,
  )


@pytest.fixture(scope="module")
def engines(params):
  """A plain and a speculative engine for the module (programs compile
  once per file)."""
  return _engine(params, "off"), _engine(params, "suffix")


def _assert_same(a: base.RolloutBatch, b: base.RolloutBatch):
  """Identical tokens; log-probs within float noise. The verify pass runs
  its matmuls over B·T positions where plain decoding runs a row bucket;
  XLA:CPU may sum in another order there (~1e-6 relative), and this sharp
  model's log-probs reach tens of nats: rtol 1e-5, atol 1e-5 (the engine
  tests' tolerance between row buckets)."""
  assert a.response_ids == b.response_ids
  assert a.finish_reason == b.finish_reason
  for x, y in zip(a.behav_logp, b.behav_logp):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def _spec(engine) -> dict:
  return {k: v for k, v in engine.last_stats.items() if k.startswith("spec")}


class TestSameSamples:
  def test_greedy(self, engines):
    """Twice: the first request's greedy rows run in lockstep (a sibling
    is never ahead to draft from), the second drafts from the first's
    responses (the store) and verifies."""
    plain, spec = engines
    want = plain.generate(PROMPTS, GREEDY)
    _assert_same(want, spec.generate(PROMPTS, GREEDY))
    _assert_same(want, spec.generate(PROMPTS, GREEDY))
    stats = _spec(spec)
    # Speculation ran (a test that never verifies proves nothing) and
    # the drafts were right often.
    assert stats["spec_verify_steps"] > 0
    assert stats["spec_accepted"] > 0
    assert stats["spec_tokens_per_row_step"] > 1.0

  def test_seeded_sampling_with_stops_and_limits(self, engines):
    plain, spec = engines
    rng = np.random.default_rng(0)
    limits = rng.integers(1, 49, len(PROMPTS) * 4).tolist()
    a = plain.generate(PROMPTS, SAMPLED, max_new_tokens_per_sample=limits)
    b = spec.generate(PROMPTS, SAMPLED, max_new_tokens_per_sample=limits)
    _assert_same(a, b)
    assert all(len(r) <= m for r, m in zip(b.response_ids, limits))
    assert {"stop", "length"} <= set(b.finish_reason)

  def test_a_repeated_request_drafts_from_history(self, engines):
    """The store holds the first request's responses: the second drafts
    from them (the same prompts, as an epoch later), samples unchanged."""
    plain, spec = engines
    cfg = base.SamplingConfig(
      n=4, temperature=1.0, max_new_tokens=40, stop_token_ids=(3,), seed=5
    )
    # Ragged limits: a tail of few rows, where a verify step has room.
    limits = np.random.default_rng(1).integers(8, 41, len(PROMPTS) * 4)
    want = plain.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    spec.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    _assert_same(
      want, spec.generate(PROMPTS, cfg, max_new_tokens_per_sample=limits)
    )
    stats = _spec(spec)
    assert stats["spec_share_history"] > 0
    assert stats["spec_acceptance_history"] > 0.5
    shares = [stats[f"spec_share_{s}"] for s in ("self", "sibling", "history")]
    assert abs(sum(shares) - 1.0) < 1e-9

  def test_a_swap_to_the_same_weights_changes_nothing(self, engines, params):
    """A swap between chunks resets the acceptance figures only: the same
    weights swapped in sample what no swap samples."""
    plain, spec = engines
    want = plain.generate(PROMPTS, SAMPLED)
    pushes = Pushes({0: (params, 1), 3: (params, 2)})
    got = spec.generate(PROMPTS, SAMPLED, weight_updates=pushes, version=0)
    _assert_same(want, got)
    assert spec.last_stats["weight_swaps"] == 2

  def test_a_stream_samples_as_generate(self, engines):
    plain, spec = engines
    want = plain.generate(PROMPTS, SAMPLED)
    feed = Feed([(PROMPTS, SAMPLED.seed)])
    stats = spec.generate_stream(feed, PROMPTS, SAMPLED)
    for i in range(len(PROMPTS)):
      group = feed.groups[(0, i)]
      assert group.tokens == want.response_ids[i * 4 : (i + 1) * 4]
    assert stats["spec_verify_steps"] > 0

  def test_figures_reach_the_batch_and_the_step(self, engines):
    plain, spec = engines
    spec.take_spec_metrics()
    batch = spec.generate(PROMPTS, GREEDY)
    for key in (
      "spec_acceptance",
      "spec_tokens_per_row_step",
      "spec_verify_steps",
      "spec_plain_steps",
      "spec_share_sibling",
      "spec_draft_us_per_row",
    ):
      assert key in batch.timing, key
    assert batch.timing["decode_steps"] == (
      batch.timing["spec_verify_steps"] + batch.timing["spec_plain_steps"]
    )
    # A training step reads the figures of its runs once.
    step = spec.take_spec_metrics()
    assert step["spec_verify_steps"] == batch.timing["spec_verify_steps"]
    assert spec.take_spec_metrics()["spec_verify_steps"] == 0
    assert plain.take_spec_metrics() == {}

  def test_a_bucket_no_verify_program_holds_is_not_drafted(self, engines):
    """Every slot live (bucket 8 of 8 slots): no verify shape holds it, so
    its chunks make no drafts; the tail's buckets still draft (from the
    first request's responses) and verify."""
    _, spec = engines
    spec.generate(PROMPTS, GREEDY)  # the store's responses to draft from
    batch = spec.generate(PROMPTS, GREEDY)
    full = spec.last_stats["bucket_steps"].get(8, 0)
    assert full > 0 and not any(b == 8 for b, _ in spec_verify.verify_shapes(8))
    assert batch.timing["spec_undrafted_rows"] >= 8
    assert batch.timing["spec_verify_steps"] > 0


class TestWidth:
  def test_verify_shapes_stay_within_the_row_buckets(self):
    assert spec_verify.verify_shapes(8) == (
      (1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2),
    )  # fmt: skip
    for b, t in spec_verify.verify_shapes(32):
      assert 4 <= b * t <= 32
    # A budget of two full steps lets a full batch verify two positions.
    wide = spec_verify.verify_shapes(32, budget=2)
    assert (32, 2) in wide and all(b * t <= 64 and t <= 8 for b, t in wide)
    with pytest.raises(ValueError, match="budget=3"):
      spec_control.SpecConfig(budget=3)

  def test_expected_tokens(self):
    alpha = np.asarray([0.0, 0.5, 0.9])
    lengths = np.asarray([5, 1, 0])
    # Row 0: 1; row 1: 1 + 0.5 (one draft); row 2: no draft, 1.
    assert spec_control.expected_tokens(alpha, lengths, 4) == pytest.approx(3.5)

  def test_speculation_turns_itself_down(self):
    """No acceptance: plain decoding; high acceptance on long drafts: the
    widest verify; a costly step: narrower."""
    spec = spec_control.Speculator(spec_control.SpecConfig())
    spec.plan = type("Plan", (), {"slots": 32})()
    lengths = np.full((4,), 16)
    assert spec.choose_width(4, lengths, np.zeros(4)) == 1
    assert spec.choose_width(4, lengths, np.full(4, 0.9)) == 8
    assert spec.choose_width(32, lengths, np.full(4, 0.9)) == 1  # no room
    costly = spec_control.Speculator(
      spec_control.SpecConfig(step_token_cost=0.5)
    )
    costly.plan = spec.plan
    assert costly.choose_width(4, lengths, np.full(4, 0.6)) < 8

  def test_a_swap_forgets_acceptance(self):
    spec = spec_control.Speculator(spec_control.SpecConfig())
    kind = ("sibling", 4)
    spec.rows[3] = [0.0, 10.0]
    spec.kinds[kind] = [0.0, 10.0]
    low = spec._alpha(3, kind)  # pylint: disable=protected-access
    spec.on_swap()
    assert spec._alpha(3, kind) == pytest.approx(0.5)  # pylint: disable=protected-access
    assert low < 0.1


@pytest.mark.parametrize(
  "value, match",
  [("ngram", "speculative='ngram'"), (3, "speculative=3")],
)
def test_bad_setting_is_named(params, value, match):
  with pytest.raises(ValueError, match=match):
    _engine(params, value)
