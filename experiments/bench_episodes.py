"""Multi-turn tool episodes with kept KV against single-turn rows of the
same lengths, on the JAX continuous engine.

  python experiments/bench_episodes.py --rows=16 --turn_tokens=32

Each episode is a chat prompt; every model turn that ends (EOS, the chat
formats' end of turn) is answered by a stand-in tool with a fixed
observation (after --tool_sleep seconds, in `MultiTurnConfig.tool_workers`
threads), up to --max_turns turns and --budget ids. Arms, each warmed once
(compiles) and timed once:

  kept KV      `rollout_multiturn(..., kv_reuse=True)`: one engine run,
               observations appended onto each row's KV, no turn barrier;
  per turn     `rollout_multiturn` as before: one engine call per turn,
               every row's history prefilled again (--per_turn);
  single turn  one `generate` of the same prompts, each row forced (no stop
               id) to its episode's total length (model + tool ids);
  vLLM         with --vllm: the per-turn driver on a vLLM sidecar serving
               a bf16 export of the same model, its prefix cache kept
               across calls (each turn prefills only the ids after the
               cached prefix), the same prompts and stand-in tool.

Useful ids/s counts every id of a row after its prompt (model and tool
ids: both are what a row holds); the ratio kept KV / single turn is the
figure to watch (1.0: a turn boundary costs nothing). Prints one JSON line
with the machine (`machine.machine_info`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402  (a sibling module)

_MODEL = flags.DEFINE_string(
  "model",
  "smollm2-135m-instruct",
  "Policy; 'toy': the sharp tiny decoder of tests/rollout/"
  "test_multiturn_kv.py (vocab 128, an id's text its number, turns ending "
  "at any of a few frequent ids), where the engine's own costs dominate.",
)
_ROWS = flags.DEFINE_integer("rows", 16, "Episodes (prompts x n).")
_N = flags.DEFINE_integer("n", 2, "Episodes per prompt.")
_TURN = flags.DEFINE_integer("turn_tokens", 32, "Most ids of a model turn.")
_TURNS = flags.DEFINE_integer("max_turns", 3, "Model turns per episode.")
_BUDGET = flags.DEFINE_integer("budget", 160, "Ids after the prompt.")
_SLOTS = flags.DEFINE_integer("slots", 16, "Decode slots.")
_SLEEP = flags.DEFINE_float("tool_sleep", 0.0, "Seconds a tool call takes.")
_PER_TURN = flags.DEFINE_bool("per_turn", False, "Also the per-turn driver.")
_VLLM = flags.DEFINE_bool(
  "vllm",
  False,
  "Also the per-turn driver on a vLLM sidecar (bf16 export, prefix cache "
  "kept across turns); not with --model=toy.",
)

OBSERVATION = "\n<output>\n42\n</output>\n"
TOY_STOPS = (5, 30, 92, 110, 111)


def _toy():
  """(config, params, tokenizer) of the toy model."""
  import jax  # pylint: disable=g-import-not-at-top

  from rljax import models  # pylint: disable=g-import-not-at-top
  from rljax.models import toy  # pylint: disable=g-import-not-at-top

  config = models.tiny_config(vocab_size=128)
  params = toy.sharp_params(config, jax.random.key(0))
  return config, params, toy.DecimalTokenizer(config.vocab_size)


class StandIn:
  """Answers each ended turn with `OBSERVATION` (after the sleep); the
  episode ends at --max_turns."""

  stop_sequences = ()
  eos_ends_turn = True

  def __init__(self):
    self.turns = 0

  def reset(self, example):
    return example.question

  def step(self, turn):
    del turn
    from rljax.envs.base import StepResult  # pylint: disable=g-import-not-at-top

    if _SLEEP.value:
      time.sleep(_SLEEP.value)
    self.turns += 1
    info = {
      "turns": self.turns,
      "tool_calls": self.turns,
      "malformed_calls": 0,
      "tool_errors": {},
    }
    if self.turns >= _TURNS.value:
      return StepResult("", 0.0, True, info)
    toy = _MODEL.value == "toy"
    return StepResult("20 21 22 23" if toy else OBSERVATION, 0.0, False, info)


def main(argv):
  del argv
  from rljax.data.prompts import ChatTemplate  # pylint: disable=g-import-not-at-top
  from rljax.data.records import Example  # pylint: disable=g-import-not-at-top
  from rljax.models import pretrained  # pylint: disable=g-import-not-at-top
  from rljax.rollout.base import SamplingConfig  # pylint: disable=g-import-not-at-top
  from rljax.rollout.jax_sampler import JaxSampler  # pylint: disable=g-import-not-at-top
  from rljax.rollout.multiturn import MultiTurnConfig, rollout_multiturn  # pylint: disable=g-import-not-at-top

  toy = _MODEL.value == "toy"
  if toy and _VLLM.value:
    raise app.UsageError(
      "--vllm with --model=toy; expected a real model (vLLM serves an HF "
      "export, and the toy model's tokenizer is not one)"
    )
  if toy:
    config, params, tok = _toy()
  else:
    model = pretrained.load_named(_MODEL.value)
    config, params, tok = model.config, model.params, model.tokenizer
    render = ChatTemplate(tok, user_template=lambda text: text)
  engine = JaxSampler(
    config,
    params,
    max_prompt_len=512,
    batching="continuous",
    decode_slots=_SLOTS.value,
    pad_id=int(tok.pad_token_id or 0),
  )
  n = _N.value
  examples = [
    Example(
      question=f"{a % 97 + 1} {a % 13 + 3}"
      if toy
      else f"Use the tool, then tell me {a} plus {a + 7}.",
      answer="",
      uid=str(a),
    )
    for a in range(_ROWS.value // n)
  ]
  sampling = SamplingConfig(
    n=n,
    greedy=True,
    max_new_tokens=_TURN.value,
    stop_token_ids=TOY_STOPS if toy else (int(tok.eos_token_id),),
  )
  limits = MultiTurnConfig(max_response_tokens=_BUDGET.value)

  def episodes(kv_reuse, on=engine, one_per_row=False):
    # vLLM refuses greedy n > 1: each prompt n times at n = 1 gives the
    # same greedy rows.
    rows, per = examples, sampling
    if one_per_row:
      rows = [e for e in examples for _ in range(n)]
      per = dataclasses.replace(sampling, n=1)
    return rollout_multiturn(
      on,
      rows,
      StandIn,
      tok,
      per,
      limits,
      render_prompt=None
      if toy
      else lambda text: tok.encode(render(text), add_special_tokens=False),
      kv_reuse=kv_reuse,
    )

  out = {"machine": machine.machine_info(), "load_1m": os.getloadavg()[0]}
  out["machine"].pop("cpu_flags_all", None)
  arms = [("kept_kv", True)] + (
    [("per_turn", False)] if _PER_TURN.value else []
  )

  def timed(name, kv, on=engine, one_per_row=False):
    # Untimed first: compiles (vLLM: fills the prefix cache, as RL would).
    episodes(kv, on, one_per_row)
    t0 = time.perf_counter()
    got = episodes(kv, on, one_per_row)
    seconds = time.perf_counter() - t0
    ids = sum(len(r) for r in got.batch.response_ids)
    model_ids = int(sum(int(np.sum(m)) for m in got.batch.action_mask))
    out[name] = {
      "seconds": seconds,
      "ids": ids,
      "model_ids": model_ids,
      "ids_per_s": ids / seconds,
      "turns_mean": got.metrics["turns_mean"],
      "engine_calls": got.metrics["engine_calls"],
    }
    print(json.dumps({name: out[name]}), flush=True)  # kept if cut short
    return got

  for name, kv in arms:
    got = timed(name, kv)
    if kv:
      lengths = [max(1, len(r)) for r in got.batch.response_ids]
      prompts = got.batch.prompt_ids
  single = SamplingConfig(
    n=n, greedy=True, max_new_tokens=max(lengths), stop_token_ids=()
  )
  engine.generate(prompts, single, lengths)  # compiles
  t0 = time.perf_counter()
  rb = engine.generate(prompts, single, lengths)
  seconds = time.perf_counter() - t0
  ids = sum(len(r) for r in rb.response_ids)
  out["single_turn"] = {
    "seconds": seconds,
    "ids": ids,
    "ids_per_s": ids / seconds,
  }
  print(json.dumps({"single_turn": out["single_turn"]}), flush=True)
  out["kept_kv_over_single"] = (
    out["kept_kv"]["ids_per_s"] / out["single_turn"]["ids_per_s"]
  )
  out["lengths"] = {"mean": float(np.mean(lengths)), "max": max(lengths)}
  if _VLLM.value:
    _vllm_arm(config, params, tok, timed)
    out["vllm_over_single"] = (
      out["vllm_per_turn"]["ids_per_s"] / out["single_turn"]["ids_per_s"]
    )
  out["load_1m_after"] = os.getloadavg()[0]
  print(json.dumps(out))


def _vllm_arm(config, params, tok, timed) -> None:
  """The per-turn driver on a vLLM sidecar serving a bf16 export of the
  policy, its prefix cache kept across calls (`timed` as the JAX arms)."""
  import tempfile  # pylint: disable=g-import-not-at-top

  from rljax import models  # pylint: disable=g-import-not-at-top
  from rljax.rollout import vllm_sidecar  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory(prefix="bench_episodes_") as work:
    ckpt = os.path.join(work, "vllm-bf16")
    models.save_hf(config, params, ckpt, tok, dtype="bfloat16")
    settings = vllm_sidecar.VLLMSidecarConfig(
      max_model_len=512 + _BUDGET.value,
      fresh_prefix_cache=False,
      max_concurrent_requests=_ROWS.value,
    )
    with vllm_sidecar.VLLMSidecar(ckpt, settings, model_config=config) as eng:
      timed("vllm_per_turn", False, eng, one_per_row=True)


if __name__ == "__main__":
  app.run(main)
