"""The statistics of experiments/qurl_report.py (its pieces in
experiments/qurl_report_lib/) on hand-computed cases: the paired bootstrap
over seeds × problems, the verdict rule, the mean ± std over seeds, and a
page built from two fake-free study dirs."""

import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
# experiments/ is not a package: its scripts import qurl_report_lib from
# their own directory.
if os.path.join(ROOT, "experiments") not in sys.path:
  sys.path.append(os.path.join(ROOT, "experiments"))

from qurl_report_lib import claims as claims_lib  # noqa: E402
from qurl_report_lib import family  # noqa: E402
from qurl_report_lib import sections  # noqa: E402
from qurl_report_lib import stats  # noqa: E402
from qurl_report_lib import studies as studies_lib  # noqa: E402


class TestPairedBootstrap:
  def test_constant_difference_has_a_point_interval(self):
    delta, low, high = stats.paired_bootstrap([[0, 0, 0]], [[1, 1, 1]])
    assert (delta, low, high) == (1.0, 1.0, 1.0)

  def test_two_problems_one_seed(self):
    # d = (0, 1): a resampled mean is 0, 1/2 or 1 with probability 1/4, 1/2,
    # 1/4, so the 2.5% and 97.5% quantiles are 0 and 1.
    delta, low, high = stats.paired_bootstrap([[1, 0]], [[1, 1]])
    assert (delta, low, high) == (0.5, 0.0, 1.0)

  def test_seeds_are_resampled_not_only_problems(self):
    # Seed 0: B never better; seed 1: B always better (50 problems each).
    # Pooled problems would give a narrow interval around 0.5; resampling
    # the two seeds gives 0, 1/2, 1 with probability 1/4, 1/2, 1/4.
    a = np.zeros((2, 50))
    b = np.stack([np.zeros(50), np.ones(50)])
    delta, low, high = stats.paired_bootstrap(a, b)
    assert (delta, low, high) == (0.5, 0.0, 1.0)

  def test_fixed_rng_and_spread(self):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2, (3, 64))
    b = rng.integers(0, 2, (3, 64))
    r = stats.paired_bootstrap(a, b)
    assert r == stats.paired_bootstrap(a, b)
    assert r[1] < r[0] < r[2]

  def test_shapes_are_checked(self):
    with pytest.raises(ValueError, match=r"a \(1, 2\) and b \(1, 3\)"):
      stats.paired_bootstrap([[0, 1]], [[0, 1, 1]])
    with pytest.raises(ValueError, match="confidence=1.5"):
      stats.paired_bootstrap([[0]], [[1]], confidence=1.5)


