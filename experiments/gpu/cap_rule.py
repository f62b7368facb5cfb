"""Q6's pre-registered rule for the cap C (experiments/configs/q6_acr_fair
.json): kept apart from qurl_study.py, which defines absl flags, so that a
test can import it beside other scripts."""

from __future__ import annotations


def choose_cap(by_cap: dict, fmt: str = "") -> dict:
  """The pre-registered rule: of the caps tried ({C: TIS truncated fraction}),
  the one whose truncation is in [1 %, 3 %] and nearest 2 %; if none is in
  range, the nearest 2 % with `in_range` False (the study then says so)."""
  if not by_cap:
    raise RuntimeError(f"no calibration run of {fmt or 'this format'} finished")
  inside = {c: t for c, t in by_cap.items() if 0.01 <= t <= 0.03}
  pool = inside or by_cap
  cap = min(pool, key=lambda c: abs(pool[c] - 0.02))
  return {
    "cap": cap,
    "truncated": by_cap[cap],
    "in_range": bool(inside),
    "measured": {str(c): t for c, t in sorted(by_cap.items())},
  }
