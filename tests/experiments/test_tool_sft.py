"""experiments/tool_sft.py: each demonstration is an episode of the
trainer's environment laid out as the multi-turn driver lays it (the loss
mask on the call and the answer only), and its step lowers the loss on
them (tiny model). In a fresh process: the script defines absl flags."""

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
import numpy as np, optax
import tool_sft
from rljax import envs, models
from rljax.data.prompts import ChatTemplate
from rljax.train import tool_task

model = models.load_named("tiny", 0)
tok = model.tokenizer
tool = envs.CalculatorTool()
config = envs.ToolEnvConfig(format="tags", max_turns=4)
make_env = lambda: tool_task.make_tool_env(
  tool, config, tool_task.ToolPrompt(), tok)
render = ChatTemplate(tok, user_template=lambda s: s)
examples = tool_task.generate_problems("tool_arithmetic", 4, 0, "medium")
rows = [tool_sft.demonstration(tok, render, make_env, tool, "tags", e)
        for e in examples]
out = {"trained": [], "prompts": [], "answers": [e.answer for e in examples]}
for (ids, mask), e in zip(rows, examples):
  first = mask.index(1)
  out["prompts"].append(ids[:first] == tool_task.render_prompt_ids(
    tok, render, make_env().reset(e)))
  out["trained"].append(tok.decode([t for t, m in zip(ids, mask) if m]))
word = tool_task.generate_problems("tool_word_problems", 1, 0, "easy")[0]
out["python_call"] = tool_sft.call_text(envs.PythonTool(), "qwen", word)
out["code"] = word.metadata["code"]
width = max(len(r[0]) for r in rows)
optimizer = optax.adamw(1e-2)
step = tool_sft.make_step(model.config, optimizer)
params, state = model.params, optimizer.init(model.params)
batch = tool_sft._pad(rows, width, 0)
losses = []
for _ in range(3):
  params, state, loss = step(params, state, *batch)
  losses.append(float(loss))
out["losses"] = losses
json.dump(out, sys.stdout)
"""


def test_demonstrations_and_their_loss():
  proc = subprocess.run(
    [sys.executable, "-c", _PROBE],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT),
    timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout)
  assert all(out["prompts"])  # the prompt is the trainer's, untrained
  for text, answer in zip(out["trained"], out["answers"]):
    # The call and the answer (with the end-of-turn id), never the tool's
    # output.
    assert text.startswith("<calculator>") and "</calculator>" in text
    assert text.endswith(f"The answer is \\boxed{{{answer}}}.<|im_end|>")
    assert "<output>" not in text
  call = out["python_call"]
  assert call.startswith("<tool_call>\n") and call.endswith("\n</tool_call>")
  body = json.loads(call.split("\n", 1)[1].rsplit("\n", 1)[0])
  assert body == {"name": "python", "arguments": {"code": out["code"]}}
  first, *_, last = out["losses"]
  assert last < first, out["losses"]


def _sft(out_dir, *extra):
  return [
    sys.executable,
    os.path.join(ROOT, "experiments", "tool_sft.py"),
    "--model=tiny",
    "--demos=8",
    "--batch=4",
    "--steps=4",
    "--save_every=2",
    "--max_len=256",
    f"--out_dir={out_dir}",
    *extra,
  ]


@pytest.mark.slow
def test_a_stopped_run_resumes_to_the_same_weights(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  whole = tmp_path / "whole"
  subprocess.run(_sft(whole), env=env, check=True, timeout=900)
  cut = tmp_path / "cut"
  # Stopped after step 2 as a kill would leave it: its checkpoint only.
  subprocess.run(_sft(cut, "--stop_after=2"), env=env, check=True, timeout=900)
  assert (cut / "state.pkl").is_file()
  assert not (cut / "model").exists()
  done = subprocess.run(
    _sft(cut), env=env, capture_output=True, text=True, timeout=900
  )
  assert "resumed after step 2" in done.stdout, done.stderr[-2000:]
  assert not (cut / "state.pkl").exists()
  weights = "model/model.safetensors"
  assert (cut / weights).read_bytes() == (whole / weights).read_bytes()
  steps = [json.loads(x)["step"] for x in open(cut / "metrics.jsonl")]
  assert steps[-2:] == [3, 4]
