"""Evaluates a policy on verifiable datasets: Avg@1 (greedy), Avg@k, pass@k.

  python experiments/eval.py --model=smollm2-135m-instruct \
      --datasets=gsm8k:../shared/data/gsm8k/test.jsonl,math500:../shared/data/math500/test.jsonl
  python experiments/eval.py --model=runs/main --datasets=arithmetic:easy:200 \
      --samples=8 --temperature=0.6 --k=8

--model takes an HF directory, a .gguf file, the embedded default name, or an
rljax run directory (latest checkpoint; read-only: nothing in it is written
and no engine but --engine starts). Every dataset is read, its fields
checked, before the model loads. Writes <out_dir>/<label>.jsonl (one record
per sample) and <out_dir>/summary.json (rewritten after each dataset, so a
later failure keeps the earlier results; `meta` names the model, engine,
compute dtype, CPU and JAX version), and prints a table. A usage error
prints `error: ...` and exits 2 (`rljax.train.cli`).

Every result is keyed by the dataset's label: the dataset name, or an
explicit LABEL= prefix. Two files of one loader need labels, e.g.
--datasets=a=math500:a.jsonl,b=math500:b.jsonl; a duplicate label is
refused before any model loads.
"""

from __future__ import annotations

import json
import os
import time

from absl import flags

from rljax import hostmem
from rljax import evaluation
from rljax.train import cli
from rljax.rollout.base import SamplingConfig

