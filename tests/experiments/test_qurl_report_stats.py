"""The statistics of experiments/qurl_report.py (issue 17; its pieces in
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


class TestVerdict:
  @pytest.mark.parametrize(
    "low,high,kind,seeds,expected",
    [
      (0.01, 0.2, "superiority", 3, "supported"),
      (-0.05, 0.02, "superiority", 3, "not supported"),  # high < margin 0.03
      (-0.05, 0.10, "superiority", 3, "not resolved at this scale"),
      (0.01, 0.2, "superiority", 2, "not resolved at this scale"),  # seeds
      (-0.02, 0.05, "non_inferiority", 3, "supported"),  # low > -0.03
      (-0.20, -0.05, "non_inferiority", 3, "not supported"),
      (-0.06, 0.01, "non_inferiority", 4, "not resolved at this scale"),
    ],
  )
  def test_rule(self, low, high, kind, seeds, expected):
    assert stats.verdict(low, high, kind, seeds)[0] == expected

  def test_reasons_name_what_the_interval_holds(self):
    # Every bound below 0, the lower one past the margin: worse, by an open
    # amount; the reason must not say the interval holds 0.
    v, why = stats.verdict(-0.113, -0.027, "non_inferiority", 3)
    assert v == "not resolved at this scale"
    assert "below 0" in why and "both 0" not in why
    _, why = stats.verdict(-0.06, 0.01, "non_inferiority", 3)
    assert "both 0" in why

  def test_bad_kind(self):
    with pytest.raises(ValueError, match="kind='better'"):
      stats.verdict(0.0, 1.0, "better", 3)


class TestSlopeReadoutStats:
  """Q6's KL-slope readout (issue 44): least squares, a bootstrap over
  seeds, and a verdict without a margin."""

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

  @pytest.mark.parametrize(
    "low,high,seeds,expected",
    [
      (-2.0, -1.0, 3, "supported"),
      (1.0, 2.0, 3, "not supported"),
      (-1.0, 1.0, 3, "not resolved at this scale"),
      (-2.0, -1.0, 2, "not resolved at this scale"),
    ],
  )
  def test_decrease_verdict(self, low, high, seeds, expected):
    assert stats.decrease_verdict(low, high, seeds)[0] == expected


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
  acr_grad_share (None: not logged, as before issue 44); metrics: {key:
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
  _, claims = claims_lib.claims_section(studies)
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
  _, claims = claims_lib.claims_section(
    {"q4_long_horizon_pooled": pooled, "q4_long_horizon": parts[1]}
  )
  by = {(c["study"], c["a"], c["b"]): c for c in claims}
  pooled_claim = by[("q4_long_horizon_pooled", "int8_tis", "int8_acr")]
  # The interval alone would support it; a GPU seed without an A/A pair on
  # its machine makes it not attributable (issue 44).
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