class TestSeedLevelInterval:
  """The page's primary interval and tests, on hand-computed cases."""

  def test_t_interval_of_three_seeds(self):
    # mean 2, sd 1, se 1/√3, t(0.975, 2) = 4.302653: half-width 2.484138.
    mean, low, high = stats.t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert low == pytest.approx(2.0 - 2.484138, abs=1e-6)
    assert high == pytest.approx(2.0 + 2.484138, abs=1e-6)
    # Identical differences: a point.
    assert stats.t_interval([0.5, 0.5, 0.5]) == (0.5, 0.5, 0.5)

  def test_t_interval_is_wider_than_the_percentile_bootstrap(self):
    # Three seeds: the percentile bootstrap spans about their min..max;
    # the t interval with 2 degrees of freedom is ~2-4x wider.
    d = [0.05, 0.11, 0.19]
    _, bl, bh = stats.seed_bootstrap(d)
    _, tl, th = stats.t_interval(d)
    assert (th - tl) > 2.0 * (bh - bl)

  def test_t_pvalue_by_hand(self):
    # 2 d.o.f.: P(T > t) = (1 − t/√(t² + 2)) / 2; t = 2/(1/√3) = 2√3.
    t = 2.0 * np.sqrt(3.0)
    want = 0.5 * (1.0 - t / np.sqrt(t * t + 2.0))
    assert stats.t_pvalue([1.0, 2.0, 3.0], 0.0, greater=True) == pytest.approx(
      want, rel=1e-9
    )
    assert stats.t_pvalue([1.0, 2.0, 3.0], 0.0, greater=False) == pytest.approx(
      1.0 - want, rel=1e-9
    )
    # The null at the mean: 1/2; no spread: 0 or 1.
    assert stats.t_pvalue([1.0, 2.0, 3.0], 2.0, True) == pytest.approx(0.5)
    assert stats.t_pvalue([0.1, 0.1, 0.1], 0.0, True) == 0.0
    assert stats.t_pvalue([0.1, 0.1, 0.1], 0.0, False) == 1.0

  def test_bca_from_ten_seeds_and_against_scipy(self):
    from scipy import stats as sp_stats

    rng = np.random.default_rng(3)
    d = rng.exponential(0.05, size=12) - 0.02  # skewed
    got = stats.seed_interval(d)
    assert got["method"] == "BCa"
    assert stats.seed_interval(d[:9])["method"] == "t"
    ref = sp_stats.bootstrap(
      (d,), np.mean, method="BCa", n_resamples=20_000, random_state=0
    ).confidence_interval
    assert got["low"] == pytest.approx(ref.low, abs=4e-3)
    assert got["high"] == pytest.approx(ref.high, abs=4e-3)
    # Right skew: BCa reaches further up than down from the mean.
    assert got["high"] - got["mean"] > got["mean"] - got["low"]

  def test_bca_pvalue_agrees_with_its_interval(self):
    # The one-sided p of H1 mean > null is <= 0.025 exactly when the
    # two-sided 95% BCa interval lies above null.
    rng = np.random.default_rng(5)
    d = rng.normal(0.03, 0.03, size=12)
    _, low, high = stats.bca_interval(d)
    for null in (low - 1e-3, low + 1e-3):
      p = stats.bca_pvalue(d, null, greater=True)
      assert (p <= 0.025) == (null < low), (null, low, p)

  def test_holm_by_hand(self):
    # Sorted 0.01, 0.03, 0.04 (m = 3): 3·0.01, max(that, 2·0.03), max(that,
    # 1·0.04).
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, None, 0.01]) == [0.5, None, 0.02]
    assert stats.holm([0.9, 0.8]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="p-value 1.5"):
      stats.holm([1.5])

  @pytest.mark.parametrize(
    "d,kind,expected",
    [
      ([0.10, 0.12, 0.11], "superiority", "supported"),
      ([0.00, 0.001, -0.001], "superiority", "not supported"),
      ([-0.1, 0.2, 0.05], "superiority", "not resolved at this scale"),
      ([0.00, 0.001, -0.001], "non_inferiority", "supported"),
      ([-0.10, -0.12, -0.11], "non_inferiority", "not supported"),
      ([-0.1, -0.2, -0.15], "decrease", "supported"),
      ([0.1, 0.2, 0.15], "decrease", "not supported"),
    ],
  )
  def test_verdict_from_tests(self, d, kind, expected):
    p = stats.claim_tests(d, kind)
    assert stats.verdict_from_tests(p["for"], p["against"], kind, 3)[0] == (
      expected
    )

  def test_holm_can_unresolve_a_lone_verdict(self):
    # t = 0.05 / (0.01/√3) = 8.66 on 2 d.o.f.: one-sided p = 0.0065.
    p = stats.claim_tests([0.04, 0.05, 0.06], "superiority")
    alone = stats.holm([p["for"], p["against"]])
    assert stats.verdict_from_tests(*alone, "superiority", 3)[0] == "supported"
    # With 40 other tests in the family it no longer is (42 × 0.0065).
    crowd = stats.holm([p["for"], p["against"]] + [0.5] * 40)
    v, why = stats.verdict_from_tests(crowd[0], crowd[1], "superiority", 3)
    assert v == "not resolved at this scale" and "Holm p" in why

  def test_noise_floor(self):
    # RMS of (0.03, −0.04): √((0.0009 + 0.0016)/2) = 0.035355.
    assert stats.aa_spread([0.03, -0.04]) == pytest.approx(0.0353553, abs=1e-7)
    assert stats.within_noise(0.03, 0.035, "superiority")
    assert not stats.within_noise(0.04, 0.035, "superiority")
    assert not stats.within_noise(0.0, 0.035, "non_inferiority")
    assert not stats.within_noise(0.0, None, "superiority")

  def test_bad_input(self):
    with pytest.raises(ValueError, match="S >= 2"):
      stats.t_interval([0.1])
    with pytest.raises(ValueError, match="kind='better'"):
      stats.claim_tests([0.1, 0.2], "better")
    with pytest.raises(ValueError, match="confidence=1.5"):
      stats.t_interval([0.1, 0.2], confidence=1.5)


