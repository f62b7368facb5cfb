"""The QuRL page's gates (experiments/qurl_report_lib/gates.py):
what ran, confounded comparisons, and claims about a mechanism that could
not act."""

from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
if os.path.join(ROOT, "experiments") not in sys.path:
  sys.path.append(os.path.join(ROOT, "experiments"))
sys.path.insert(0, os.path.dirname(__file__))

from qurl_report_lib import family  # noqa: E402
from qurl_report_lib import fair_test  # noqa: E402
from qurl_report_lib import gates  # noqa: E402
from qurl_report_lib import studies as studies_lib  # noqa: E402
from test_qurl_report_stats import _fake_config, _fake_run  # noqa: E402

TIS, ACR = [0, 0, 1, 1], [1, 1, 1, 1]  # ACR +0.5 on every seed


def _study(path, arms, seeds=(0, 1, 2), machine=None):
  """arms: {name: (correct, config or None, grad_share)}."""
  for seed in seeds:
    for name, (correct, config, share) in arms.items():
      _fake_run(path, name, seed, correct, config=config, grad_share=share)
  setup = {"seeds": list(seeds), "runs": [{"name": n} for n in arms]}
  if machine:
    setup["machine"] = machine
  (path / "ablation.json").write_text(json.dumps(setup))
  return studies_lib.load_study(str(path))


def _claim(studies, study, a, b):
  _, claims = family.claims_section(studies)
  return next(
    c for c in claims if (c["study"], c["a"], c["b"]) == (study, a, b)
  )


def _slope(studies, study, a, b):
  rows = family.page(studies)["slopes"]
  return next(r for r in rows if (r["study"], r["a"], r["b"]) == (study, a, b))


def _acr_claim(tmp_path, minibatches=4, share=0.01, machine=None, extra=()):
  arms = {
    "int8_tis": (TIS, _fake_config("int8_tis", minibatches), share),
    "int8_acr": (ACR, _fake_config("int8_acr", minibatches), share),
  }
  arms.update(extra)
  study = _study(tmp_path / "q2", arms, machine=machine)
  return _claim(
    {"q2_instrument": study}, "q2_instrument", "int8_tis", "int8_acr"
  )


def test_acr_exposed_on_the_cpu_keeps_its_verdict(tmp_path):
  claim = _acr_claim(tmp_path)
  assert claim["verdict"] == "supported"
  assert claim["updates_per_rollout"] == [4]


def test_one_update_per_rollout_is_not_tested(tmp_path):
  """R ≡ 1: whatever the interval says, ACR was TIS (Q4's mistake)."""
  claim = _acr_claim(tmp_path, minibatches=1)
  assert claim["low"] > 0  # the interval alone would have supported it
  assert claim["verdict"] == gates.NOT_TESTED
  assert "ppo_epochs × update.minibatches = [1]" in claim["why"]


def test_gradient_share_below_the_gate_is_not_exercised(tmp_path):
  claim = _acr_claim(tmp_path, share=1e-4)
  assert claim["verdict"].startswith(gates.NOT_EXERCISED)
  assert "1.0e-04 < 0.001" in claim["why"]


def test_unlogged_exposure_is_not_attributable(tmp_path):
  claim = _acr_claim(tmp_path, share=None)
  assert claim["verdict"] == gates.NOT_ATTRIBUTABLE
  assert "not logged" in claim["why"]


def test_gpu_runs_need_an_aa_floor(tmp_path):
  """Q2 on the H100: no A/A pair, so its nondeterminism is unmeasured. With
  an A/A pair (the same config twice) whose gap is below the claim's, the
  verdict stands; with one as large, it does not."""
  no_aa = _acr_claim(tmp_path / "a", machine="NVIDIA H100, JAX")
  assert no_aa["verdict"] == gates.NOT_ATTRIBUTABLE
  assert "no A/A pair" in no_aa["why"]
  aa = {"int8_tis_aa": ([0, 1, 1, 1], _fake_config("int8_tis"), 0.01)}
  small = _acr_claim(tmp_path / "b", machine="NVIDIA H100", extra=aa)
  assert small["verdict"] == "supported"
  assert "exceeds the GPU run-to-run floor 0.250" in small["why"]
  aa = {"int8_tis_aa": ([1, 1, 1, 1], _fake_config("int8_tis"), 0.01)}
  large = _acr_claim(tmp_path / "c", machine="NVIDIA H100", extra=aa)
  assert large["verdict"] == gates.NOT_ATTRIBUTABLE
  assert "within the GPU run-to-run floor 0.500" in large["why"]


