"""Held-out accuracy on a tool task (--task: tool_arithmetic or
tool_word_problems) with and without the tool, and the throughput of
multi-turn against single-turn rollouts.

  python experiments/tool_eval.py --model=smollm2-135m-instruct \\
      --out_dir=runs/tool_eval/base
  python experiments/tool_eval.py --model=runs/tool_rl \\
      --out_dir=runs/tool_eval/rl                  # latest checkpoint

--model takes the embedded default name, an HF directory or an rljax run
directory (its latest checkpoint, read-only). The problems are the trainer's
held-out stream (`tool_task.held_out_problems`: seed 10_000 + --seed, where
training draws with --seed = the run's `run.seed`); the first `eval_size`
of them are the trainer's own held-out split. Both conditions are greedy
and get the same token budget, --budget ids after the prompt:

  with tools     a multi-turn episode (`rollout_multiturn` on the JAX
                 sampler) in the trainer's environment (`tool_task.
                 make_tool_env`: --tool, --tool_format, --tool_prompt,
                 --max_turns, --turn_tokens per model turn); the budget
                 holds model and tool ids together.
  without tools  one turn, the question and "Put the final answer in
                 \\boxed{}." in the chat template, max_new_tokens = --budget.

Throughput (--throughput_rows > 0): the first rows' episodes again (warm:
greedy repeats every engine call, so nothing compiles), then single-turn
rollouts of the same prompts forced to the same total lengths (no stop id,
a per-row max_new_tokens of each episode's model + tool ids), warmed once
and timed once. tokens/s counts model ids, and model + tool ids.

Writes <out_dir>/summary.json, records.jsonl (one line per problem and
condition) and table.md, and prints the table.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Sequence

import numpy as np
from absl import flags

from rljax import envs
from rljax import hostmem
from rljax.data.prompts import ChatTemplate
from rljax.rollout.base import SamplingConfig
from rljax.rollout.multiturn import MultiTurnConfig, rollout_multiturn
from rljax.train import cli
from rljax.train import tool_task

_MODEL = flags.DEFINE_string(
  "model",
  "smollm2-135m-instruct",
  "Policy: default name, HF directory or rljax run directory.",
)
_N = flags.DEFINE_integer("n", 256, "Held-out problems.")
_SEED = flags.DEFINE_integer(
  "seed", 0, "The training run's run.seed (problems: seed 10_000 + this)."
)
_TASK = flags.DEFINE_enum(
  "task",
  "tool_arithmetic",
  ["tool_arithmetic", "tool_word_problems"],
  "The trainer's tool task whose held-out problems are measured.",
)
_DIFFICULTY = flags.DEFINE_enum(
  "difficulty", "easy", ["easy", "medium", "hard"], "Operations per problem."
)
_TOOL = flags.DEFINE_enum("tool", "calculator", ["calculator", "python"], "")
_FORMAT = flags.DEFINE_enum("tool_format", "tags", ["tags", "qwen"], "")
_PROMPT = flags.DEFINE_enum(
  "tool_prompt", "example", ["plain", "example"], "A worked call or not."
)
_TOOL_CHOICE = flags.DEFINE_enum(
  "tool_choice",
  "auto",
  ["auto", "required"],
  "required: the first turn opens with the call's opening (as the trainer's "
  "--task.tool_choice).",
)
_MAX_TURNS = flags.DEFINE_integer("max_turns", 3, "Model turns per episode.")
_TURN_TOKENS = flags.DEFINE_integer("turn_tokens", 64, "Ids of one turn.")
_BUDGET = flags.DEFINE_integer(
  "budget", 192, "Ids after the prompt, per episode and per single turn."
)
_MAX_PROMPT = flags.DEFINE_integer(
  "max_prompt_tokens", 512, "Engine prompt capacity (prompt + budget)."
)
_BATCH = flags.DEFINE_integer("batch", 128, "Problems per engine batch.")
_THROUGHPUT_ROWS = flags.DEFINE_integer(
  "throughput_rows", 64, "Rows of the throughput comparison; 0 = skip."
)
_OUT_DIR = flags.DEFINE_string("out_dir", "runs/tool_eval", "Output folder.")

NO_TOOL_SUFFIX = "\nPut the final answer in \\boxed{}."


@dataclasses.dataclass(frozen=True)
class ToolEvalConfig:
  """One evaluation (the flags of the same names)."""

  n: int = 256
  seed: int = 0
  task: str = "tool_arithmetic"
  difficulty: str = "easy"
  tool: str = "calculator"
  tool_format: str = "tags"
  tool_prompt: str = "example"
  tool_choice: str = "auto"
  max_turns: int = 3
  turn_tokens: int = 64
  budget: int = 192
  max_prompt_tokens: int = 512
  batch: int = 128
  throughput_rows: int = 64

  def __post_init__(self):
    for name in ("n", "max_turns", "turn_tokens", "budget", "batch"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"ToolEvalConfig.{name}={value!r}; expected int >= 1")
    if self.turn_tokens > self.budget:
      raise ValueError(
        f"ToolEvalConfig.turn_tokens={self.turn_tokens}; expected <= "
        f"budget={self.budget} (a turn is part of the episode)"
      )
    if self.throughput_rows < 0:
      raise ValueError(
        f"ToolEvalConfig.throughput_rows={self.throughput_rows}; "
        "expected >= 0 (0 = skip)"
      )


def _identity(text: str) -> str:
  return text


def _batches(items: Sequence, size: int):
  return [items[i : i + size] for i in range(0, len(items), size)]


def _stderr(p: float, n: int) -> float:
  return math.sqrt(max(p * (1 - p), 0.0) / n) if n else 0.0


class _Setup:
  """The trainer's environment, prompts and sampling for `cfg`."""

  def __init__(self, tokenizer, cfg: ToolEvalConfig):
    self.tokenizer, self.cfg = tokenizer, cfg
    self.tool = tool_task.make_tool(cfg.tool)
    example = (
      tool_task.worked_example(self.tool, cfg.tool_format)
      if cfg.tool_prompt == "example"
      else ""
    )
    self.prompt = tool_task.ToolPrompt(example)
    self.prefill = (
      tool_task.call_prefix(self.tool, cfg.tool_format)
      if cfg.tool_choice == "required"
      else ""
    )
    self.env_config = envs.ToolEnvConfig(
      format=cfg.tool_format,
      max_turns=cfg.max_turns,
      max_total_tokens=cfg.budget,
    )
    self.render = ChatTemplate(tokenizer, user_template=_identity)
    eos = tokenizer.eos_token_id
    self.eos = (int(eos),) if eos is not None else ()

  def make_env(self):
    return tool_task.make_tool_env(
      self.tool,
      self.env_config,
      self.prompt,
      self.tokenizer,
      self.cfg.tool_choice,
    )

  def render_ids(self, text: str) -> list[int]:
    """An episode's first prompt, as the trainer's (with the prefill)."""
    return tool_task.render_prompt_ids(
      self.tokenizer, self.render, text, self.prefill
    )

  def sampling(self, max_new_tokens: int, stop=None) -> SamplingConfig:
    return SamplingConfig(
      n=1,
      greedy=True,
      temperature=0.0,
      max_new_tokens=max_new_tokens,
      stop_token_ids=self.eos if stop is None else stop,
    )

  def episodes(self, engine, examples):
    return rollout_multiturn(
      engine,
      list(examples),
      self.make_env,
      self.tokenizer,
      self.sampling(self.cfg.turn_tokens),
      MultiTurnConfig(max_response_tokens=self.cfg.budget),
      render_prompt=self.render_ids,
    )


