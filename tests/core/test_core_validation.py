"""Tests of the shared config-field rules in rljax.core._validation (the
checks SamplingConfig, RolloutBatch and VLLMSidecarConfig run)."""

import math

import numpy as np
import pytest

from rljax.core import _validation as v


class TestTypeRules:
  @pytest.mark.parametrize("value", [0, -3, np.int32(7)])
  def test_is_int_accepts_ints(self, value):
    assert v.is_int(value) is None

  @pytest.mark.parametrize("value", [True, 1.0, "1", None])
  def test_is_int_refuses_bools_floats_and_strings(self, value):
    assert v.is_int(value) == "an int"

  @pytest.mark.parametrize("value", [0, 0.5, np.float32(2.0), np.int64(1)])
  def test_is_real_accepts_numbers(self, value):
    assert v.is_real(value) is None

  @pytest.mark.parametrize("value", [False, "0.5", None])
  def test_is_real_refuses_bools_and_strings(self, value):
    assert v.is_real(value) == "a number"

  def test_is_bool_and_non_empty_str(self):
    assert v.is_bool(np.bool_(True)) is None and v.is_bool(1) == "a bool"
    assert v.non_empty_str("x") is None
    assert v.non_empty_str("") == v.non_empty_str(3) == "a non-empty str"


class TestOfType:
  """The Python types a config records in JSON (train/config/validation)."""

  def test_int_is_a_python_int_and_never_a_bool_or_numpy(self):
    rule = v.of_type(int)
    assert rule(3) is None and rule(-1) is None
    for bad in (True, 3.0, np.int64(3), "3"):
      assert rule(bad) == "an int", bad

  def test_float_takes_ints_but_not_bools_or_numpy(self):
    rule = v.of_type(float)
    assert rule(0.5) is None and rule(2) is None and rule(math.inf) is None
    for bad in (False, np.float32(0.5), "0.5", None):
      assert rule(bad) == "a number", bad

  def test_bool_and_str(self):
    assert v.of_type(bool)(True) is None
    assert v.of_type(bool)(1) == v.of_type(bool)(np.bool_(True)) == "a bool"
    assert v.of_type(str)("") is None and v.of_type(str)(1) == "a str"


class TestInRange:
  def test_closed_and_open_ends(self):
    closed, half_open = v.in_range(0, 1), v.in_range(0, 1, lo_open=True)
    assert closed(0) is None and closed(1) is None
    assert half_open(0) == "a value in (0, 1]" and half_open(1e-9) is None
    assert closed(1.5) == "a value in [0, 1]"

  def test_nan_is_never_in_range(self):
    assert v.in_range()(math.nan) == "a value in (-inf, inf)"

  def test_infinite_ends_are_written_open(self):
    assert v.interval_text(0.0, math.inf) == "[0.0, inf)"
    assert v.interval_text(-math.inf, 2, hi_open=True) == "(-inf, 2)"


class TestComposition:
  def test_at_least_says_why(self):
    rule = v.at_least(0, "0 turns it off")
    assert rule(0) is None and rule(-1) == ">= 0 (0 turns it off)"
    assert v.at_least(1)(0) == ">= 1"

  def test_all_of_reports_the_first_failure(self):
    rule = v.all_of(v.is_int, v.at_least(1))
    assert rule(True) == "an int"  # the range rule never sees a bool
    assert rule(0) == ">= 1" and rule(3) is None

  def test_optional_and_one_of_and_expect(self):
    rule = v.optional(v.one_of("a", "b"))
    assert rule(None) is None and rule("a") is None
    assert rule("c") == "one of ('a', 'b')"
    assert v.expect(v.at_least(1), "a positive count")(0) == "a positive count"
    assert v.expect(v.at_least(1), "a positive count")(2) is None


class TestFieldMessage:
  def test_one_wording_for_fields_and_flags(self):
    assert (
      v.field_message("--loss.eps_high", -1, ">= 0")
      == "--loss.eps_high=-1; expected >= 0"
    )
    # numpy scalars are shown as the user wrote them, strings quoted.
    assert v.field_message("x", np.float64(0.5), "e") == "x=0.5; expected e"
    assert v.field_message("x", "a", "e") == "x='a'; expected e"


class TestCheckField:
  def test_names_owner_field_value_and_expectation(self):
    with pytest.raises(ValueError, match=r"^Cfg\.n=0; expected >= 1$"):
      v.check_field("Cfg", "n", 0, v.at_least(1))

  def test_error_type_and_numpy_values_shown_as_written(self):
    with pytest.raises(TypeError, match=r"^Cfg\.t=0\.5; expected an int$"):
      v.check_field("Cfg", "t", np.float64(0.5), v.is_int, TypeError)

  def test_passing_value_raises_nothing(self):
    v.check_field("Cfg", "n", 2, v.at_least(1))
