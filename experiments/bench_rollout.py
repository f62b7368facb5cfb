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

Usage:
  python experiments/bench_rollout.py --small
  python experiments/bench_rollout.py --engines=jax,vllm --out=rollout.json
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

from rljax import models
from rljax.rollout import base
from rljax.rollout.jax_sampler import JaxSampler

_ENGINES = flags.DEFINE_list("engines", ["jax"], "Engines: jax, vllm.")
_JAX_QUANTS = flags.DEFINE_list(
    "jax_quants", ["f32", "bf16", "int8", "fp8"],
    "JAX sampler weight formats: f32, bf16, int8, int8_wo, fp8.")
_VLLM_QUANTS = flags.DEFINE_list(
    "vllm_quants", ["bf16", "int8"], "vLLM checkpoint formats: bf16, int8.")
_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct",
                             "load_pretrained path or name.")
_PROMPTS = flags.DEFINE_integer("prompts", 16, "Prompts per rollout.")
_SAMPLES = flags.DEFINE_integer("samples", 8, "Samples per prompt.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 256, "Tokens per sample.")
_SMALL = flags.DEFINE_bool(
    "small", False, "Quick shape: 4 prompts x 4 samples x 32 tokens.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_MAX_BATCH = flags.DEFINE_integer(
    "max_batch", 0, "JAX sampler rows per program (0: the whole rollout).")
_KL_ROWS = flags.DEFINE_integer(
    "kl_rows", 32, "Responses (spread over the groups) used for the KL; 0 "
    "skips it.")
_KL_CHUNK = flags.DEFINE_integer("kl_chunk", 4,
                                 "Rows per forward pass of the KL.")
_VLLM_KV_GIB = flags.DEFINE_float("vllm_kv_gib", 1.0,
                                  "VLLM_CPU_KVCACHE_SPACE of the sidecar.")
_VLLM_BATCHED_TOKENS = flags.DEFINE_integer(
    "vllm_max_batched_tokens", 16384,
    "vLLM --max-num-batched-tokens. Large enough that no prompt is prefilled "
    "in chunks: vllm-cpu 0.32 crashes on a chunked prefill of a seeded request "
    "('CPU Generator does not use offset').")
_OUT = flags.DEFINE_string("out", None, "Write the rows as JSON here.")

_QUESTIONS = ("What is {a}+{b}?", "Compute {a} times {b}.",
              "If I have {a} apples and eat {b}, how many are left?",
              "Write a short poem about the number {a}.",
              "Explain why {a} is or is not a prime number.",
              "What is {a} minus {b}? Answer step by step.")


def make_prompts(tokenizer, num: int, seed: int, vocab_size: int
                 ) -> list[list[int]]:
  """Chat-templated small math/writing questions (random ids without a
  tokenizer), generated here so the benchmark needs no dataset."""
  rng = np.random.default_rng(seed)
  if tokenizer is None:
    return [rng.integers(3, vocab_size, size=int(rng.integers(20, 60))).tolist()
            for _ in range(num)]
  prompts = []
  for i in range(num):
    text = _QUESTIONS[i % len(_QUESTIONS)].format(
        a=int(rng.integers(2, 100)), b=int(rng.integers(2, 100)))
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False,
        add_generation_prompt=True)
    prompts.append(tokenizer.encode(chat, add_special_tokens=False))
  return prompts


@functools.partial(jax.jit, static_argnums=0)
def _kl_and_logp(config, params_q, params_f, tokens, mask, temperature):
  """Exact KL(π_q || π_f) per position and log π_f of the next token."""
  zq = models.forward(config, params_q, tokens, mask)[:, :-1] / temperature
  zf = models.forward(config, params_f, tokens, mask)[:, :-1] / temperature
  log_q = jax.nn.log_softmax(zq, axis=-1)
  log_f = jax.nn.log_softmax(zf, axis=-1)
  kl = jnp.sum(jnp.exp(log_q) * (log_q - log_f), axis=-1)
  logp_f = jnp.take_along_axis(log_f, tokens[:, 1:, None], axis=-1)[..., 0]
  return kl, logp_f