def test_arms_differing_in_an_unnamed_field_are_refused(tmp_path):
  """ACR vs TIS names only loss.correction: another learning rate (or a
  UAQ scale) in one arm is a confound, refused with the field and values."""
  arms = {
    "int8_tis": (TIS, _fake_config("int8_tis"), 0.01),
    "int8_acr": (
      ACR,
      _fake_config("int8_acr", optim={"learning_rate": 3e-4}),
      0.01,
    ),
  }
  study = _study(tmp_path / "q2", arms)
  with pytest.raises(gates.ConfoundedClaimError) as e:
    family.claims_section({"q2_instrument": study})
  msg = str(e.value)
  assert "optim.learning_rate: int8_tis=" in msg
  assert "int8_acr=0.0003" in msg
  assert "loss.correction" in msg  # what the claim names


def test_effective_uaq_scale_is_what_the_trainer_applied(tmp_path):
  """An older trainer's unquantized run recorded uaq_scale 1.5 and ran 1.0;
  a run that logs the exposure metrics was made by the trainer that applies
  the recorded scale."""
  cfg = _fake_config("fp32", uaq_scale=1.5)
  _fake_run(tmp_path / "old", "fp32", 0, [1], config=cfg, grad_share=None)
  _fake_run(tmp_path / "new", "fp32", 0, [1], config=cfg, grad_share=0.0)
  _fake_run(
    tmp_path / "q",
    "int8_tis",
    0,
    [1],
    config=_fake_config("int8_tis", uaq_scale=1.5),
    grad_share=None,
  )
  scale = lambda d: gates.effective_config(str(d))["rollout.uaq_scale"]
  assert scale(tmp_path / "old" / "fp32_s0") == 1.0
  assert scale(tmp_path / "new" / "fp32_s0") == 1.5
  assert scale(tmp_path / "q" / "int8_tis_s0") == 1.5


def test_uaq_gain_without_a_learning_rate_control_is_not_attributable(tmp_path):
  """Under Adam a UAQ fold is a per-tensor learning rate: "UAQ s = 2 beats
  ACR alone" needs an arm at s = 1 with the learning rate × 2."""

  def cfg(uaq, lr):
    return _fake_config(
      "int8_acr", minibatches=1, uaq_scale=uaq, optim={"learning_rate": lr}
    )

  arms = {
    "int8_acr_lr1e-6": ([0, 0, 1, 1], cfg(1.0, 1e-6), 0.0),
    "int8_acr_uaq2_lr1e-6": ([1, 1, 1, 1], cfg(2.0, 1e-6), 0.0),
  }
  study = _study(tmp_path / "a", arms)
  args = ("q3_instrument", "int8_acr_lr1e-6", "int8_acr_uaq2_lr1e-6")
  claim = _claim({"q3_instrument": study}, *args)
  assert claim["verdict"] == gates.NOT_ATTRIBUTABLE
  assert "per-tensor learning rate" in claim["why"]
  arms["int8_acr_lr2e-6"] = ([0, 0, 1, 1], cfg(1.0, 2e-6), 0.0)
  study = _study(tmp_path / "b", arms)
  claim = _claim({"q3_instrument": study}, *args)
  assert claim["verdict"] == "supported"
  assert "beats its learning-rate control too" in claim["why"]
  # A control that gains as much as UAQ: the gain is the learning rate's.
  arms["int8_acr_lr2e-6"] = ([1, 1, 1, 1], cfg(1.0, 2e-6), 0.0)
  study = _study(tmp_path / "c", arms)
  claim = _claim({"q3_instrument": study}, *args)
  assert claim["verdict"] == gates.NOT_ATTRIBUTABLE
  assert "learning-rate control gains as much" in claim["why"]


def test_archived_q4_acr_claim_is_not_tested():
  """The archived 1,000-step study (one update per rollout): its "ACR beats
  TIS" must read "not tested", and its fp32 arm ran without UAQ."""
  path = os.path.join(ROOT, "docs", "qurl", "runs", "q4_long_horizon")
  study = studies_lib.load_study(path)
  claim = _claim(
    {"q4_long_horizon": study}, "q4_long_horizon", "int8_tis", "int8_acr"
  )
  assert claim["verdict"] == gates.NOT_TESTED
  vs_fp32 = _claim(
    {"q4_long_horizon": study}, "q4_long_horizon", "int8_tis", "fp32"
  )
  assert vs_fp32["uaq"] == "1.5 / 1"


