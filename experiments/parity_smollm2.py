r"""Parity of rljax's decoder with transformers on SmolLM2-135M-Instruct.

Both sides load the same GGUF (Q4_1, dequantized to float32 by the `gguf`
package), run chat prompts, and compare logits and the greedy continuation.

  python experiments/parity_smollm2.py --new_tokens=32 --out=/tmp/parity.json
"""

import json
import os
import time

from absl import app, flags

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_MODEL = flags.DEFINE_string(
  "model", "smollm2-135m-instruct", "a .gguf file or 'smollm2-135m-instruct'"
)
_PROMPTS = flags.DEFINE_list(
  "prompts",
  [
    "What is 7+5?",
    "Name the capital of France.",
    "Write a haiku about the sea.",
  ],
  "user messages, each wrapped in the model's chat template",
)
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 32, "greedy tokens to compare")
_TOLERANCE = flags.DEFINE_float("tolerance", 1e-3, "max |Δ logit| allowed")
_TORCH_THREADS = flags.DEFINE_integer(
  "torch_threads",
  1,
  "torch intra-op threads (0: torch's default); on a "
  "shared 2-core box one thread is 3-4x faster than torch's spinning pool",
)
_OUT = flags.DEFINE_string("out", None, "write the numbers as JSON here")


def chat_prompt_ids(tokenizer, message: str) -> list[int]:
  text = tokenizer.apply_chat_template(
    [{"role": "user", "content": message}],
    tokenize=False,
    add_generation_prompt=True,
  )
  return tokenizer(text, add_special_tokens=False)["input_ids"]


def main(argv):
  del argv
  from rljax import models  # pylint: disable=g-import-not-at-top
  from rljax.models import hf_parity  # pylint: disable=g-import-not-at-top

  if _TORCH_THREADS.value:
    import torch  # pylint: disable=g-import-not-at-top

    torch.set_num_threads(_TORCH_THREADS.value)
  path = models.pretrained.resolve_path(_MODEL.value)
  t0 = time.perf_counter()
  model = models.load_pretrained(path)
  load_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  hf_model = hf_parity.load_transformers_gguf(path)
  hf_load_s = time.perf_counter() - t0

  prompts = [chat_prompt_ids(model.tokenizer, m) for m in _PROMPTS.value]
  t0 = time.perf_counter()
  result = hf_parity.compare_with_transformers(
    model.config,
    model.params,
    hf_model,
    prompts,
    _NEW_TOKENS.value,
    pad_id=model.config.pad_token_id or 0,
  )
  compare_s = time.perf_counter() - t0

  print(
    f"{'prompt':<34} {'T':>4} {'max|Δ| prompt':>14} {'max|Δ| decode':>14}"
    f" {'greedy agree':>13}"
  )
  for message, row in zip(_PROMPTS.value, result["rows"]):
    print(
      f"{message[:34]:<34} {row['prompt_tokens']:>4} "
      f"{row['max_abs_dlogit_prompt']:>14.2e} "
      f"{row['max_abs_dlogit_decode']:>14.2e} "
      f"{row['greedy_tokens_agreeing']:>6}/{_NEW_TOKENS.value:<6}"
    )
    print(f"  ours: {model.tokenizer.decode(row['ours'])!r}")
  ok = (
    result["max_abs_dlogit"] <= _TOLERANCE.value and result["all_greedy_match"]
  )
  print(
    f"max |Δ logit| = {result['max_abs_dlogit']:.2e} "
    f"(tolerance {_TOLERANCE.value:.0e}); greedy match: "
    f"{result['all_greedy_match']}; {'PASS' if ok else 'FAIL'}"
  )
  print(
    f"load: rljax {load_s:.1f}s, transformers {hf_load_s:.1f}s; "
    f"compare {compare_s:.1f}s"
  )
  if _OUT.value:
    report = dict(
      result,
      model=path,
      prompts=_PROMPTS.value,
      new_tokens=_NEW_TOKENS.value,
      tolerance=_TOLERANCE.value,
      passed=ok,
      load_s=load_s,
      hf_load_s=hf_load_s,
      compare_s=compare_s,
    )
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=2)
  if not ok:
    raise SystemExit(1)


if __name__ == "__main__":
  app.run(main)