def policy_mismatch(config, params_q, params_f32, batch: base.RolloutBatch,
                    temperature: float, num_rows: int, chunk: int
                    ) -> tuple[float, float]:
  """(exact KL or nan, k1 KL) of the engine's samples to the f32 policy.

  params_q None means the engine's logits are not available (vLLM): only the
  k1 estimate mean(behav_logp − logp_f32) is returned.
  """
  if num_rows <= 0:
    return float("nan"), float("nan")
  rows = np.linspace(0, batch.num_samples - 1, min(num_rows,
                                                   batch.num_samples))
  rows = np.unique(rows.astype(int))
  packed = batch.pack()
  exact_sum, k1_sum, count = 0.0, 0.0, 0.0
  for start in range(0, len(rows), chunk):
    idx = rows[start:start + chunk]
    pad = chunk - len(idx)  # Keep one shape: one compile.
    idx_full = np.concatenate([idx, np.repeat(idx[-1:], pad)])
    tokens = jnp.asarray(packed["tokens"][idx_full])
    mask = jnp.asarray(packed["attention_mask"][idx_full])
    kl, logp_f = _kl_and_logp(
        config, params_q if params_q is not None else params_f32, params_f32,
        tokens, mask, jnp.float32(temperature))
    resp = packed["response_mask"][idx]
    exact_sum += float(np.sum(np.asarray(kl)[:len(idx)] * resp))
    k1_sum += float(np.sum(
        (packed["behav_logp"][idx] - np.asarray(logp_f)[:len(idx)]) * resp))
    count += float(resp.sum())
  exact = exact_sum / count if params_q is not None else float("nan")
  return exact, k1_sum / count


def bench_jax(model, quant: str, prompts, sampling, args) -> dict:
  backend = jax.default_backend()
  mode = "none" if quant == "f32" else quant
  sampler = JaxSampler(
      model.config, quant=mode, fake_quant=(quant == "fp8" and backend != "gpu"),
      max_prompt_len=max(len(p) for p in prompts),
      max_batch=args["max_batch"], pad_id=0)
  sampler.update_weights(model.params)  # the first sync also traces ops
  sync = sampler.update_weights(model.params)
  compile_s = sampler.warmup(prompts, sampling)
  batch = sampler.generate(prompts, sampling)
  kl, k1 = policy_mismatch(model.config, sampler.params, model.params, batch,
                           sampling.temperature, args["kl_rows"],
                           args["kl_chunk"])
  row = _row("jax", quant, batch, sync, kl, k1, sampling)
  row.update(compile_s=compile_s, fake_quant=sampler.fake_quant,
             backend=backend)
  sampler.close()
  return row


def bench_vllm(model, quant: str, prompts, sampling, args, workdir) -> dict:
  from rljax import quant as quant_lib  # pylint: disable=g-import-not-at-top
  from rljax.rollout import vllm_sidecar  # pylint: disable=g-import-not-at-top
  ckpt = os.path.join(workdir, f"vllm-{quant}")
  if quant == "bf16":
    models.save_hf(model.config, model.params, ckpt, model.tokenizer,
                   dtype="bfloat16")
  elif quant == "int8":
    quant_lib.export_compressed_tensors_int8(model.config, model.params, ckpt,
                                             model.tokenizer)
  else:
    raise ValueError(f"--vllm_quants has {quant!r}; expected bf16 or int8 "
                     "(vLLM has no FP8 on CPU; on GPU add an fp8 export)")
  max_len = max(len(p) for p in prompts) + sampling.max_new_tokens + 16
  config = vllm_sidecar.VLLMSidecarConfig(
      max_model_len=max(256, max_len), cpu_kvcache_gib=args["vllm_kv_gib"],
      max_concurrent_requests=len(prompts),
      extra_args=("--max-num-batched-tokens", str(args["vllm_batched_tokens"])))
  with vllm_sidecar.VLLMSidecar(ckpt, config, model_config=model.config) as eng:
    sync = eng.update_weights(model.params)
    start = time.perf_counter()
    eng.generate(prompts[:1], base.SamplingConfig(n=1, max_new_tokens=4))
    compile_s = time.perf_counter() - start
    batch = eng.generate(prompts, sampling)
    startup_s = eng.startup_seconds
  _, k1 = policy_mismatch(model.config, None, model.params, batch,
                          sampling.temperature, args["kl_rows"],
                          args["kl_chunk"])
  row = _row("vllm", quant, batch, sync, k1, k1, sampling)
  row.update(compile_s=compile_s, startup_s=startup_s, kl_method="k1")
  return row


