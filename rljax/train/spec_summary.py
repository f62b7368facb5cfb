"""The run summary's speculation entry: what speculative decoding did over
a run's steps (`rollout.speculative`), from the per-step `spec_*` metrics
the JAX sampler reports (`rljax.rollout.spec_control.figures`)."""

from __future__ import annotations

from typing import Any


def summary(rows: list[dict]) -> dict[str, Any] | None:
  """Totals and weighted means of the steps' `spec_*` metrics, and the
  rollout's tokens/s at the first and last step; None when no step
  reported speculation."""
  steps = [r for r in rows if "spec_drafted" in r]
  if not steps:
    return None
  total = lambda key: float(sum(r.get(key, 0.0) for r in steps))
  drafted = total("spec_drafted")
  verify = total("spec_verify_steps")
  out = {
    "steps": len(steps),
    "verify_steps": verify,
    "plain_steps": total("spec_plain_steps"),
    "drafted": drafted,
    "acceptance": total("spec_accepted") / drafted if drafted else 0.0,
    # Weighted by each step's verify steps (a step without any adds none).
    "tokens_per_row_step": (
      sum(r["spec_tokens_per_row_step"] * r["spec_verify_steps"] for r in steps)
      / verify
      if verify
      else 0.0
    ),
  }
  for source in ("self", "sibling", "history"):
    key = f"spec_share_{source}"
    out[f"share_{source}"] = (
      sum(r.get(key, 0.0) * r["spec_drafted"] for r in steps) / drafted
      if drafted
      else 0.0
    )
  speed = [
    r["rollout_tokens_per_s"] for r in steps if "rollout_tokens_per_s" in r
  ]
  if speed:
    out["rollout_tokens_per_s_first"] = float(speed[0])
    out["rollout_tokens_per_s_last"] = float(speed[-1])
  return out


def line(spec: dict[str, Any]) -> str:
  """One line for the run's output."""
  text = (
    f"[rljax] speculation over {spec['steps']} steps: acceptance "
    f"{spec['acceptance']:.2f}, {spec['tokens_per_row_step']:.2f} tokens a "
    f"row per verify step, {spec['verify_steps']:.0f} verify / "
    f"{spec['plain_steps']:.0f} plain decode steps, drafts from self "
    f"{spec['share_self']:.0%} / siblings {spec['share_sibling']:.0%} / "
    f"earlier responses {spec['share_history']:.0%}"
  )
  if "rollout_tokens_per_s_first" in spec:
    text += (
      f"; rollout tokens/s {spec['rollout_tokens_per_s_first']:.0f} at the "
      f"first step, {spec['rollout_tokens_per_s_last']:.0f} at the last"
    )
  return text