def _with_tools(setup: _Setup, engine, examples, bar) -> tuple[dict, list]:
  records, infos, seconds = [], [], 0.0
  model_tok = total_tok = 0
  for chunk in _batches(examples, setup.cfg.batch):
    out = setup.episodes(engine, chunk)
    seconds += out.batch.timing["seconds"]
    for i, e in enumerate(chunk):
      ids, mask = out.batch.response_ids[i], out.batch.action_mask[i]
      model_tok += int(np.sum(mask))
      total_tok += len(ids)
      infos.append(out.infos[i])
      records.append(
        {
          "condition": "with_tools",
          "uid": e.uid,
          "answer": e.answer,
          "correct": bool(out.rewards[i] >= 1.0),
          "finish_reason": out.batch.finish_reason[i],
          "model_tokens": int(np.sum(mask)),
          "tool_tokens": len(ids) - int(np.sum(mask)),
          **{
            k: out.infos[i].get(k)
            for k in ("turns", "tool_calls", "malformed_calls", "stop_reason")
          },
          "tool_errors": dict(out.infos[i].get("tool_errors", {})),
          "response": setup.tokenizer.decode(ids, skip_special_tokens=True),
        }
      )
    bar.update(len(chunk))
  n = len(records)
  summary = {
    **_scored(records),
    **envs.summarize(infos),
    "model_tokens_mean": model_tok / n,
    "tool_tokens_mean": (total_tok - model_tok) / n,
    "seconds": seconds,
    "model_tokens_per_s": model_tok / max(seconds, 1e-9),
    "tokens_per_s": total_tok / max(seconds, 1e-9),
  }
  return summary, records


def _scored(records: list[dict]) -> dict:
  """A condition's accuracy (with its standard error), problem count and
  share of rows cut at the budget, from its records."""
  n = len(records)
  acc = float(np.mean([r["correct"] for r in records]))
  return {
    "accuracy": acc,
    "accuracy_stderr": _stderr(acc, n),
    "problems": n,
    "truncated_rate": float(
      np.mean([r["finish_reason"] == "length" for r in records])
    ),
  }