class TestSlopeReadoutStats:
  """Q6's KL-slope readout: least squares and a bootstrap over seeds."""

  def test_ls_slope(self):
    assert stats.ls_slope([1, 2, 3], [1, 3, 5]) == 2.0
    # Residuals (+1, −2, +1) around y = x: the slope stays 1.
    assert stats.ls_slope([0, 1, 2], [1, -1, 3]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="every x is the same"):
      stats.ls_slope([2, 2], [0, 1])
    with pytest.raises(ValueError, match=r"x \(3,\) and y \(2,\)"):
      stats.ls_slope([1, 2, 3], [0, 1])

  def test_seed_bootstrap(self):
    assert stats.seed_bootstrap([-1.0, -1.0, -1.0]) == (-1.0, -1.0, -1.0)
    # Two seeds: the resampled mean is 0, 1/2, 1 with probability 1/4,
    # 1/2, 1/4, so the 95% interval is [0, 1].
    assert stats.seed_bootstrap([0.0, 1.0]) == (0.5, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"d \(0,\)"):
      stats.seed_bootstrap([])


def test_sample_mean_std():
  assert stats.sample_mean_std([1.0, 2.0, 3.0, None]) == (2.0, 1.0, 3)
  assert stats.sample_mean_std([0.5]) == (0.5, None, 1)
  assert stats.sample_mean_std([]) == (None, None, 0)


def _fake_config(name, minibatches=4, uaq_scale=1.0, **sections):
  """The nested config.json of arm `name` (`<quant>_<correction>`)."""
  quant, _, correction = name.partition("_")
  cfg = {
    "rollout": {
      "quant": "none" if quant == "fp32" else quant,
      "uaq_scale": uaq_scale,
    },
    "loss": {"correction": correction.split("_")[0] or "naive"},
    "update": {"ppo_epochs": 1, "minibatches": minibatches},
  }
  for section, fields in sections.items():
    cfg.setdefault(section, {}).update(fields)
  return cfg


def _fake_run(
  study,
  name,
  seed,
  correct,
  steps=2,
  config=None,
  grad_share=0.01,
  metrics=None,
):
  """A finished run directory as rljax/study.py writes it; `config` is its
  config.json (default `_fake_config(name)`), grad_share the logged
  acr_grad_share (None: not logged, as by an older trainer); metrics: {key:
  [value at step 1, 2, ...]} overriding the per-step defaults."""
  run = study / f"{name}_s{seed}"
  run.mkdir(parents=True)
  (run / "config.json").write_text(
    json.dumps(_fake_config(name) if config is None else config)
  )
  acc = float(np.mean(correct))
  rows = [{"step": 0, "eval_accuracy": 0.25}]
  rows += [
    {
      "step": s,
      "loss": 0.1,
      "reward_mean": 0.5,
      "behav_prox_kl": 1e-3,
      "max_prox_behav_ratio": 1.5,
      "acr_active_fraction": 0.01 * s,
      **({} if grad_share is None else {"acr_grad_share": grad_share}),
      **{k: v[s - 1] for k, v in (metrics or {}).items()},
    }
    for s in range(1, steps + 1)
  ]
  rows.append({"step": steps, "eval_accuracy": acc})
  (run / "metrics.jsonl").write_text(
    "".join(json.dumps(r) + "\n" for r in rows)
  )
  (run / "summary.json").write_text("{}")
  (run / f"eval_step{steps}.jsonl").write_text(
    "".join(
      json.dumps({"uid": f"p{i}", "correct": int(c)}) + "\n"
      for i, c in enumerate(correct)
    )
  )


def test_claims_from_run_files(tmp_path):
  """q2: ACR right on every problem TIS misses, three seeds: supported, with
  the interval of a constant difference; q1 has one seed: not resolved."""
  q2 = tmp_path / "q2"
  for seed in range(3):
    _fake_run(q2, "int8_tis", seed, [0, 0, 1, 1])
    _fake_run(q2, "int8_acr", seed, [1, 1, 1, 1])
  (q2 / "ablation.json").write_text(
    json.dumps(
      {
        "base": {"steps": 2},
        "seeds": [0, 1, 2],
        "runs": [{"name": "int8_tis"}, {"name": "int8_acr"}],
      }
    )
  )
  q1 = tmp_path / "q1"
  _fake_run(q1, "fp32", 0, [1, 1, 0, 0])
  _fake_run(q1, "int8_naive", 0, [0, 0, 0, 0])
  studies = {
    "q2_instrument": studies_lib.load_study(str(q2)),
    "q1_instrument": studies_lib.load_study(str(q1)),
  }
  _, claims = family.claims_section(studies)
  by = {(c["study"], c["a"], c["b"]): c for c in claims}
  acr = by[("q2_instrument", "int8_tis", "int8_acr")]
  assert (acr["delta"], acr["seeds"], acr["problems"], acr["verdict"]) == (
    0.5,
    [0, 1, 2],
    4,
    "supported",
  )
  naive = by[("q1_instrument", "int8_naive", "fp32")]
  assert naive["verdict"] == "not resolved at this scale"
  assert "1 paired seed" in naive["why"]
  missing = by[("q4_long_horizon", "int8_tis", "fp32")]
  assert missing["why"] == "no runs of this study are archived"
  table = "\n".join(sections.study_table(studies["q2_instrument"]))
  assert (
    "| `int8_acr` | 1 | 4 | 3 | 2 | 0.250 ± 0.000 | 1.000 ± 0.000 |" in table
  )
  png = tmp_path / "fig.png"
  assert sections.study_figure(studies["q2_instrument"], str(png))
  assert png.stat().st_size > 10_000