# Q6's fair test and Q7: the pre-registered KL-slope readout,
# its exposure gate, the A/A floor and the calibration, on tiny studies.


def _kl(slope, steps=5, spike_at=None):
  """behav_prox_kl = 1e-3 + slope·step over steps 1..steps; a step at
  `spike_at` is set to 1.0 (beyond run.steps, the readout must ignore it)."""
  return [
    1.0 if s == spike_at else 1e-3 + slope * s for s in range(1, steps + 1)
  ]


def _q6_study(
  path,
  acr_slope=1e-5,
  share=0.01,
  minibatches=4,
  machine=None,
  aa=False,
  truncated=0.02,
):
  """TIS's KL grows 2e-5 per step, ACR's `acr_slope`, on every seed; both
  ran run.steps = 4 and logged a 5th step whose KL is 1.0."""

  def cfg(name):
    return _fake_config(name, minibatches, run={"steps": 4})

  def arm(name, slope, correct):
    return {
      "correct": correct,
      "config": cfg(name.removesuffix("_aa")),
      "metrics": {
        "behav_prox_kl": _kl(slope, spike_at=5),
        "tis_truncated_fraction": [truncated] * 5,
      },
    }

  arms = {
    "int8_tis": arm("int8_tis", 2e-5, TIS),
    "int8_acr": arm("int8_acr", acr_slope, ACR),
  }
  if aa:
    arms["int8_tis_aa"] = arm("int8_tis_aa", 2e-5, TIS)
  for seed in (0, 1, 2):
    for name, a in arms.items():
      _fake_run(
        path,
        name,
        seed,
        a["correct"],
        steps=5,
        config=a["config"],
        grad_share=share,
        metrics=a["metrics"],
      )
  setup = {"seeds": [0, 1, 2], "runs": [{"name": n} for n in arms]}
  if machine:
    setup["machine"] = machine
  (path / "ablation.json").write_text(json.dumps(setup))
  return studies_lib.load_study(str(path))


def test_kl_slope_readout_on_a_tiny_study(tmp_path):
  """Slopes 2e-5 (TIS) and 1e-5 (ACR) on every seed: ACR − TIS = −1e-5
  with a point interval, supported; the spike after run.steps is ignored
  (with it the TIS slope would be ~0.1)."""
  study = _q6_study(tmp_path / "q6")
  run = study["runs"]["int8_tis"][0]
  assert fair_test.kl_slope(run) == pytest.approx(2e-5)
  r = _slope({"q6_acr_fair": study}, "q6_acr_fair", "int8_tis", "int8_acr")
  assert r["seeds"] == [0, 1, 2]
  assert (r["slope_a"], r["slope_b"]) == pytest.approx((2e-5, 1e-5))
  assert (r["delta"], r["low"], r["high"]) == pytest.approx((-1e-5,) * 3)
  assert r["verdict"] == "supported"
  # A faster drift under ACR is the opposite finding.
  faster = _q6_study(tmp_path / "faster", acr_slope=3e-5)
  r = _slope({"q6_acr_fair": faster}, "q6_acr_fair", "int8_tis", "int8_acr")
  assert r["verdict"] == "not supported"


def test_kl_slope_readout_is_gated_by_exposure(tmp_path):
  """The pre-registered gate: ACR's mean gradient share below 1e-3 reads
  'not exercised', with the share, whatever the slopes say; one update per
  rollout reads 'not tested'."""
  low = _q6_study(tmp_path / "low", share=2e-4)
  r = fair_test.slope_readout(low, "int8_tis", "int8_acr")
  assert r["high"] < 0  # the interval alone would have supported it
  assert r["verdict"] == f"{gates.NOT_EXERCISED} (gradient share 2.0e-04)"
  one = _q6_study(tmp_path / "one", minibatches=1)
  r = fair_test.slope_readout(one, "int8_tis", "int8_acr")
  assert r["verdict"] == gates.NOT_TESTED
  result = family.page({"q6_acr_fair": low})
  page = "\n".join(
    fair_test.fair_test_section(
      {"q6_acr_fair": low}, result["claims"], result["slopes"]
    )
  )
  assert "not exercised (gradient share 2.0e-04)" in page
  # The share is printed beside the verdict (column "ACR grad share").
  assert "| 2.00e-04 |" in page


