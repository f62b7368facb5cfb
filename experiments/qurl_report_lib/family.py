"""Every verdict on the page as one family of tests: the claims table's
claims and Q6's KL-slope readouts are evaluated (raw one-sided p-values),
adjusted together by Holm's method (stats.holm), and only then given their
verdicts and gates (claims.finish, fair_test.finish_slope)."""

from __future__ import annotations

from qurl_report_lib import claims as claims_lib
from qurl_report_lib import fair_test
from qurl_report_lib import stats


def page(studies: dict[str, dict]) -> dict:
  """{"claims": rows, "slopes": rows, "tests": m}: the finished rows of
  the claims table and of Q6's KL-slope readouts; m one-sided tests were
  adjusted together."""
  claims = claims_lib.evaluate(studies)
  slopes = fair_test.slope_results(studies, claims)
  tested = [r for r in claims + slopes if r.get("p_raw")]
  raw = [r["p_raw"][side] for r in tested for side in ("for", "against")]
  adjusted = stats.holm(raw)
  for i, row in enumerate(tested):
    row["p"] = {"for": adjusted[2 * i], "against": adjusted[2 * i + 1]}
  by_key = {(r["study"], r["a"], r["b"]): r for r in claims}
  for row in claims:
    claims_lib.finish(row, studies, by_key)
  for row in slopes:
    fair_test.finish_slope(row, studies)
  return {"claims": claims, "slopes": slopes, "tests": len(raw)}


def claims_section(studies: dict[str, dict]) -> tuple[list[str], list[dict]]:
  """(markdown lines, finished claim rows) of the claims table."""
  result = page(studies)
  return claims_lib.render(result["claims"], result["tests"]), result["claims"]