def _without_tools(setup: _Setup, engine, examples, bar) -> tuple[dict, list]:
  tok, records, seconds, total = setup.tokenizer, [], 0.0, 0
  sampling = setup.sampling(setup.cfg.budget)
  for chunk in _batches(examples, setup.cfg.batch):
    prompts = [
      tool_task.render_prompt_ids(
        tok, setup.render, e.question + NO_TOOL_SUFFIX
      )
      for e in chunk
    ]
    t0 = time.perf_counter()
    rb = engine.generate(prompts, sampling)
    seconds += time.perf_counter() - t0
    for e, ids, finish in zip(chunk, rb.response_ids, rb.finish_reason):
      text = tok.decode(ids, skip_special_tokens=True)
      total += len(ids)
      records.append(
        {
          "condition": "without_tools",
          "uid": e.uid,
          "answer": e.answer,
          "correct": envs.score_answer(text, e.answer) >= 1.0,
          "finish_reason": finish,
          "model_tokens": len(ids),
          "response": text,
        }
      )
    bar.update(len(chunk))
  n = len(records)
  summary = {
    **_scored(records),
    "model_tokens_mean": total / n,
    "seconds": seconds,
    "model_tokens_per_s": total / max(seconds, 1e-9),
    "tokens_per_s": total / max(seconds, 1e-9),
  }
  return summary, records


def _throughput(setup: _Setup, engine, examples) -> dict:
  """Warm multi-turn episodes against single-turn rollouts of the same
  prompts and the same per-row total lengths (see the module doc)."""
  setup.episodes(engine, examples)  # compiles this batch's shapes
  out = setup.episodes(engine, examples)  # greedy: the same calls, warm
  mt_s = out.batch.timing["seconds"]
  lengths = [len(r) for r in out.batch.response_ids]
  model_tok = int(sum(int(np.sum(m)) for m in out.batch.action_mask))
  limits = [max(1, n) for n in lengths]
  sampling = setup.sampling(max(limits), stop=())  # no stop: exact lengths
  engine.generate(out.batch.prompt_ids, sampling, limits)  # compiles
  t0 = time.perf_counter()
  rb = engine.generate(out.batch.prompt_ids, sampling, limits)
  st_s = time.perf_counter() - t0
  st_tok = int(sum(len(r) for r in rb.response_ids))
  return {
    "rows": len(examples),
    "multi_turn": {
      "seconds": mt_s,
      "engine_calls": out.metrics["engine_calls"],
      "model_tokens": model_tok,
      "total_tokens": int(sum(lengths)),
      "model_tokens_per_s": model_tok / max(mt_s, 1e-9),
      "tokens_per_s": sum(lengths) / max(mt_s, 1e-9),
    },
    "single_turn": {
      "seconds": st_s,
      "total_tokens": st_tok,
      "tokens_per_s": st_tok / max(st_s, 1e-9),
    },
    "lengths": {
      "mean": float(np.mean(lengths)),
      "max": int(max(lengths)),
      "min": int(min(lengths)),
    },
  }