def _fake_study(study, seeds, tis, acr, machine=None):
  for seed in seeds:
    _fake_run(study, "int8_tis", seed, tis)
    _fake_run(study, "int8_acr", seed, acr)
  setup = {
    "base": {"steps": 2},
    "seeds": list(seeds),
    "runs": [{"name": "int8_tis"}, {"name": "int8_acr"}],
  }
  if machine:
    setup["machine"] = machine
  (study / "ablation.json").write_text(json.dumps(setup))
  (study / "cpu_log.jsonl").write_text(
    "".join(json.dumps({"run": "x", "cpu_s": 10.0}) + "\n" for _ in seeds)
  )


def test_pooled_study_pairs_within_each_part(tmp_path):
  """Seed 0 from one machine, seeds 1-2 from another: three paired seeds,
  each pair from one part; neither part alone reaches the rule's three."""
  gpu, cpu = tmp_path / "q4_gpu", tmp_path / "q4_cpu"
  _fake_study(gpu, [0], [0, 0, 1, 1], [1, 1, 1, 1], machine="H100, jax")
  _fake_study(cpu, [1, 2], [0, 0, 1, 1], [1, 1, 1, 1])
  parts = [studies_lib.load_study(str(gpu)), studies_lib.load_study(str(cpu))]
  pooled = studies_lib.pool_studies(parts)
  assert pooled["setup"]["seeds"] == [0, 1, 2]
  assert pooled["setup"]["machine"] == "pooled (seed 0: H100; seeds 1, 2: CPU)"
  result = claims_lib.compare(pooled, "int8_tis", "int8_acr")
  assert (result["seeds"], result["delta"]) == ([0, 1, 2], 0.5)
  _, claims = family.claims_section(
    {"q4_long_horizon_pooled": pooled, "q4_long_horizon": parts[1]}
  )
  by = {(c["study"], c["a"], c["b"]): c for c in claims}
  pooled_claim = by[("q4_long_horizon_pooled", "int8_tis", "int8_acr")]
  # The interval alone would support it; a GPU seed without an A/A pair on
  # its machine makes it not attributable.
  assert pooled_claim["low"] > 0
  assert pooled_claim["verdict"] == "not attributable"
  assert "no A/A pair" in pooled_claim["why"]
  alone = by[("q4_long_horizon", "int8_tis", "int8_acr")]
  assert alone["verdict"] == "not resolved at this scale"
  # The parts' CPU seconds are counted once per directory.
  assert sum(pooled["cpu_by_dir"].values()) == 30.0
  assert "seeds 1, 2: CPU" in "\n".join(sections.status_section({"p": pooled}))


def test_pooling_refuses_a_seed_in_two_parts_and_other_configs(tmp_path):
  a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
  _fake_study(a, [0, 1], [0, 1], [1, 1])
  _fake_study(b, [1], [0, 1], [1, 1])
  with pytest.raises(ValueError, match="int8_tis seed 1 is in both"):
    studies_lib.pool_studies(
      [studies_lib.load_study(str(a)), studies_lib.load_study(str(b))]
    )
  _fake_run(c, "fp32", 2, [1, 1])
  (c / "ablation.json").write_text(json.dumps({"runs": [{"name": "fp32"}]}))
  with pytest.raises(ValueError, match=r"runs configs \['fp32'\]"):
    studies_lib.pool_studies(
      [studies_lib.load_study(str(a)), studies_lib.load_study(str(c))]
    )


def _records(run, step, correct):
  (run / f"eval_step{step}.jsonl").write_text(
    "".join(
      json.dumps({"uid": f"p{i}", "correct": int(c)}) + "\n"
      for i, c in enumerate(correct)
    )
  )