def _row(engine, quant, batch, sync, kl, k1, sampling) -> dict:
  return {
      "engine": engine, "quant": quant, "prompts": batch.num_prompts,
      "samples": sampling.n, "new_tokens": sampling.max_new_tokens,
      "tokens_per_s": float(batch.timing["tokens_per_s"]),
      "sync_s": float(sync.seconds),
      "kl_to_full_precision": float(kl),
      "kl_exact": float(kl) if engine == "jax" else None,
      "kl_k1": float(k1),
      "seconds": float(batch.timing["seconds"]),
      "tokens": int(batch.timing["tokens"]),
      "sync_bytes": int(sync.bytes),
  }


def print_table(rows: list[dict]) -> None:
  base_row = next((r for r in rows if r["engine"] == "jax"
                   and r["quant"] == "f32"), None)
  header = (f"{'engine':6} {'quant':5} {'P':>3} {'N':>3} {'T':>4} "
            f"{'tok/s':>8} {'x f32':>6} {'x bf16':>6} {'sync_s':>7} "
            f"{'sync_MB':>8} {'compile_s':>9} {'KL':>10} {'KL_k1':>10}")
  print(header)
  print("-" * len(header))
  for r in rows:
    bf16 = next((b for b in rows if b["engine"] == r["engine"]
                 and b["quant"] == "bf16"), None)
    vs_f32 = (r["tokens_per_s"] / base_row["tokens_per_s"]
              if base_row else float("nan"))
    vs_bf16 = r["tokens_per_s"] / bf16["tokens_per_s"] if bf16 else float("nan")
    print(f"{r['engine']:6} {r['quant']:5} {r['prompts']:>3} {r['samples']:>3} "
          f"{r['new_tokens']:>4} {r['tokens_per_s']:>8.1f} {vs_f32:>6.2f} "
          f"{vs_bf16:>6.2f} {r['sync_s']:>7.3f} {r['sync_bytes'] / 2**20:>8.1f} "
          f"{r.get('compile_s', float('nan')):>9.1f} "
          f"{r['kl_to_full_precision']:>10.2e} {r['kl_k1']:>10.2e}")


def main(argv):
  del argv
  prompts_n, samples, new_tokens = (_PROMPTS.value, _SAMPLES.value,
                                    _NEW_TOKENS.value)
  if _SMALL.value:
    prompts_n, samples, new_tokens = 4, 4, 32
  unknown = set(_ENGINES.value) - {"jax", "vllm"}
  if unknown:
    raise app.UsageError(f"--engines has {sorted(unknown)}; expected jax, vllm")
  model = models.load_pretrained(_MODEL.value)
  prompts = make_prompts(model.tokenizer, prompts_n, _SEED.value,
                         model.config.vocab_size)
  sampling = base.SamplingConfig(n=samples, temperature=_TEMPERATURE.value,
                                 max_new_tokens=new_tokens, seed=_SEED.value)
  args = {"max_batch": _MAX_BATCH.value or prompts_n * samples,
          "kl_rows": _KL_ROWS.value, "kl_chunk": _KL_CHUNK.value,
          "vllm_kv_gib": _VLLM_KV_GIB.value,
          "vllm_batched_tokens": _VLLM_BATCHED_TOKENS.value}
  print(f"model={_MODEL.value} backend={jax.default_backend()} "
        f"devices={jax.devices()[0].device_kind} prompts={prompts_n} "
        f"samples={samples} new_tokens={new_tokens} prompt_tokens="
        f"{[len(p) for p in prompts]}")
  rows = []
  if "jax" in _ENGINES.value:
    for quant in _JAX_QUANTS.value:
      print(f"[jax {quant}] ...", flush=True)
      rows.append(bench_jax(model, quant, prompts, sampling, args))
      print(f"  {rows[-1]['tokens_per_s']:.1f} tok/s", flush=True)
  if "vllm" in _ENGINES.value:
    try:
      import vllm  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError as e:
      print(f"[vllm] skipped: vllm is not importable ({e})")
    else:
      workdir = tempfile.mkdtemp(prefix="bench-rollout-")
      try:
        for quant in _VLLM_QUANTS.value:
          print(f"[vllm {quant}] ...", flush=True)
          try:
            rows.append(bench_vllm(model, quant, prompts, sampling, args,
                                   workdir))
          except Exception as e:  # pylint: disable=broad-except
            # One failing engine must not lose the rows measured so far.
            print(f"  [vllm {quant}] failed: {str(e)[:600]}", flush=True)
            continue
          print(f"  {rows[-1]['tokens_per_s']:.1f} tok/s", flush=True)
      finally:
        shutil.rmtree(workdir, ignore_errors=True)
  print()
  print_table(rows)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(rows, f, indent=1)
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