def evaluate(
  model, engine, cfg: ToolEvalConfig, progress: bool = True, on_accuracy=None
) -> tuple[dict, list[dict]]:
  """Both conditions (and the throughput comparison) of `cfg` for `model`
  (its tokenizer) on `engine`; returns (summary, per-problem records).
  `on_accuracy(summary, records)` is called before the throughput runs
  (the script saves the accuracies then: the timing runs are the slow,
  optional part)."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top

  setup = _Setup(model.tokenizer, cfg)
  examples = tool_task.held_out_problems(
    cfg.n, cfg.seed, cfg.difficulty, cfg.task
  )
  pool = tool_task.generate_problems(
    cfg.task, tool_task.TOOL_POOL, cfg.seed, cfg.difficulty
  )
  train_q = {e.question for e in pool}
  bar = tqdm(total=2 * cfg.n, desc="tool_eval", disable=not progress)
  try:
    bar.set_description("with tools")
    with_tools, rec_a = _with_tools(setup, engine, examples, bar)
    bar.set_description("without tools")
    without, rec_b = _without_tools(setup, engine, examples, bar)
  finally:
    bar.close()
  summary: dict[str, Any] = {
    "config": dataclasses.asdict(cfg),
    # Training drops held-out questions from its pool; counted, not assumed.
    "train_pool_overlap": sum(e.question in train_q for e in examples),
    "with_tools": with_tools,
    "without_tools": without,
  }
  if on_accuracy is not None:
    on_accuracy(summary, rec_a + rec_b)
  rows = min(cfg.throughput_rows, cfg.n)
  if rows:
    summary["throughput"] = _throughput(setup, engine, examples[:rows])
  return summary, rec_a + rec_b


def markdown_table(label: str, summary: dict) -> str:
  """One row per condition (and the throughput lines) as markdown."""
  a, b = summary["with_tools"], summary["without_tools"]
  lines = [
    "| model | condition | accuracy | tool-call rate | malformed-call "
    "rate | turns | model / tool ids | truncated | s |",
    "|---|---|---|---|---|---|---|---|---|",
    f"| {label} | without tools | {b['accuracy']:.3f} ± "
    f"{b['accuracy_stderr']:.3f} | – | – | 1 | "
    f"{b['model_tokens_mean']:.1f} / 0 | {b['truncated_rate']:.2f} | "
    f"{b['seconds']:.0f} |",
    f"| {label} | with tools | {a['accuracy']:.3f} ± "
    f"{a['accuracy_stderr']:.3f} | {a['tool_call_rate']:.3f} | "
    f"{a['malformed_call_rate']:.3f} | {a['turns_mean']:.2f} | "
    f"{a['model_tokens_mean']:.1f} / {a['tool_tokens_mean']:.1f} | "
    f"{a['truncated_rate']:.2f} | {a['seconds']:.0f} |",
  ]
  t = summary.get("throughput")
  if t:
    mt, st = t["multi_turn"], t["single_turn"]
    lines += [
      "",
      f"Throughput, {t['rows']} rows, mean {t['lengths']['mean']:.1f} ids "
      f"(max {t['lengths']['max']}): multi-turn {mt['seconds']:.2f} s, "
      f"{mt['engine_calls']:.0f} engine calls, {mt['tokens_per_s']:.1f} "
      f"ids/s (model ids {mt['model_tokens_per_s']:.1f}/s); single-turn of "
      f"the same lengths {st['seconds']:.2f} s, {st['tokens_per_s']:.1f} "
      "ids/s.",
    ]
  return "\n".join(lines)


def _machine() -> dict:
  import jax  # pylint: disable=g-import-not-at-top

  cpu = ""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      cpu = next(
        (ln.split(":", 1)[1].strip() for ln in f if "model name" in ln), ""
      )
  except OSError:
    pass
  return {
    "cpu": cpu,
    "cores": os.cpu_count(),
    "load_1m": os.getloadavg()[0],
    "jax_backend": jax.default_backend(),
  }


def main(argv):
  del argv
  from rljax import evaluation  # pylint: disable=g-import-not-at-top
  from rljax.rollout.jax_sampler import JaxSampler  # pylint: disable=g-import-not-at-top

  try:
    cfg = ToolEvalConfig(
      n=_N.value,
      seed=_SEED.value,
      task=_TASK.value,
      difficulty=_DIFFICULTY.value,
      tool=_TOOL.value,
      tool_format=_FORMAT.value,
      tool_prompt=_PROMPT.value,
      tool_choice=_TOOL_CHOICE.value,
      max_turns=_MAX_TURNS.value,
      turn_tokens=_TURN_TOKENS.value,
      budget=_BUDGET.value,
      max_prompt_tokens=_MAX_PROMPT.value,
      batch=_BATCH.value,
      throughput_rows=_THROUGHPUT_ROWS.value,
    )
  except ValueError as e:
    raise cli.UsageError(str(e)) from None
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  t0 = time.perf_counter()
  before = _machine()
  model = evaluation.load_policy(_MODEL.value)
  pad = model.tokenizer.pad_token_id or 0
  engine = JaxSampler(
    model.config,
    model.params,
    max_prompt_len=cfg.max_prompt_tokens,
    max_batch=cfg.batch,
    pad_id=int(pad),
  )

  def save(summary, records):
    summary["meta"] = {
      "model": _MODEL.value,
      **before,
      "load_1m_after": _machine()["load_1m"],
      "wall_s": time.perf_counter() - t0,
    }
    with open(os.path.join(_OUT_DIR.value, "summary.json"), "w") as f:
      json.dump(summary, f, indent=1)
    with open(os.path.join(_OUT_DIR.value, "records.jsonl"), "w") as f:
      for r in records:
        f.write(json.dumps(r) + "\n")

  try:
    summary, records = evaluate(model, engine, cfg, on_accuracy=save)
  finally:
    engine.close()
  save(summary, records)
  table = markdown_table(_MODEL.value, summary)
  with open(os.path.join(_OUT_DIR.value, "table.md"), "w") as f:
    f.write(table + "\n")
  print(table)
  print(
    f"\nwall {summary['meta']['wall_s']:.0f} s on {before['cpu']} "
    f"({before['cores']} cores, load {before['load_1m']:.1f}); "
    f"records in {_OUT_DIR.value}"
  )


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
