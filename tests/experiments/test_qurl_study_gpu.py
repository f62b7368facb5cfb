"""experiments/gpu/cap_rule.py: the pre-registered choice of the cap C
(experiments/gpu/qurl_study.py --mode=calibrated)."""

import os
import sys

import pytest

sys.path.insert(
  0,
  os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "gpu"),
)
import cap_rule  # noqa: E402


def test_keeps_the_cap_in_range_nearest_two_percent():
  # The H100 calibration of 2026-11-27 (INT8): 1.1 truncated 2.2 %.
  measured = {1.05: 0.0539, 1.1: 0.0216, 1.15: 0.0082, 1.2: 0.0067}
  chosen = cap_rule.choose_cap(measured, "int8")
  assert chosen["cap"] == 1.1
  assert chosen["in_range"] is True
  assert chosen["measured"]["1.05"] == pytest.approx(0.0539)


def test_only_caps_inside_the_range_are_kept():
  # 1.2 (3.05 %) and 1.4 (0.99 %) fall just outside [1 %, 3 %]; 1.3
  # (1.05 %) is inside, so it is kept.
  chosen = cap_rule.choose_cap({1.2: 0.0305, 1.3: 0.0105, 1.4: 0.0099})
  assert chosen["cap"] == 1.3 and chosen["in_range"] is True


def test_out_of_range_is_flagged():
  chosen = cap_rule.choose_cap({1.02: 0.10, 1.05: 0.08}, "int8")
  assert chosen["cap"] == 1.05
  assert chosen["in_range"] is False


def test_no_run_finished_is_an_error():
  with pytest.raises(RuntimeError, match="fp8"):
    cap_rule.choose_cap({}, "fp8")
