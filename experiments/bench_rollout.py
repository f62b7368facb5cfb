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
one table per shape, and every ratio of issue 15's targets: JAX vs vLLM at the
same precision, INT8 vs the engine's best of f32/bf16, the KL beside each.
With --plot it draws tokens/s against batch (P x N) per engine x precision.

Usage:
  python experiments/bench_rollout.py --small
  # What docs/performance.md reports (both shapes, both engines):
  python experiments/bench_rollout.py --engines=jax,vllm \
      --shapes=16x8x128,64x8x256 --out=docs/performance/rollout.json \
      --plot=docs/figures/rollout_tokens_per_s.png \
      --markdown=docs/performance/rollout_table.md
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from rljax import hostmem
from rljax import models
from rljax import quant as quant_lib
from rljax import tracing
from rljax.rollout import base
from rljax.rollout.jax_sampler import JaxSampler

from machine import machine_info  # experiments/, the script's own folder

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
  "stop at EOS), longtail (seeded heavy-tailed lengths), fixed; given, they "
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
_SLOTS = flags.DEFINE_integer(
  "slots", 32, "--workloads: the JAX sampler's decode slots (max_batch)."
)
_GROUP_WIDTHS = flags.DEFINE_list(
  "group_widths",
  ["0"],
  "--workloads: continuous batching's rows per slot group, one row each "
  "(0: n, a group is a prompt's n samples).",
)
_KV_PAGE_SIZES = flags.DEFINE_list(
  "kv_page_sizes",
  ["0"],
  "--workloads: continuous batching's KV page sizes, one row each (0: an "
  "own cache of slots x the longest live row; P: pages of P tokens, "
  "rljax/rollout/kv_pages.py).",
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

_QUESTIONS = (
  "What is {a}+{b}?",
  "Compute {a} times {b}.",
  "If I have {a} apples and eat {b}, how many are left?",
  "Write a short poem about the number {a}.",
  "Explain why {a} is or is not a prime number.",
  "What is {a} minus {b}? Answer step by step.",
)


def make_prompts(
  tokenizer, num: int, seed: int, vocab_size: int
) -> list[list[int]]:
  """Chat-templated small math/writing questions (random ids without a
  tokenizer), generated here so the benchmark needs no dataset."""
  rng = np.random.default_rng(seed)
  if tokenizer is None:
    return [
      rng.integers(3, vocab_size, size=int(rng.integers(20, 60))).tolist()
      for _ in range(num)
    ]
  prompts = []
  for i in range(num):
    text = _QUESTIONS[i % len(_QUESTIONS)].format(
      a=int(rng.integers(2, 100)), b=int(rng.integers(2, 100))
    )
    chat = tokenizer.apply_chat_template(
      [{"role": "user", "content": text}],
      tokenize=False,
      add_generation_prompt=True,
    )
    prompts.append(tokenizer.encode(chat, add_special_tokens=False))
  return prompts


@functools.partial(jax.jit, static_argnums=0)
def _kl_and_logp(configs, params_q, params_f, tokens, mask, temperature):
  """Exact KL(π_q || π_f) per position and log π_f of the next token.

  configs: (config of π_q, config of π_f, π_q's activation dtype or None),
  so π_q is the function the engine ran (`JaxSampler.activation_dtype`).
  """
  config_q, config_f, act_q = configs
  zq = models.forward(config_q, params_q, tokens, mask, activation_dtype=act_q)
  zq = zq[:, :-1] / temperature
  zf = models.forward(config_f, params_f, tokens, mask)[:, :-1] / temperature
  log_q = jax.nn.log_softmax(zq, axis=-1)
  log_f = jax.nn.log_softmax(zf, axis=-1)
  kl = jnp.sum(jnp.exp(log_q) * (log_q - log_f), axis=-1)
  logp_f = jnp.take_along_axis(log_f, tokens[:, 1:, None], axis=-1)[..., 0]
  return kl, logp_f


def policy_mismatch(
  config,
  params_q,
  params_f32,
  batch: base.RolloutBatch,
  temperature: float,
  num_rows: int,
  chunk: int,
  f32_config=None,
  activation_dtype=None,
) -> tuple[float, float]:
  """(exact KL or nan, k1 KL) of the engine's samples to the f32 policy.

  params_q None means the engine's logits are not available (vLLM): only the
  k1 estimate mean(behav_logp − logp_f32) is returned.
  """
  if num_rows <= 0:
    return float("nan"), float("nan")
  rows = np.linspace(0, batch.num_samples - 1, min(num_rows, batch.num_samples))
  rows = np.unique(rows.astype(int))
  packed = batch.pack()
  exact_sum, k1_sum, count = 0.0, 0.0, 0.0
  for start in range(0, len(rows), chunk):
    idx = rows[start : start + chunk]
    pad = chunk - len(idx)  # Keep one shape: one compile.
    idx_full = np.concatenate([idx, np.repeat(idx[-1:], pad)])
    tokens = jnp.asarray(packed["tokens"][idx_full])
    mask = jnp.asarray(packed["attention_mask"][idx_full])
    configs = (
      config if params_q is not None else f32_config or config,
      f32_config or config,
      activation_dtype if params_q is not None else None,
    )
    kl, logp_f = _kl_and_logp(
      configs,
      params_q if params_q is not None else params_f32,
      params_f32,
      tokens,
      mask,
      jnp.float32(temperature),
    )
    resp = packed["response_mask"][idx]
    exact_sum += float(np.sum(np.asarray(kl)[: len(idx)] * resp))
    k1_sum += float(
      np.sum(
        (packed["behav_logp"][idx] - np.asarray(logp_f)[: len(idx)]) * resp
      )
    )
    count += float(resp.sum())
  exact = exact_sum / count if params_q is not None else float("nan")
  return exact, k1_sum / count


def _traced(sampler, prompts, sampling, quant: str, args) -> dict:
  """One more rollout under the profiler (not the timed one: tracing
  slows the host's launches); `rljax.tracing.summarize` of it."""
  if not args.get("trace_dir"):
    return {}
  shape = f"{len(prompts)}x{sampling.n}x{sampling.max_new_tokens}"
  where = os.path.join(args["trace_dir"], f"{quant}_{shape}")
  t0 = time.perf_counter()
  with jax.profiler.trace(where, create_perfetto_trace=True):
    sampler.generate(prompts, sampling)
  summary = tracing.summarize(where)
  summary["traced_wall_ms"] = (time.perf_counter() - t0) * 1e3
  for dev, b in summary.get("device_busy", {}).items():
    print(
      f"  trace {quant} {shape} {dev}: busy {b['busy_ms']:.1f} of "
      f"{b['window_ms']:.1f} ms ({100 * b['busy_frac']:.0f} %), "
      f"{b['kernels']} kernels"
    )
  for name, ms, n in summary.get("top_ops", [])[:8]:
    print(f"  trace {quant} {shape} {ms:9.2f} ms {n:6d}x  {name[:90]}")
  return summary


def bench_jax(model, quant: str, prompts, sampling, args) -> dict:
  backend = jax.default_backend()
  mode = {"f32": "none", "int8h": "int8"}.get(quant, quant)
  # FP8 off a GPU is emulated (no native f8 dot there).
  fake = quant == "fp8" and backend != "gpu"
  # A fixed float-leaf dtype: the sampler runs weights prepared here, as the
  # trainer's does (quant="none"), so the label keeps its format.
  leaves = args.get("quant_float_leaves", "auto")
  prepared = leaves != "auto" and quant_lib.is_quantized(mode)
  sampler = JaxSampler(
    model.config,
    quant="none" if prepared else mode,
    fake_quant=fake,
    max_prompt_len=max(len(p) for p in prompts),
    max_batch=args["max_batch"],
    pad_id=0,
    head_quant="int8" if quant == "int8h" else "none",
    fuse_projections=args.get("fuse_projections"),
  )

  def weights():
    if not prepared:
      return model.params
    return quant_lib.prepare_rollout_weights(
      model.config,
      model.params,
      mode,
      fake=fake,
      float_dtype=None if leaves == "float32" else leaves,
    )

  sampler.update_weights(weights())  # the first sync also traces ops
  sync = sampler.update_weights(weights())
  compile_s = sampler.warmup(prompts, sampling)
  load = os.getloadavg()[0]
  cpu0 = time.process_time()
  batch = sampler.generate(prompts, sampling)
  cpu_s = time.process_time() - cpu0
  load = max(load, os.getloadavg()[0])
  trace = _traced(sampler, prompts, sampling, quant, args)
  kl, k1 = policy_mismatch(
    sampler.rollout_config,
    sampler.params,
    model.params,
    batch,
    sampling.temperature,
    args["kl_rows"],
    args["kl_chunk"],
    f32_config=model.config,
    activation_dtype=sampler.activation_dtype,
  )
  row = _row("jax", quant, batch, sync, kl, k1, sampling)
  row.update(
    compile_s=compile_s,
    float_leaves=str(models.compute_dtype(sampler.params)),
    fused_projections=sampler.fuse_projections,
    fake_quant=sampler.fake_quant,
    backend=backend,
    load=load,
    cpu_s=cpu_s,
    tokens_per_cpu_s=row["tokens"] / max(cpu_s, 1e-9),
    **({"trace": trace} if trace else {}),
    sync_phases={
      "quantize_s": float(sync.seconds),
      "transfer_s": 0.0,
      "reload_s": 0.0,
    },
  )
  sampler.close()
  return row


def bench_vllm(model, quant: str, prompts, sampling, args, workdir) -> dict:
  from rljax.rollout import vllm_sidecar  # pylint: disable=g-import-not-at-top

  ckpt = os.path.join(workdir, f"vllm-{quant}")
  if quant == "bf16":
    models.save_hf(
      model.config, model.params, ckpt, model.tokenizer, dtype="bfloat16"
    )
  elif quant == "int8":
    models.export_compressed_tensors_int8(
      model.config, model.params, ckpt, model.tokenizer
    )
  else:
    raise ValueError(
      f"--vllm_quants has {quant!r}; expected bf16 or int8 "
      "(vLLM has no FP8 on CPU; on GPU add an fp8 export)"
    )
  max_len = max(len(p) for p in prompts) + sampling.max_new_tokens + 16
  config = vllm_sidecar.VLLMSidecarConfig(
    max_model_len=max(256, max_len),
    cpu_kvcache_gib=args["vllm_kv_gib"],
    max_concurrent_requests=len(prompts),
    extra_args=("--max-num-batched-tokens", str(args["vllm_batched_tokens"])),
  )
  # Every tensor of `perturbed` differs from the model's (as after an RL
  # step), so alternating syncs move every tensor.
  leaves, treedef = jax.tree_util.tree_flatten(model.params)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  perturbed = jax.tree_util.tree_unflatten(
    treedef,
    [
      x + 1e-2 * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
      for x, k in zip(leaves, keys)
    ],
  )
  with vllm_sidecar.VLLMSidecar(ckpt, config, model_config=model.config) as eng:
    # As the trainer syncs (`train.actor`): Q(θ) (or the bf16 cast) on the
    # device, then the engine's update; the first sync also traces the
    # conversion and fills the sidecar's buffers, so it is not timed.
    def synced(params):
      start = time.perf_counter()
      rparams = quant_lib.prepare_rollout_weights(model.config, params, quant)
      jax.block_until_ready(rparams)
      quantize_s = time.perf_counter() - start
      stats = eng.update_weights(rparams)
      total = base.SyncStats(
        seconds=quantize_s + stats.seconds, bytes=stats.bytes
      )
      phases = dict(getattr(eng, "last_sync_timing", None) or {})
      return total, {"quantize_s": quantize_s, **phases}

    synced(perturbed)
    runs = [
      synced(model.params if i % 2 == 0 else perturbed)
      for i in range(max(1, args["vllm_syncs"]))
    ]
    for i, (s, p) in enumerate(runs):
      print(
        f"vllm {quant} sync {i}: {s.seconds:.3f} s, "
        f"{s.bytes / 2**20:.1f} MiB, "
        + ", ".join(
          f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
          for k, v in p.items()
        )
      )
    # The sync of median total time; the last one restored model.params
    # only when the count is odd, so restore them for the rollout below.
    sync, phases = sorted(runs, key=lambda r: r[0].seconds)[len(runs) // 2]
    if len(runs) % 2 == 0:
      synced(model.params)
    start = time.perf_counter()
    eng.generate(prompts[:1], base.SamplingConfig(n=1, max_new_tokens=4))
    compile_s = time.perf_counter() - start
    load = os.getloadavg()[0]
    cpu0 = _process_tree_cpu_s(eng.pid)
    batch = eng.generate(prompts, sampling)
    cpu_s = _process_tree_cpu_s(eng.pid) - cpu0
    load = max(load, os.getloadavg()[0])
    startup_s = eng.startup_seconds
  _, k1 = policy_mismatch(
    model.config,
    None,
    model.params,
    batch,
    sampling.temperature,
    args["kl_rows"],
    args["kl_chunk"],
  )
  row = _row("vllm", quant, batch, sync, k1, k1, sampling)
  row.update(
    compile_s=compile_s,
    startup_s=startup_s,
    kl_method="k1",
    load=load,
    cpu_s=cpu_s,
    tokens_per_cpu_s=row["tokens"] / max(cpu_s, 1e-9),
    sync_phases={k: float(v) for k, v in phases.items() if k.endswith("_s")},
  )
  return row


def _process_tree_cpu_s(pid) -> float:
  """user + system CPU seconds of a process and its live descendants (vLLM's
  engine core runs in a child of the API server), from /proc; nan without."""
  if pid is None:
    return float("nan")
  tick = os.sysconf("SC_CLK_TCK")
  total, todo, seen = 0.0, [int(pid)], set()
  while todo:
    p = todo.pop()
    if p in seen:
      continue
    seen.add(p)
    try:
      with open(f"/proc/{p}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
      total += (int(fields[11]) + int(fields[12])) / tick
      with open(f"/proc/{p}/task/{p}/children") as f:
        todo += [int(c) for c in f.read().split()]
    except (OSError, ValueError, IndexError):
      continue
  return total


def _row(engine, quant, batch, sync, kl, k1, sampling) -> dict:
  return {
    "engine": engine,
    "quant": quant,
    "prompts": batch.num_prompts,
    "samples": sampling.n,
    "new_tokens": sampling.max_new_tokens,
    "tokens_per_s": float(batch.timing["tokens_per_s"]),
    "sync_s": float(sync.seconds),
    "kl_to_full_precision": float(kl),
    "kl_exact": float(kl) if engine == "jax" else None,
    "kl_k1": float(k1),
    "seconds": float(batch.timing["seconds"]),
    "tokens": int(batch.timing["tokens"]),
    "sync_bytes": int(sync.bytes),
  }


def _find(rows, engine, quant):
  return next(
    (r for r in rows if r["engine"] == engine and r["quant"] == quant), None
  )


def ratios(rows: list[dict]) -> list[tuple[str, float, str]]:
  """(what, value, target) for every ratio of issue 15 these rows allow."""
  out = []
  for jq, vq in (("bf16", "bf16"), ("int8", "int8"), ("int8h", "int8")):
    j, v = _find(rows, "jax", jq), _find(rows, "vllm", vq)
    if j and v:
      out.append(
        (
          f"JAX {jq} / vLLM {vq} tok/s",
          j["tokens_per_s"] / v["tokens_per_s"],
          ">= 1 (stretch 2)",
        )
      )
      if j.get("tokens_per_cpu_s") and v.get("tokens_per_cpu_s"):
        out.append(
          (
            f"JAX {jq} / vLLM {vq} tok per CPU-s",
            j["tokens_per_cpu_s"] / v["tokens_per_cpu_s"],
            "(load-independent view of the same ratio)",
          )
        )
  for engine in ("jax", "vllm"):
    full = [
      r for r in (_find(rows, engine, "f32"), _find(rows, engine, "bf16")) if r
    ]
    if not full:
      continue
    best = max(full, key=lambda r: r["tokens_per_s"])
    for q in ("int8", "int8h"):
      r = _find(rows, engine, q)
      if r:
        out.append(
          (
            f"{engine} {q} / best of f32,bf16 ({best['quant']}) tok/s",
            r["tokens_per_s"] / best["tokens_per_s"],
            f">= 1.5 at batch >= 64 (KL {r['kl_to_full_precision']:.2e})",
          )
        )
  for r in rows:
    out.append(
      (f"{r['engine']} {r['quant']} weight sync s", r["sync_s"], "< 0.5")
    )
  return out


def format_table(rows: list[dict]) -> list[str]:
  """Markdown table of one shape's rows."""
  lines = [
    "| engine | quant | P x N x T | tok/s | tok/CPU-s | x f32 | sync s |"
    " sync MB | sync phases | KL to f32 | KL k1 | load |",
    "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
  ]
  f32 = _find(rows, "jax", "f32")
  for r in rows:
    vs = r["tokens_per_s"] / f32["tokens_per_s"] if f32 else float("nan")
    phases = " ".join(
      f"{k[:-2]}={v:.2f}"
      for k, v in r.get("sync_phases", {}).items()
      if k != "seconds"
    )
    lines.append(
      f"| {r['engine']} | {r['quant']} | {r['prompts']}x{r['samples']}x"
      f"{r['new_tokens']} | {r['tokens_per_s']:.1f} | "
      f"{r.get('tokens_per_cpu_s', float('nan')):.1f} | {vs:.2f} | "
      f"{r['sync_s']:.3f} | {r['sync_bytes'] / 2**20:.1f} | {phases} | "
      f"{r['kl_to_full_precision']:.2e} | {r['kl_k1']:.2e} | "
      f"{r.get('load', float('nan')):.1f} |"
    )
  return lines


def report(machine: dict, by_shape: dict[str, list[dict]]) -> list[str]:
  """The whole Markdown report: machine, one table + ratios per shape."""
  flags_ = " ".join(
    f"{k}={'yes' if v else 'no'}" for k, v in machine["cpu_flags"].items()
  )
  lines = [
    f"Machine: {machine['cpu_model']}, {machine['cores']} cores, "
    f"{flags_}; backend {machine['backend']} ({machine['device']}); "
    f"jax {machine['jax']}, jaxlib {machine['jaxlib']}, vLLM "
    f"{machine['vllm']}, torch {machine['torch']}; huge pages "
    f"{machine.get('host_huge_pages', 'not recorded')}.",
    "",
  ]
  if not machine["gpu"]:
    lines += ["No GPU in this run: CPU numbers only.", ""]
    if "int8_dot_beats_bf16" in machine:  # absent from older JSON
      lines += [
        "Dot units (`rljax.quant.cpu`): fast bf16 dot "
        f"{'yes' if machine['fast_bf16_dot'] else 'no'}, int8 dot faster "
        f"than bf16 {'yes' if machine['int8_dot_beats_bf16'] else 'no'}.",
        "",
      ]
    if machine.get("onednn_int8_saturates"):
      lines += [
        "**vLLM INT8 rows ran a saturating kernel**: without VNNI/AMX-INT8 "
        "vLLM-CPU's oneDNN int8 GEMM overflows int16 for codes |w| > 63 "
        "(`CpuInfo.onednn_int8_saturates`); their speed is real, their "
        "KL is not that of the W8A8 model.",
        "",
      ]
  for shape, rows in by_shape.items():
    lines += [f"### {shape} (prompts x samples x new tokens)", ""]
    lines += format_table(rows) + [""]
    for what, value, target in ratios(rows):
      lines.append(f"- {what}: **{value:.2f}** (target {target})")
    lines.append("")
  return lines


def plot_title(machine: dict) -> str:
  """The machine that measured the rows (a GPU's name, else the CPU model):
  a plot redrawn --from_json keeps the title of the run it comes from."""
  where = machine["device"] if machine.get("gpu") else machine["cpu_model"]
  return f"Rollout throughput, {where}"


def plot(machine: dict, by_shape: dict[str, list[dict]], path: str) -> None:
  """tokens/s vs batch (prompts x samples), one line per engine x quant."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  series: dict[str, list[tuple[int, float, int]]] = {}
  for rows in by_shape.values():
    for r in rows:
      series.setdefault(f"{r['engine']} {r['quant']}", []).append(
        (r["prompts"] * r["samples"], r["tokens_per_s"], r["new_tokens"])
      )
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, points in sorted(series.items()):
    points.sort()
    ax.plot(
      [p[0] for p in points],
      [p[1] for p in points],
      "o--" if name.startswith("vllm") else "o-",
      label=name,
    )
  ax.set_xscale("log", base=2)
  lengths = sorted({p[2] for pts in series.values() for p in pts})
  ax.set_xlabel(
    "batch (prompts x samples); new tokens T = "
    + ", ".join(str(t) for t in lengths)
  )
  ax.set_ylabel("generated tokens / s")
  ax.set_title(plot_title(machine))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  print(f"wrote {path}")


def _parse_shape(text: str) -> tuple[int, int, int]:
  parts = text.lower().split("x")
  if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise app.UsageError(
      f"--shapes has {text!r}; expected PxNxT, e.g. 16x8x128"
    )
  return int(parts[0]), int(parts[1]), int(parts[2])


def run_shape(model, shape, args, checkpoint=lambda rows: None) -> list[dict]:
  prompts_n, samples, new_tokens = shape
  prompts = make_prompts(
    model.tokenizer, prompts_n, _SEED.value, model.config.vocab_size
  )
  sampling = base.SamplingConfig(
    n=samples,
    temperature=_TEMPERATURE.value,
    max_new_tokens=new_tokens,
    seed=_SEED.value,
  )
  args = dict(args, max_batch=_MAX_BATCH.value or prompts_n * samples)
  print(
    f"shape {prompts_n}x{samples}x{new_tokens} prompt_tokens="
    f"{[len(p) for p in prompts]}",
    flush=True,
  )
  rows = []
  if "jax" in _ENGINES.value:
    for quant in _JAX_QUANTS.value:
      print(f"[jax {quant}] ...", flush=True)
      rows.append(bench_jax(model, quant, prompts, sampling, args))
      checkpoint(rows)
      print(
        f"  {rows[-1]['tokens_per_s']:.1f} tok/s  load {rows[-1]['load']:.1f}",
        flush=True,
      )
  if "vllm" in _ENGINES.value:
    try:
      import vllm  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError as e:
      print(f"[vllm] skipped: vllm is not importable ({e})")
    else:
      workdir = tempfile.mkdtemp(prefix="bench-rollout-")
      try:
        for quant in _VLLM_QUANTS.value:
          print(f"[vllm {quant}] ...", flush=True)
          try:
            rows.append(
              bench_vllm(model, quant, prompts, sampling, args, workdir)
            )
            checkpoint(rows)
          except Exception as e:  # pylint: disable=broad-except
            # One failing engine must not lose the rows measured so far.
            print(f"  [vllm {quant}] failed: {str(e)[:600]}", flush=True)
            continue
          print(f"  {rows[-1]['tokens_per_s']:.1f} tok/s", flush=True)
      finally:
        shutil.rmtree(workdir, ignore_errors=True)
  return rows


def decode_ab(
  shape: str, prompt_len: int = 64, own: int = 128, reps: int = 3
) -> dict:
  """Before/after of the shared-prefix decode step, in one process."""
  from rljax.models import decoder  # pylint: disable=g-import-not-at-top

  p, n = (int(x) for x in shape.lower().split("x"))
  b = p * n
  config = models.preset("smollm2-135m-instruct")
  params = models.init_params(config, jax.random.key(0))

  def rand(c, seed):
    return 0.3 * jax.random.normal(jax.random.key(seed), c.shape, c.dtype)

  prefix = jax.tree_util.tree_map(
    lambda c: rand(c, 1), models.init_cache(config, p, prompt_len)
  )
  cache = jax.tree_util.tree_map(
    lambda c: rand(c, 2), models.init_cache(config, b, own)
  )
  full = jax.tree_util.tree_map(
    lambda a, c: jnp.concatenate([jnp.repeat(a, n, axis=1), c], axis=2),
    prefix,
    cache,
  )
  tok = jnp.ones((b, 1), jnp.int32)
  pos = jnp.full((b, 1), prompt_len + own - 1, jnp.int32)
  old = jax.jit(
    lambda w, c: models.forward_with_cache(
      config,
      w,
      tok,
      pos,
      c,
      jnp.int32(prompt_len + own - 1),
      jnp.ones((b, prompt_len + own), jnp.int32),
    )
  )
  new = jax.jit(
    lambda w, pc, c: decoder.decode_with_prefix_cache(
      config,
      w,
      tok,
      pos,
      pc,
      jnp.ones((p, prompt_len), jnp.int32),
      c,
      jnp.int32(own - 1),
      jnp.ones((b, own), jnp.int32),
    )
  )
  runs = {
    "repeated_cache": (old, (params, full)),
    "shared_prefix": (new, (params, prefix, decoder.to_decode_cache(cache))),
  }
  outs = {k: jax.block_until_ready(f(*a))[0] for k, (f, a) in runs.items()}
  times = {k: [] for k in runs}
  for _ in range(reps):
    for k, (f, a) in runs.items():
      w0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(f(*a))
      times[k].append((time.perf_counter() - w0, time.process_time() - c0))
  result = {
    "shape": f"B={b} ({p}x{n}) prompt={prompt_len} own={own}",
    "max_abs_dlogit": float(
      jnp.max(jnp.abs(outs["repeated_cache"] - outs["shared_prefix"]))
    ),
    "load": os.getloadavg(),
  }
  for k, t in times.items():
    result[k] = {
      "wall_ms_min": 1e3 * min(x[0] for x in t),
      "cpu_ms_min": 1e3 * min(x[1] for x in t),
      "cpu_ms_all": [round(1e3 * x[1]) for x in t],
    }
  print(json.dumps(result, indent=1))
  return result


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
    "slots": _SLOTS.value,
    "chunk_steps": _CHUNK_STEPS.value,
    "group_widths": [int(w) for w in _GROUP_WIDTHS.value],
    "kv_page_sizes": [int(p) for p in _KV_PAGE_SIZES.value],
    "max_new_tokens": _MAX_NEW_TOKENS.value,
    "long_tail_max": _LONG_TAIL_MAX.value,
    "fixed_tokens": _FIXED_TOKENS.value,
    "seed": _SEED.value,
    "data": _DATA.value or bench_workloads.GSM8K,
    "vllm_kv_gib": _VLLM_KV_GIB.value,
    "vllm_batched_tokens": _VLLM_BATCHED_TOKENS.value,
    "out": _OUT.value,
  }
  rows = bench_workloads.run_workloads(model, settings, machine)
  lines = bench_workloads.format_rows(rows)
  print("\n".join(lines))
  print(f"load average at end: {os.getloadavg()}")
  if _MARKDOWN.value:
    with open(_MARKDOWN.value, "w") as f:
      f.write("\n".join(lines) + "\n")
  if _PLOT.value:
    bench_workloads.plot_occupancy(rows, _PLOT.value, plot_title(machine))


def main(argv):
  del argv
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
    shapes = [_parse_shape(x) for x in _SHAPES.value]
  elif _SMALL.value:
    shapes = [(4, 4, 32)]
  else:
    shapes = [(_PROMPTS.value, _SAMPLES.value, _NEW_TOKENS.value)]
  unknown = set(_ENGINES.value) - {"jax", "vllm"}
  if unknown:
    raise app.UsageError(f"--engines has {sorted(unknown)}; expected jax, vllm")
  machine = machine_info()
  print(f"machine: {json.dumps(machine)}")
  print(f"load average at start: {os.getloadavg()}")
  if _RANDOM_INIT.value:
    if "vllm" in _ENGINES.value:
      raise app.UsageError(
        "--random_init with --engines=vllm: the vLLM sidecar loads a "
        "checkpoint with its tokenizer; use --engines=jax"
      )
    # "tiny" (a few-thousand-parameter model) is for dry runs of the
    # scripts that call this one (experiments/gpu/run_all.py --dry).
    config = (
      models.tiny_config()
      if _MODEL.value == "tiny"
      else models.preset(_MODEL.value)
    )
    model = models.Model(
      config=config,
      params=models.init_params(config, jax.random.PRNGKey(_SEED.value)),
      tokenizer=None,
    )
  else:
    model = models.load_pretrained(_MODEL.value)
  if _WORKLOADS.value:
    run_workloads(model, machine)
    return
  args = {
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

    by_shape[name] = run_shape(model, shape, args, checkpoint)
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
  app.run(main)