def test_readout_averages_the_last_k_evaluations(tmp_path):
  """A run with records at steps 0, 1, ..., 6 reads as the mean of steps
  3-6 (k = 4) per problem; an archived run with one final record reads as
  that record; an unfinished run has no readout."""
  run = tmp_path / "fp32_s0"
  run.mkdir()
  _records(run, 0, [0, 0])
  for step in range(1, 7):
    _records(run, step, [step % 2, 1])  # p0: 1, 0, 1, 0, ...; p1: always
  scores, steps = studies_lib.readout_scores(str(run), 4)
  assert scores == {} and steps == []  # no summary.json yet
  (run / "summary.json").write_text("{}")
  studies_lib._readout.cache_clear()
  scores, steps = studies_lib.readout_scores(str(run), 4)
  assert steps == [3, 4, 5, 6]
  assert scores == {"p0": 0.5, "p1": 1.0}
  assert studies_lib.readout_scores(str(run), 1) == (
    {"p0": 0.0, "p1": 1.0},
    [6],
  )


def test_perturbed_aa_arm_sets_the_noise_floor(tmp_path):
  """int8_tis_aa is int8_tis with another data order (model name
  `instrument:<dir>#order=1`): its per-seed difference from int8_tis is the
  A/A spread, printed beside every claim of the study; an ACR gain inside
  it reads "within noise", one outside it keeps its verdict."""
  study = tmp_path / "q9"
  base = {"name": "instrument:/x/inst"}
  seeds = range(3)
  # Per seed (4 problems): TIS right on 2; its A/A twin on 2 or 3 (spread
  # RMS of (+1/4, −1/4, +1/4) = 0.25); ACR on 3 (+0.25: within the spread).
  aa = {0: [1, 1, 1, 0], 1: [1, 0, 0, 0], 2: [1, 1, 1, 0]}
  for seed in seeds:
    for name, correct, model in (
      ("int8_tis", [1, 1, 0, 0], base),
      ("int8_tis_aa", aa[seed], {"name": "instrument:/x/inst#order=1"}),
      ("int8_acr", [1, 1, 1, 0], base),
    ):
      _fake_run(
        study, name, seed, correct,
        config=_fake_config(name, model=model),
      )  # fmt: skip
  (study / "ablation.json").write_text(
    json.dumps(
      {
        "seeds": list(seeds),
        "runs": [{"name": n} for n in ("int8_tis", "int8_tis_aa", "int8_acr")],
      }
    )
  )
  loaded = studies_lib.load_study(str(study))
  noise = claims_lib.aa_noise(loaded)
  assert noise["pair"] == ("int8_tis", "int8_tis_aa")
  assert noise["spread"] == pytest.approx(0.25)
  assert noise["seeds"] == 3
  _, claims = family.claims_section({"q9_acr_long": loaded})
  acr = next(
    c
    for c in claims
    if (c["study"], c["a"], c["b"]) == ("q9_acr_long", "int8_tis", "int8_acr")
  )
  assert acr["delta"] == pytest.approx(0.25)
  assert acr["verdict"] == "within noise"
  assert "inside the A/A spread 0.250" in acr["why"]
  assert acr["noise"].startswith("0.250 (`int8_tis_aa` − `int8_tis`")


def test_q9_regime_check_reads_fp32_evaluations(tmp_path):
  """Q9's registered check: fp32's readout (last 4 evaluations) above its
  mean at steps 400-500 means it kept improving."""
  from qurl_report_lib import fair_test

  run = tmp_path / "fp32_s0"
  run.mkdir()
  rows = [
    {"step": s, "eval_accuracy": 0.3 + s / 10_000} for s in range(0, 1001, 50)
  ]
  (run / "metrics.jsonl").write_text(
    "".join(json.dumps(r) + "\n" for r in rows)
  )
  study = {"runs": {"fp32": {0: str(run)}}}
  assert "no `fp32` seed has finished" in fair_test.regime_check(study)
  (run / "summary.json").write_text("{}")
  # Readout: mean of 0.385, 0.39, 0.395, 0.4 = 0.3925; steps 400-500: 0.345.
  text = fair_test.regime_check(study)
  assert "readout 0.392 against 0.345" in text and "kept improving" in text
  (run / "metrics.jsonl").write_text(
    "".join(
      json.dumps({**r, "eval_accuracy": 0.7 - r["step"] / 10_000}) + "\n"
      for r in rows
    )
  )
  assert "left the registered regime" in fair_test.regime_check(study)
