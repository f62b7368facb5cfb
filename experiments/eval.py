"""Evaluates a policy on verifiable datasets: Avg@1 (greedy), Avg@k, pass@k.

  python experiments/eval.py --model=smollm2-135m-instruct \
      --datasets=gsm8k:../shared/data/gsm8k/test.jsonl,math500:../shared/data/math500/test.jsonl
  python experiments/eval.py --model=runs/main --datasets=arithmetic:easy:200 \
      --samples=8 --temperature=0.6 --k=8

--model takes an HF directory, a .gguf file, the embedded default name, or an
rljax run directory (latest checkpoint; read-only: nothing in it is written
and no engine but --engine starts). Writes <out_dir>/summary.json and
<out_dir>/<label>.jsonl (one record per sample) and prints a table.

Every result is keyed by the dataset's label: the dataset name, or an
explicit LABEL= prefix. Two files of one loader need labels, e.g.
--datasets=a=math500:a.jsonl,b=math500:b.jsonl; a duplicate label is
refused before any model loads.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags

from rljax import hostmem
from rljax import evaluation
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


def main(argv):
  del argv
  if _K.value > _SAMPLES.value:
    raise app.UsageError(f"--k={_K.value} exceeds --samples={_SAMPLES.value}")
  # Every dataset problem is reported before a model loads.
  try:
    specs = evaluation.parse_datasets(_DATASETS.value)
  except ValueError as e:
    raise app.UsageError(f"--datasets: {e}") from None
  missing = [
    f"{s.label}: {s.path}"
    for s in specs
    if s.name not in ("arithmetic", "countdown") and not os.path.exists(s.path)
  ]
  if missing:
    raise app.UsageError("--datasets: no such file: " + ", ".join(missing))
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
  for spec in specs:
    examples = evaluation.load_examples(spec)
    summary, records = evaluation.evaluate_dataset(
      model, engine, examples, sampling, _K.value
    )
    results[spec.label] = {"dataset": spec.name, "path": spec.path, **summary}
    with open(os.path.join(_OUT_DIR.value, f"{spec.label}.jsonl"), "w") as f:
      for r in records:
        f.write(json.dumps(r) + "\n")
    print(f"[eval] {spec.label}: {json.dumps(summary)}", flush=True)
  engine.close()
  meta = {
    "model": _MODEL.value,
    "engine": _ENGINE.value,
    "quant": _QUANT.value,
    "samples": _SAMPLES.value,
    "k": _K.value,
    "temperature": sampling.temperature,
    "top_p": sampling.top_p,
    "max_new_tokens": _MAX_NEW.value,
    "wall_s": time.perf_counter() - t0,
  }
  with open(os.path.join(_OUT_DIR.value, "summary.json"), "w") as f:
    json.dump({"meta": meta, "results": results}, f, indent=1)
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
  app.run(main)
