"""Forward throughput and next-token KL of quantized SmolLM2 on this machine.

  python experiments/bench_quant.py --out=bench_quant.json
  python experiments/bench_quant.py --batch_sizes=1,8 --seq_len=64 --kl_prompts=64

For each weight format (f32, bf16, INT8 W8A8, INT8 weight-only, FP8 fake
quant) and batch size it times the jitted, warm forward pass over
`batch x seq_len` random tokens: the whole model (logits for every position,
LM head in float32 as the decoder always does) and the trunk alone (the 30
blocks, where the quantized matmuls are). Then it measures how far each
format's next-token distribution is from float32 on generated prompts
(arithmetic questions and sentences; no download): KL(p_f32 ‖ p_q) averaged
over every real token position, and at the last position only.

INT8 and FP8 can be measured after the UAQ fold (`--uaq_scale`): per-channel
quantization is scale-invariant, so the fold should not change the KL.
"""

from __future__ import annotations

import functools
import json
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rljax import hostmem
from rljax import models
from rljax import quant

_MODEL = flags.DEFINE_string(
  "model", "smollm2-135m-instruct", "load_pretrained path or preset name."
)
_FORMATS = flags.DEFINE_list(
  "formats",
  ["f32", "bf16", "int8", "int8_wo", "fp8_fake"],
  "Weight formats: f32, bf16, int8 (W8A8), int8_fake, int8_wo, fp8_fake "
  "(fp8 emulation; native fp8 needs a GPU), int8_head (W8A8 with the LM "
  "head quantized too: untied copy of the embedding).",
)
_BATCH_SIZES = flags.DEFINE_list(
  "batch_sizes",
  ["1", "8", "64"],
  "Batch sizes for the throughput table (empty: skip it).",
)
_SEQ_LEN = flags.DEFINE_integer("seq_len", 128, "Tokens per sequence.")
_ITERS = flags.DEFINE_integer(
  "iters",
  5,
  "Timed calls per cell after warm-up, round-robin over the "
  "formats; the table reports the best (least disturbed) one.",
)
_TRUNK = flags.DEFINE_bool(
  "trunk", True, "Also time the blocks without the LM head."
)
_KL_PROMPTS = flags.DEFINE_integer(
  "kl_prompts", 256, "Prompts for the KL measurement (0: skip)."
)
_KL_BATCH = flags.DEFINE_integer("kl_batch", 32, "Batch size of the KL pass.")
_UAQ_SCALE = flags.DEFINE_float(
  "uaq_scale", 1.5, "Also report KL of int8 after fold_uaq(s) (<= 1: skip)."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed for tokens and prompts.")
_OUT = flags.DEFINE_string("out", "", "Write the results as JSON here.")

_QUANT_MODES = {
  "int8": ("int8", False),
  "int8_fake": ("int8", True),
  "int8_wo": ("int8_wo", False),
  "fp8_fake": ("fp8", True),
  "fp8": ("fp8", False),
}


def format_params(config, params, fmt: str):
  """(config, params) the decoder runs for weight format `fmt`."""
  if fmt == "f32":
    return config, params
  if fmt == "bf16":
    return config, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  if fmt in _QUANT_MODES:
    mode, fake = _QUANT_MODES[fmt]
    return config, quant.quantize_params(config, params, mode=mode, fake=fake)
  if fmt == "int8_head":
    # A tied head is the embedding itself; quantizing it needs its own copy.
    if config.tie_word_embeddings:
      config = config.replace(tie_word_embeddings=False)
      params = dict(params, lm_head={"kernel": params["embed"]["embedding"].T})
    return config, quant.quantize_params(
      config, params, mode="int8", include_lm_head=True
    )
  raise ValueError(
    f"--formats: unknown format {fmt!r}; expected f32, bf16 or "
    f"one of {sorted(_QUANT_MODES)}"
  )


def _interleaved_times(fns: dict, iters: int):
  """Wall and CPU seconds of `iters` calls of each warm thunk, round-robin.

  Round-robin order spreads load from other processes over all formats
  alike; the best (min) wall time is the least disturbed one. CPU seconds
  (all threads of this process) barely grow when other processes share the
  cores, so tokens per CPU-second compares formats on a busy machine too.
  """
  for fn in fns.values():
    jax.block_until_ready(fn())  # compile and warm up
  wall = {name: [] for name in fns}
  cpu = {name: [] for name in fns}
  for _ in range(iters):
    for name, fn in fns.items():
      start, start_cpu = time.perf_counter(), time.process_time()
      jax.block_until_ready(fn())
      wall[name].append(time.perf_counter() - start)
      cpu[name].append(time.process_time() - start_cpu)
  return wall, cpu


def throughput(
  vocab_size, params_by_format, batch_sizes, seq_len, iters, trunk, seed
):
  forward = jax.jit(models.forward, static_argnums=0)
  blocks = jax.jit(models.final_hidden_states, static_argnums=0)
  rows = []
  for batch in tqdm(batch_sizes, desc="throughput (batch sizes)"):
    tokens = jax.random.randint(
      jax.random.key(seed), (batch, seq_len), 0, vocab_size, jnp.int32
    )
    fns = {}
    for fmt, (config, params) in params_by_format.items():
      fns[(fmt, "forward")] = functools.partial(forward, config, params, tokens)
      if trunk:
        fns[(fmt, "trunk")] = functools.partial(blocks, config, params, tokens)
    wall, cpu = _interleaved_times(fns, iters)
    n = batch * seq_len
    for fmt in params_by_format:
      row = {"format": fmt, "batch": batch, "seq_len": seq_len}
      for part, prefix in (("forward", ""), ("trunk", "trunk_")):
        if (fmt, part) in wall:
          t, c = wall[(fmt, part)], cpu[(fmt, part)]
          row[f"{part}_s_best"] = min(t)
          row[f"{part}_s_median"] = statistics.median(t)
          row[f"{part}_cpu_s_best"] = min(c)
          row[f"{prefix}tokens_per_s"] = n / min(t)
          row[f"{prefix}tokens_per_cpu_s"] = n / min(c)
      rows.append(row)
      tqdm.write(
        f"batch {batch} {fmt}: {row['tokens_per_s']:.0f} tok/s, "
        f"{row['tokens_per_cpu_s']:.0f} tok/cpu-s"
        + (
          f"; trunk {row['trunk_tokens_per_s']:.0f} tok/s, "
          f"{row['trunk_tokens_per_cpu_s']:.0f} tok/cpu-s"
          if trunk
          else ""
        )
      )
  return rows


def generated_prompts(n: int, seed: int) -> list[str]:
  """Arithmetic questions and short sentences, made up here (no dataset)."""
  rng = np.random.default_rng(seed)
  subjects = [
    "The farmer",
    "A student",
    "My neighbour",
    "The old clock",
    "Every river",
    "The new library",
    "A small robot",
    "Her brother",
  ]
  verbs = [
    "counted",
    "painted",
    "carried",
    "explained",
    "watched",
    "built",
    "measured",
    "sold",
  ]
  objects = [
    "twelve apples",
    "the blue fence",
    "a heavy box",
    "the answer",
    "the stars",
    "a wooden bridge",
    "the long table",
    "three tickets",
  ]
  out = []
  for i in range(n):
    a, b = (int(x) for x in rng.integers(2, 999, size=2))
    kind = i % 3
    if kind == 0:
      op = rng.choice(["+", "-", "*"])
      out.append(f"Question: What is {a} {op} {b}? Think step by step. Answer:")
    elif kind == 1:
      out.append(
        f"Tom has {a} marbles and gives {b % 50} of them to Ann. "
        "How many marbles does Tom have now?"
      )
    else:
      out.append(
        f"{rng.choice(subjects)} {rng.choice(verbs)} "
        f"{rng.choice(objects)} on day {a}, and then"
      )
  return out


def _encode(tokenizer, prompts, pad_id):
  ids = [tokenizer.encode(p) for p in prompts]
  length = max(len(x) for x in ids)
  tokens = np.full((len(ids), length), pad_id, np.int32)
  mask = np.zeros((len(ids), length), np.int32)
  for i, x in enumerate(ids):
    tokens[i, : len(x)] = x
    mask[i, : len(x)] = 1
  return tokens, mask


def next_token_kl(
  config, reference, candidates, tokenizer, n_prompts, batch, seed
):
  """KL(p_ref ‖ p_q) per format: mean over real positions and at the last.

  `candidates` maps a name to (config, params)."""
  forward = jax.jit(models.forward, static_argnums=0)

  @jax.jit
  def kl_terms(ref_logits, logits, mask):
    p_log = jax.nn.log_softmax(ref_logits, -1)
    q_log = jax.nn.log_softmax(logits, -1)
    kl = jnp.sum(jnp.exp(p_log) * (p_log - q_log), -1)
    last = jnp.sum(mask, -1) - 1
    kl_last = jnp.take_along_axis(kl, last[:, None], -1)[:, 0]
    return jnp.sum(kl * mask), jnp.sum(mask), jnp.sum(kl_last)

  prompts = generated_prompts(n_prompts, seed)
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  sums = {name: np.zeros(3) for name in candidates}
  for start in tqdm(range(0, n_prompts, batch), desc="KL"):
    tokens, mask = _encode(tokenizer, prompts[start : start + batch], pad)
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    ref = forward(config, reference, tokens, mask)
    for name, (cfg, params) in candidates.items():
      out = forward(cfg, params, tokens, mask)
      sums[name] += np.asarray(
        jax.device_get(kl_terms(ref, out, mask)), np.float64
      )
  return {
    name: {
      "kl_mean": s[0] / s[1],
      "kl_last": s[2] / n_prompts,
      "positions": int(s[1]),
    }
    for name, s in sums.items()
  }


def _print_tables(rows, kl):
  if rows:
    best = {}  # the faster float format per (batch, column)
    cols = [
      c
      for c in (
        "tokens_per_s",
        "tokens_per_cpu_s",
        "trunk_tokens_per_s",
        "trunk_tokens_per_cpu_s",
      )
      if c in rows[0]
    ]
    for r in rows:
      if r["format"] in ("f32", "bf16"):
        for c in cols:
          best[r["batch"], c] = max(best.get((r["batch"], c), 0.0), r[c])
    titles = {
      "tokens_per_s": "fwd tok/s",
      "tokens_per_cpu_s": "fwd tok/cpu-s",
      "trunk_tokens_per_s": "trunk tok/s",
      "trunk_tokens_per_cpu_s": "trunk tok/cpu-s",
    }
    print(
      f"{'format':<10}{'batch':>6}" + "".join(f"{titles[c]:>24}" for c in cols)
    )
    print(" " * 16 + "(x = vs the faster of f32/bf16)")
    for r in rows:
      cells = "".join(
        f"{r[c]:>15.0f} ({r[c] / best.get((r['batch'], c), np.nan):4.2f}x)"
        for c in cols
      )
      print(f"{r['format']:<10}{r['batch']:>6}{cells}")
  if kl:
    print(f"\n{'format':<16}{'KL mean/token':>15}{'KL last token':>15}")
    for name, v in kl.items():
      print(f"{name:<16}{v['kl_mean']:>15.2e}{v['kl_last']:>15.2e}")


def main(argv):
  del argv
  model = models.load_pretrained(_MODEL.value)
  config = model.config
  batch_sizes = [int(b) for b in _BATCH_SIZES.value]
  params_by_format = {
    f: format_params(config, model.params, f) for f in _FORMATS.value
  }
  print(
    f"{_MODEL.value}: {config.num_params() / 1e6:.1f}M params, backend "
    f"{jax.default_backend()}, {jax.device_count()} device(s)"
  )
  rows = throughput(
    config.vocab_size,
    params_by_format,
    batch_sizes,
    _SEQ_LEN.value,
    _ITERS.value,
    _TRUNK.value,
    _SEED.value,
  )
  if _OUT.value:  # a first write, in case the KL pass is interrupted
    _write(_OUT.value, rows, {})
  kl = {}
  if _KL_PROMPTS.value > 0:
    candidates = {f: cp for f, cp in params_by_format.items() if f != "f32"}
    if _UAQ_SCALE.value > 1:
      folded = quant.fold_uaq(config, model.params, scale=_UAQ_SCALE.value)
      for f in ("int8", "fp8_fake"):
        if f in params_by_format:
          candidates[f"{f}+uaq{_UAQ_SCALE.value:g}"] = format_params(
            config, folded, f
          )
    kl = next_token_kl(
      config,
      model.params,
      candidates,
      model.tokenizer,
      _KL_PROMPTS.value,
      _KL_BATCH.value,
      _SEED.value,
    )
  _print_tables(rows, kl)
  if _OUT.value:
    _write(_OUT.value, rows, kl)


def _write(path, rows, kl):
  with open(path, "w") as f:
    json.dump(
      {
        "model": _MODEL.value,
        "backend": jax.default_backend(),
        "seq_len": _SEQ_LEN.value,
        "throughput": rows,
        "kl_to_f32": kl,
      },
      f,
      indent=2,
    )


if __name__ == "__main__":
  hostmem.relaunch_with_huge_pages()
  app.run(main)
