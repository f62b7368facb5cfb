"""Numerical parity of the JAX decoder with PyTorch transformers.

Used by tests/models and experiments/parity_smollm2.py. torch and transformers
are imported lazily: the rest of rljax does not need them.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import decoder
from rljax.models.config import ModelConfig


def left_pad(
  sequences: Sequence[Sequence[int]], pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
  """int32 tokens [B, T] and mask [B, T], sequences right-aligned."""
  t = max(len(s) for s in sequences)
  tokens = np.full((len(sequences), t), pad_id, np.int32)
  mask = np.zeros((len(sequences), t), np.int32)
  for i, s in enumerate(sequences):
    tokens[i, t - len(s) :] = s
    mask[i, t - len(s) :] = 1
  return tokens, mask


def greedy_decode(
  config: ModelConfig,
  params,
  prompts: Sequence[Sequence[int]],
  new_tokens: int,
  pad_id: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
  """Batched greedy continuation through `forward_with_cache`.

  Prompts are left-padded; there is no stopping at eos (parity wants a fixed
  length). Returns (tokens [B, new_tokens], logits [B, new_tokens, V]) where
  logits[:, i] is the distribution token i was chosen from.
  """
  tokens, mask = left_pad(prompts, pad_id)
  b, t = tokens.shape
  max_len = t + new_tokens
  cache = decoder.init_cache(config, b, max_len, decoder.compute_dtype(params))
  kv_mask = np.zeros((b, max_len), bool)
  kv_mask[:, :t] = mask.astype(bool)
  positions = decoder.positions_from_mask(jnp.asarray(mask))

  step = jax.jit(decoder.forward_with_cache, static_argnums=0)
  logits, cache = step(
    config,
    params,
    jnp.asarray(tokens),
    positions,
    cache,
    0,
    jnp.asarray(kv_mask),
  )
  last_logits = logits[:, -1]
  next_pos = positions[:, -1:] + 1
  out_tokens, out_logits = [], []
  for i in range(new_tokens):
    next_tok = jnp.argmax(last_logits, axis=-1).astype(jnp.int32)[:, None]
    out_tokens.append(np.asarray(next_tok[:, 0]))
    out_logits.append(np.asarray(last_logits))
    if i == new_tokens - 1:
      break
    kv_mask[:, t + i] = True
    logits, cache = step(
      config, params, next_tok, next_pos, cache, t + i, jnp.asarray(kv_mask)
    )
    last_logits = logits[:, -1]
    next_pos = next_pos + 1
  return np.stack(out_tokens, 1), np.stack(out_logits, 1)


def load_transformers_gguf(path: str):
  """transformers' own float32 dequantization of a GGUF file (eval mode)."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top

  directory, name = os.path.split(os.path.abspath(path))
  try:
    model = AutoModelForCausalLM.from_pretrained(
      directory, gguf_file=name, dtype=torch.float32
    )
  except TypeError:  # transformers < 4.56 spells it torch_dtype
    model = AutoModelForCausalLM.from_pretrained(
      directory, gguf_file=name, torch_dtype=torch.float32
    )
  return model.eval()


def torch_logits_and_greedy(
  hf_model, prompt: Sequence[int], new_tokens: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(prompt logits [T, V], greedy tokens [N], their logits [N, V]) from a
  transformers model, one unpadded prompt, with its KV cache."""
  import torch  # pylint: disable=g-import-not-at-top

  with torch.no_grad():
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    out = hf_model(input_ids=ids, use_cache=True)
    prompt_logits = out.logits[0].float().numpy()
    past, last = out.past_key_values, out.logits[:, -1]
    toks, step_logits = [], []
    for i in range(new_tokens):
      nxt = int(torch.argmax(last, dim=-1)[0])
      toks.append(nxt)
      step_logits.append(last[0].float().numpy())
      if i == new_tokens - 1:
        break
      out = hf_model(
        input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True
      )
      past, last = out.past_key_values, out.logits[:, -1]
  return prompt_logits, np.asarray(toks), np.stack(step_logits)


def compare_with_transformers(
  config: ModelConfig,
  params,
  hf_model,
  prompts: Sequence[Sequence[int]],
  new_tokens: int = 32,
  pad_id: int = 0,
) -> dict[str, Any]:
  """Prompt-logit and greedy-continuation agreement, per prompt.

  Ours runs all prompts as one left-padded batch (the rollout setting);
  transformers runs each prompt alone, unpadded.
  """
  tokens, mask = left_pad(prompts, pad_id)
  forward = jax.jit(decoder.forward, static_argnums=0)
  ours = np.asarray(
    forward(config, params, jnp.asarray(tokens), jnp.asarray(mask))
  )
  our_greedy, our_step_logits = greedy_decode(
    config, params, prompts, new_tokens, pad_id
  )
  rows = []
  for i, prompt in enumerate(prompts):
    ref_logits, ref_greedy, ref_step_logits = torch_logits_and_greedy(
      hf_model, prompt, new_tokens
    )
    n = len(prompt)
    prompt_diff = np.abs(ours[i, -n:] - ref_logits).max()
    agree = int(
      np.argmax(our_greedy[i] != ref_greedy)
      if (our_greedy[i] != ref_greedy).any()
      else new_tokens
    )
    # Step k's logits come from identical histories for every k <= agree.
    k = min(agree + 1, new_tokens)
    decode_diff = np.abs(our_step_logits[i, :k] - ref_step_logits[:k]).max()
    rows.append(
      {
        "prompt_tokens": n,
        "max_abs_dlogit_prompt": float(prompt_diff),
        "max_abs_dlogit_decode": float(decode_diff),
        "greedy_tokens_agreeing": agree,
        "greedy_match": bool(agree == new_tokens),
        "ours": our_greedy[i].tolist(),
        "reference": ref_greedy.tolist(),
      }
    )
  return {
    "rows": rows,
    "max_abs_dlogit": float(
      max(
        max(r["max_abs_dlogit_prompt"], r["max_abs_dlogit_decode"])
        for r in rows
      )
    ),
    "all_greedy_match": all(r["greedy_match"] for r in rows),
  }