def test_kl_slope_on_a_gpu_needs_the_aa_floor(tmp_path):
  """GPU seeds: without an A/A arm the slope readout is not attributable;
  with one that reproduces int8_tis exactly the verdict stands, and the
  page says that a bit-identical pair measured no noise floor."""
  alone = _q6_study(tmp_path / "a", machine="NVIDIA H100 80GB HBM3")
  r = _slope({"q6_acr_fair": alone}, "q6_acr_fair", "int8_tis", "int8_acr")
  assert r["verdict"] == gates.NOT_ATTRIBUTABLE
  with_aa = _q6_study(tmp_path / "b", machine="NVIDIA H100 80GB HBM3", aa=True)
  assert fair_test.slope_aa_floor(with_aa)[0] == 0.0
  r = _slope({"q6_acr_fair": with_aa}, "q6_acr_fair", "int8_tis", "int8_acr")
  assert r["verdict"] == "supported"
  assert "no noise floor measured: the A/A pair (`int8_tis` vs" in r["why"]
  assert "bit-identical" in r["why"]


def test_uncalibrated_cap_marks_q6_verdicts(tmp_path):
  """TIS truncating 10% over its first 30 steps (pre-registered 1-3%):
  every Q6 verdict of that format says C uncalibrated; 2% does not."""
  bad = _q6_study(tmp_path / "bad", truncated=0.10)
  claim = _claim({"q6_acr_fair": bad}, "q6_acr_fair", "int8_tis", "int8_acr")
  assert claim["verdict"] == "supported (C uncalibrated)"
  assert "`int8_tis` truncates 0.100 (C = 2)" in claim["why"]
  good = _q6_study(tmp_path / "good", truncated=0.02)
  claim = _claim({"q6_acr_fair": good}, "q6_acr_fair", "int8_tis", "int8_acr")
  assert claim["verdict"] == "supported"
  assert gates.calibration(good)["tis"]["int8_tis"] == (0.02, True, 2.0)


def test_archive_records_the_gpu_driver_machine(tmp_path):
  """experiments/gpu/qurl_study.py merges a study from per-job directories
  (its ablation.json names one seed and no machine) and writes the machine
  in its summary beside it: the archive carries both, so the study's seeds
  are GPU seeds and every seed on disk is planned."""
  out = tmp_path / "out"
  study = out / "qurl_gpu" / "q6_acr_fair"
  for seed in (0, 1):
    _fake_run(study, "int8_tis", seed, TIS)
  (study / "ablation.json").write_text(
    json.dumps({"seeds": ["0"], "runs": [{"name": "int8_tis"}]})
  )
  (out / "qurl_gpu.json").write_text(
    json.dumps(
      {
        "jobs": {"q6_acr_fair/int8_tis_s0": {"rc": 0}},
        "machine": "NVIDIA H100 80GB HBM3, 81559 MiB",
      }
    )
  )
  (out / "instrument.json").write_text(json.dumps({"accuracy": 0.3}))
  dest = tmp_path / "archive" / "q6_acr_fair"
  studies_lib.archive_study(str(study), str(dest))
  loaded = studies_lib.load_study(str(dest))
  assert loaded["setup"]["seeds"] == [0, 1]
  assert loaded["setup"]["machine"].startswith("NVIDIA H100 80GB HBM3")
  assert loaded["gpu_seeds"] == {0, 1}
  assert (dest / "driver.json").exists() and (dest / "instrument.json").exists()
  assert not (dest / "int8_tis_s0" / "plots.png").exists()


def test_aa_floor_is_borrowed_by_a_study_without_an_aa_arm(tmp_path):
  """Q7 has no A/A arm; its GPU verdicts use q6_acr_fair's (AA_FROM), and
  say where the floor was measured."""
  q6 = _q6_study(tmp_path / "q6", machine="NVIDIA H100", aa=True)
  arms = {
    "fp32": ([0, 0, 1, 1], _fake_config("fp32", 1), 0.0),
    "int8_tis_uaq1": ([0, 1, 1, 1], _fake_config("int8_tis", 1), 0.0),
  }
  q7 = _study(tmp_path / "q7", arms, machine="NVIDIA H100")
  claim = _claim(
    {"q6_acr_fair": q6, "q7_uaq_long_horizon": q7},
    "q7_uaq_long_horizon",
    "fp32",
    "int8_tis_uaq1",
  )
  assert claim["verdict"] == "supported"
  assert "seed 2 of `q6_acr_fair`) is bit-identical" in claim["why"]
  assert claim["noise"] == (
    "no noise floor measured (its A/A pair is bit-identical)"
  )
  alone = _claim(
    {"q7_uaq_long_horizon": q7}, "q7_uaq_long_horizon", "fp32", "int8_tis_uaq1"
  )
  assert alone["verdict"] == gates.NOT_ATTRIBUTABLE


