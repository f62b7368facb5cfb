"""experiments/tool_eval.py's core (`evaluate`) on the tiny random model,
N=4: both conditions score every problem within the same budget, and the
throughput comparison's single-turn rows have exactly the episodes' lengths.

Runs in a fresh process: the script defines absl flags ("model", "n", ...)
that another experiment's in-process import in this worker would collide
with."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

_PROBE = """
import json, sys
sys.path.insert(0, "experiments")
import tool_eval
from rljax import models
from rljax.rollout.jax_sampler import JaxSampler

model = models.load_named("tiny", 0)
cfg = tool_eval.ToolEvalConfig(
  n=4, budget=24, turn_tokens=12, max_turns=2, max_prompt_tokens=384,
  batch=4, throughput_rows=2, tool_choice=sys.argv[1],
)
engine = JaxSampler(model.config, model.params, max_prompt_len=384,
                    max_batch=4, pad_id=0)
seen = []
summary, records = tool_eval.evaluate(
  model, engine, cfg, progress=False,
  on_accuracy=lambda s, r: seen.append(["throughput" in s, len(r)]),
)
table = tool_eval.markdown_table("tiny", summary)
json.dump({"summary": summary, "records": records, "table": table,
           "seen": seen}, sys.stdout)
"""


def _evaluate(tool_choice: str) -> dict:
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
  )
  proc = subprocess.run(
    [sys.executable, "-c", _PROBE, tool_choice],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a whole script run
def test_both_conditions_and_matched_throughput():
  out = _evaluate("required")
  summary, records = out["summary"], out["records"]
  a, b = summary["with_tools"], summary["without_tools"]
  assert a["problems"] == b["problems"] == 4
  assert [r["condition"] for r in records] == ["with_tools"] * 4 + [
    "without_tools"
  ] * 4
  # Both problem lists are the trainer's held-out stream, in one order.
  assert [r["uid"] for r in records[:4]] == [r["uid"] for r in records[4:]]
  assert records[0]["uid"] == "tool_arithmetic:10000:0"
  for r in records:
    tool_ids = r.get("tool_tokens", 0)
    assert 1 <= r["model_tokens"] + tool_ids <= 24  # the shared budget
  for s, rows in ((a, records[:4]), (b, records[4:])):
    assert s["accuracy"] == sum(r["correct"] for r in rows) / 4
    assert 0.0 <= s["truncated_rate"] <= 1.0
  for key in ("tool_call_rate", "malformed_call_rate", "turns_mean"):
    assert 0.0 <= a[key] <= 2.0
  assert summary["train_pool_overlap"] == 0
  t = summary["throughput"]
  assert t["rows"] == 2
  # Single-turn rows forced to the episodes' own total lengths.
  assert t["single_turn"]["total_tokens"] == t["multi_turn"]["total_tokens"]
  assert t["multi_turn"]["total_tokens"] >= t["multi_turn"]["model_tokens"]
  assert "| tiny | with tools |" in out["table"]
  # The accuracies are handed out (saved) before the timing runs.
  assert out["seen"] == [[False, 8]]