_MODEL = flags.DEFINE_string(
  "model", "smollm2-135m-instruct", "Policy to evaluate."
)
_DATASETS = flags.DEFINE_string(
  "datasets",
  "arithmetic:easy:200",
  "Comma-separated [LABEL=]NAME[:PATH_OR_LEVEL[:LIMIT]]. LABEL (default: "
  "NAME) keys the result and names <out_dir>/<LABEL>.jsonl; labels must "
  "be unique, so give two files of one NAME each a label "
  "(a=math500:a.jsonl,b=math500:b.jsonl).",
)
_SAMPLES = flags.DEFINE_integer(
  "samples", 1, "Samples per problem (1 = greedy)."
)
_K = flags.DEFINE_integer("k", 1, "k of pass@k (<= samples).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.6, "Used when samples > 1.")
_TOP_P = flags.DEFINE_float("top_p", 0.95, "Used when samples > 1.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512, "Generation budget.")
_ENGINE = flags.DEFINE_enum("engine", "jax", ["jax", "vllm"], "Rollout engine.")
_QUANT = flags.DEFINE_enum(
  "quant", "none", ["none", "bf16", "int8", "fp8"], "Weights the engine runs."
)
_BATCH = flags.DEFINE_integer("max_batch", 64, "Sequences per decode program.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_VLLM_KV_GIB = flags.DEFINE_float(
  "vllm_kv_gib",
  4.0,
  "vLLM CPU KV cache (GiB): room for --vllm_max_seqs "
  "sequences of prompt + --max_new_tokens.",
)
_VLLM_MAX_SEQS = flags.DEFINE_integer(
  "vllm_max_seqs",
  256,
  "Sequences vLLM decodes together (and requests in "
  "flight); more fills the CPU's matmuls better.",
)
_OUT_DIR = flags.DEFINE_string("out_dir", "runs/eval", "Where results go.")


def make_engine(model):
  if _ENGINE.value == "jax":
    from rljax.rollout.jax_sampler import JaxSampler

    pad = model.tokenizer.pad_token_id or 0
    return JaxSampler(
      model.config,
      model.params,
      quant=_QUANT.value,
      max_prompt_len=1024,
      max_batch=_BATCH.value,
      pad_id=int(pad),
      show_progress=True,
    )
  from rljax.rollout import vllm_sidecar

  config = vllm_sidecar.VLLMSidecarConfig(
    max_model_len=2048 + _MAX_NEW.value,
    cpu_kvcache_gib=_VLLM_KV_GIB.value,
    max_concurrent_requests=_VLLM_MAX_SEQS.value,
    extra_args=("--max-num-seqs", str(_VLLM_MAX_SEQS.value)),
    show_progress=True,
  )
  return vllm_sidecar.engine_for_model(
    model.config,
    model.params,
    os.path.join(_OUT_DIR.value, "vllm_start"),
    quant=_QUANT.value,
    tokenizer=model.tokenizer,
    config=config,
  )


def check_model(path: str) -> None:
  """Refuses, before anything loads, a --model that cannot be a policy; a
  directory of runs (an ablation's --out_dir) names the runs in it."""
  if path.lower() == "smollm2-135m-instruct" or path.endswith(".gguf"):
    if path.endswith(".gguf") and not os.path.isfile(path):
      raise cli.UsageError(f"--model={path!r}: no such .gguf file")
    return
  if not os.path.isdir(path):
    raise cli.UsageError(
      f"--model={path!r}: expected an HF directory, a .gguf file, an rljax "
      "run directory or 'smollm2-135m-instruct' (no such path)"
    )
  config_json = os.path.join(path, "config.json")
  if evaluation.is_run_dir(path):
    return
  if os.path.exists(config_json):
    try:
      with open(config_json, encoding="utf-8") as f:
        rljax_run = "algorithm" in json.load(f)
    except (OSError, ValueError):
      rljax_run = False  # the loader names a broken HF config.json
    if rljax_run:
      raise cli.UsageError(
        f"--model={path!r}: no checkpoint in this rljax run directory (it "
        "stopped before its first checkpoint); train it further or evaluate "
        "another"
      )
    return
  runs = sorted(
    d
    for d in os.listdir(path)
    if os.path.isdir(os.path.join(path, d))
    and evaluation.is_run_dir(os.path.join(path, d))
  )
  if runs:
    shown = ", ".join(os.path.join(path, d) for d in runs[:8])
    more = f" (and {len(runs) - 8} more)" if len(runs) > 8 else ""
    raise cli.UsageError(
      f"--model={path!r} is a directory of {len(runs)} runs (an "
      f"ablation's --out_dir?); evaluate one of them: {shown}{more}"
    )
  raise cli.UsageError(
    f"--model={path!r}: the directory has no config.json (not an HF "
    "model) and no checkpoints/ (not an rljax run directory)"
  )


GENERATED = ("arithmetic", "countdown")  # made by a level, not read


def check_specs(text: str, specs) -> None:
  """Refuses, before any file is read, a dataset name no loader knows
  and an explicit LIMIT below 1 (a slice `rows[:-1]` would silently drop
  the last row; `rows[:0]` would be read as every row)."""
  from rljax import data as data_lib  # pylint: disable=g-import-not-at-top

  known = sorted(data_lib.DATASET_SPECS) + list(GENERATED)
  problems = []
  for spec in specs:
    if spec.name not in known:
      problems.append(
        f"unknown dataset {spec.name!r} (known: {', '.join(known)})"
      )
  for item in [t.strip() for t in text.split(",") if t.strip()]:
    body = item.split("=", 1)[1] if "=" in item.split(":", 1)[0] else item
    parts = body.split(":")
    if len(parts) == 3 and int(parts[2]) < 1:  # parse_datasets read an int
      problems.append(
        f"{item!r}: LIMIT={parts[2]}; expected an integer >= 1 (the rows to "
        "evaluate; leave LIMIT out for every row)"
      )
  if problems:
    raise cli.UsageError("--datasets: " + "; ".join(problems))


def load_all_examples(specs) -> dict:
  """{label: examples} of every dataset, read before the model loads: a
  missing file, a bad row or fields the loader does not find are reported
  now, not after the datasets before it were generated."""
  out, problems = {}, []
  for spec in specs:
    if spec.name not in GENERATED and not os.path.exists(spec.path):
      problems.append(f"{spec.label}: no such file {spec.path!r}")
      continue
    try:
      examples = evaluation.load_examples(spec)
    except (ValueError, KeyError, OSError) as e:
      problems.append(f"{spec.label}: {e}")
      continue
    if not examples:
      problems.append(
        f"{spec.label}: no usable row in {spec.path!r} (are the field names "
        f"those the {spec.name!r} loader reads? rljax.data.DATASET_SPECS)"
      )
      continue
    out[spec.label] = examples
  if problems:
    raise cli.UsageError("--datasets: " + "; ".join(problems))
  return out


def run_meta(model, sampling, t0: float) -> dict:
  """What produced the numbers: model, engine, sampling, machine."""
  import jax  # pylint: disable=g-import-not-at-top

  from rljax import models, quant  # pylint: disable=g-import-not-at-top

  if _ENGINE.value == "jax" and _QUANT.value == "none":
    compute = str(models.compute_dtype(model.params))
  else:
    compute = f"{_QUANT.value} weights ({_ENGINE.value})"
  return {
    "model": _MODEL.value,
    "engine": _ENGINE.value,
    "quant": _QUANT.value,
    "compute_dtype": compute,
    "samples": _SAMPLES.value,
    "k": _K.value,
    "temperature": sampling.temperature,
    "top_p": sampling.top_p,
    "max_new_tokens": _MAX_NEW.value,
    "cpu": quant.cpu.host_cpu().model,
    "jax_version": jax.__version__,
    "jax_backend": jax.default_backend(),
    "wall_s": time.perf_counter() - t0,
  }


def write_summary(meta: dict, results: dict) -> None:
  """summary.json, rewritten after every dataset (a later dataset's failure
  keeps the earlier ones' results)."""
  path = os.path.join(_OUT_DIR.value, "summary.json")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump({"meta": meta, "results": results}, f, indent=1)
  os.replace(path + ".tmp", path)


def main(argv):
  del argv
  if _K.value > _SAMPLES.value:
    raise cli.UsageError(f"--k={_K.value} exceeds --samples={_SAMPLES.value}")
  # Every dataset problem is reported before a model loads.
  try:
    specs = evaluation.parse_datasets(_DATASETS.value)
  except ValueError as e:
    raise cli.UsageError(f"--datasets: {e}") from None
  check_specs(_DATASETS.value, specs)
  check_model(_MODEL.value)
  if _ENGINE.value == "vllm":
    import importlib.util  # pylint: disable=g-import-not-at-top

    if importlib.util.find_spec("vllm") is None:
      raise cli.UsageError(
        "--engine=vllm: vLLM is not installed (`bash .ci/install` without "
        "--no-vllm); or --engine=jax"
      )
  examples_of = load_all_examples(specs)
  t0 = time.perf_counter()
  model = evaluation.load_policy(_MODEL.value)
  engine = make_engine(model)
  greedy = _SAMPLES.value == 1
  sampling = SamplingConfig(
    n=_SAMPLES.value,
    greedy=greedy,
    temperature=0.0 if greedy else _TEMPERATURE.value,
    top_p=1.0 if greedy else _TOP_P.value,
    max_new_tokens=_MAX_NEW.value,
    stop_token_ids=(int(model.tokenizer.eos_token_id),),
    seed=_SEED.value,
  )
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  results = {}
  try:
    for spec in specs:
      summary, records = evaluation.evaluate_dataset(
        model, engine, examples_of[spec.label], sampling, _K.value
      )
      results[spec.label] = {"dataset": spec.name, "path": spec.path, **summary}
      with open(os.path.join(_OUT_DIR.value, f"{spec.label}.jsonl"), "w") as f:
        for r in records:
          f.write(json.dumps(r) + "\n")
      write_summary(run_meta(model, sampling, t0), results)
      print(f"[eval] {spec.label}: {json.dumps(summary)}", flush=True)
  finally:
    engine.close()
  meta = run_meta(model, sampling, t0)
  write_summary(meta, results)
  n = _SAMPLES.value
  print(
    f"\n| dataset | examples | avg@{n} | avg@{n} (last number) | "
    f"pass@{_K.value} | mean tokens | truncated | gen s | tok/s |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  for name, s in results.items():
    pk = s[f"pass@{_K.value}"]
    print(
      f"| {name} | {s['examples']} | {s[f'avg@{n}']:.4f} | "
      f"{s[f'avg@{n}_last_number']:.4f} | "
      f"{'–' if pk is None else f'{pk:.4f}'} | "
      f"{s['mean_response_tokens']:.1f} | {s['truncated_fraction']:.3f} | "
      f"{s['generation_s']:.1f} | {s['tokens_per_s']:.1f} |"
    )
  print(f"\nwall time {meta['wall_s']:.1f} s; records in {_OUT_DIR.value}")


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