def test_uaq_claims_print_the_visibility_they_changed():
  """Archived: UAQ s=2 against its learning-rate control
  (lr × 2 without UAQ) on one instrument; the verdict carries UAQ's exposure
  (codes a sync changes, update-to-quant-error ratio) of both arms."""
  path = os.path.join(ROOT, "docs", "qurl", "runs", "q3_lr_control")
  study = studies_lib.load_study(path)
  claim = _claim(
    {"q3_lr_control": study},
    "q3_lr_control",
    "int8_acr_lr2e-6",
    "int8_acr_uaq2_lr1e-6",
  )
  # Seed-level intervals over 3 seeds, Holm over the study's 12 tests.
  assert claim["verdict"] == "not resolved at this scale"
  assert "codes changed / sync 1.05e-03 → 9.01e-04" in claim["exposure"]
  assert "update / quant error" in claim["exposure"]
  assert claim["readout"] == "final eval × 256"
  assert claim["noise"] == "no noise floor measured"


def _stale_run(path, name, seed, correct, lag, kl, max_rho):
  """A q8_staleness arm: fp32, one update per rollout, pipelined
  `lag` versions behind θ_old (synchronous at lag 0), 2 logged steps."""
  run = {} if lag == 0 else {"async_mode": "one_step", "pipelined": True}
  run["max_staleness"] = max(lag, 1)
  correction = "naive" if name.endswith("naive") else "decoupled"
  config = _fake_config(f"fp32_{correction}", minibatches=1, run=run)
  metrics = {
    "version_lag_mean": [lag / 2, lag],
    "version_lag_max": [lag / 2, lag],
    "behav_prox_kl": [kl, kl],
    "max_prox_behav_ratio": [max_rho, max_rho],
    "clip_fraction": [0.1 * lag, 0.1 * lag],
  }
  _fake_run(path, name, seed, correct, config=config, metrics=metrics)


def test_staleness_claims_print_lag_and_behav_prox_exposure(tmp_path):
  """A staleness verdict carries each arm's version lag and how
  far π_behav is from π_prox; a lag-0 arm (ρ = 1, one update per rollout)
  is named as one no correction can act on."""
  arms = {
    "fp32_lag0": ([1, 1, 1, 1], 0, 0.0, 1.0),
    "fp32_lag8_naive": ([0, 0, 1, 1], 8, 2e-2, 16.0),
    "fp32_lag8_decoupled": ([1, 1, 1, 1], 8, 3e-2, 12.0),
  }
  for seed in (0, 1, 2):
    for name, (correct, lag, kl, rho) in arms.items():
      _stale_run(tmp_path, name, seed, correct, lag, kl, rho)
  setup = {"seeds": [0, 1, 2], "runs": [{"name": n} for n in arms]}
  (tmp_path / "ablation.json").write_text(json.dumps(setup))
  study = studies_lib.load_study(str(tmp_path))
  worse = _claim(
    {"q8_staleness": study}, "q8_staleness", "fp32_lag8_naive", "fp32_lag0"
  )
  assert worse["verdict"] == "supported"
  assert "version lag mean/max 6.00/8 → 0.00/0" in worse["exposure"]
  assert "behav–prox KL 2.0e-02 → 0.0e+00, max ρ 16 → 1" in worse["exposure"]
  assert "`fp32_lag0` at lag 0: ρ = 1 to float precision" in worse["exposure"]
  both_stale = _claim(
    {"q8_staleness": study},
    "q8_staleness",
    "fp32_lag8_naive",
    "fp32_lag8_decoupled",
  )
  assert "clipped tokens 8.0e-01 → 8.0e-01" in both_stale["exposure"]
  assert "no correction can act" not in both_stale["exposure"]


def test_synchronous_claims_print_no_lag_exposure(tmp_path):
  study = _study(
    tmp_path, {"int8_tis": (TIS, None, 0.01), "int8_acr": (ACR, None, 0.01)}
  )
  claim = _claim({"q6_acr_fair": study}, "q6_acr_fair", "int8_tis", "int8_acr")
  assert "version lag" not in claim["exposure"]
