"""One way to build the rollout engine a run names, and to recover it.

Every engine built here loads prepared weights as given
(`quant.prepare_rollout_weights`): the JAX sampler runs the tree it gets, a
vLLM engine writes it in the checkpoint format it was started with.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from rljax.rollout.base import EngineFailure

ENGINES = ("jax", "vllm")


def make_engine(
  engine: str,
  model_config: Any,
  params: Any,
  *,
  quant: str,
  max_prompt_len: int,
  max_new_tokens: int,
  pad_id: int,
  tokenizer: Any = None,
  run_dir: str = ".",
  vllm_urls: Sequence[str] | None = None,
  mesh: Any = None,
  batching: str = "static",
  reuse_prefix_cache: bool = False,
  inflight_kv: str = "keep",
  kv_page_size: int = 0,
  speculative: str = "off",
  chunk_steps: int = 32,
):
  """The rollout engine `engine` for a model.

  Args:
    engine: "jax" (in-process sampler) or "vllm" (sidecar server(s)).
    model_config: the decoder config.
    params: full-precision θ; a vLLM engine starts from its export in
      `quant` format, the JAX sampler waits for `update_weights`.
    quant: the rollout weight format (`quant.ROLLOUT_MODES`).
    max_prompt_len: longest (bucketed) prompt.
    max_new_tokens: longest response.
    pad_id: the tokenizer's pad id (JAX sampler).
    tokenizer: written next to a vLLM export.
    run_dir: where a vLLM engine keeps its start checkpoint and logs.
    vllm_urls: already running vLLM servers to use instead of launching.
    mesh: the JAX sampler runs sharded over this Mesh (None: one device).
    batching: the JAX sampler's "static" or "continuous" batching
      (`JaxSampler`); vLLM always batches continuously.
    reuse_prefix_cache: a vLLM engine keeps its prefix cache between
      generate calls (`VLLMSidecarConfig(fresh_prefix_cache=False)`); for
      multi-turn tool episodes, whose every turn's prompt is the previous
      call's prompt and output plus an observation, so the next turn
      prefills only the new ids. The cache is still reset at every weight
      sync. Off (the default), each call starts from an empty cache.
    inflight_kv: "keep" or "recompute" of the in-flight rows' KV when
      `generate`'s weight_updates hook hands the engine new weights
      (`rljax.rollout.inflight`; vLLM: `rljax.rollout.vllm.inflight`).
    kv_page_size: the continuous JAX sampler's KV page size (0: none).
    speculative: the continuous JAX sampler's speculative decoding ("off"
      or "suffix", `spec_control`); its earlier responses per prompt are
      logged to <run_dir>/spec_drafts.jsonl, so a resumed run drafts from
      what the run had seen.
    chunk_steps: the continuous JAX sampler's most decode steps between
      two scheduling points (where a streaming run takes new weights).
  """
  if engine == "jax":
    from rljax.rollout import spec_control  # pylint: disable=g-import-not-at-top
    from rljax.rollout import spec_store  # pylint: disable=g-import-not-at-top
    from rljax.rollout.jax_sampler import JaxSampler  # pylint: disable=g-import-not-at-top

    spec = spec_control.check_mode(speculative, "make_engine")
    store = None
    if spec is not None:
      store = spec_store.PromptStore(
        spec.history_prompts,
        spec.history_per_prompt,
        path=os.path.join(run_dir, spec_store.RUN_FILE),
      )
    return JaxSampler(
      model_config,
      None,
      quant="none",
      max_prompt_len=max_prompt_len,
      pad_id=pad_id,
      mesh=mesh,
      batching=batching,
      inflight_kv=inflight_kv,
      kv_page_size=kv_page_size,
      speculative=spec or "off",
      chunk_steps=chunk_steps,
      draft_store=store,
    )
  if engine == "vllm":
    from rljax.rollout import vllm_sidecar  # pylint: disable=g-import-not-at-top

    return vllm_sidecar.engine_for_model(
      model_config,
      params,
      os.path.join(run_dir, "vllm_start"),
      quant=quant,
      tokenizer=tokenizer,
      urls=vllm_urls,
      config=vllm_sidecar.VLLMSidecarConfig(
        max_model_len=max_prompt_len + max_new_tokens,
        # Server logs belong to the run, not to a shared temp dir.
        log_dir=os.path.join(run_dir, "vllm_logs"),
        fresh_prefix_cache=not reuse_prefix_cache,
        inflight_kv=inflight_kv,
      ),
    )
  raise ValueError(f"make_engine: engine={engine!r}; expected one of {ENGINES}")


def call_with_restart(engine: Any, what: str, call, on_restart=None):
  """Runs `call()`; if the engine failed in a way a restart repairs
  (`EngineFailure`: a vLLM sidecar died or hung), restarts it (it reloads
  the weights of its last sync) and tries once more. A second failure
  propagates with the engine's own message."""
  try:
    return call()
  except EngineFailure as first:
    if on_restart is not None:
      on_restart(what, first)
    engine.restart()
    return call()
