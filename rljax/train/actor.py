"""The rollout side of training: the engine, the weights it runs, recovery.

The trainer hands θ (full precision) to the actor; the actor prepares the
rollout weights once (`quant.prepare_rollout_weights`: Q(θ) or θ, in fresh
buffers, checked finite, with the quantization diagnostics of exactly what
the engine will run), pushes them, and generates. An engine that dies or
hangs (a vLLM sidecar) is restarted once per call (`rollout.factory`).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from rljax import quant
from rljax.rollout import factory as rollout_factory
from rljax.rollout.base import RolloutBatch, SamplingConfig
from rljax.train import batch as batch_lib
from rljax.train import guard
from rljax.train.config import TrainConfig


class Actor:
  """The rollout engine of a run and the weights it runs."""

  def __init__(
    self,
    cfg: TrainConfig,
    model_config: Any,
    tokenizer: Any,
    params: Any,
    mesh: Any = None,
  ):
    """Builds the engine `cfg.engine` (a vLLM engine starts from `params`;
    the JAX sampler runs sharded on `mesh` when one is given)."""
    self.cfg = cfg
    self.model_config = model_config
    self.quantized = cfg.rollout_quant in ("int8", "int8_wo", "fp8")
    self.diagnostics = quant.SyncDiagnostics() if self.quantized else None
    self.restarts = 0
    self.engine = rollout_factory.make_engine(
      cfg.engine,
      model_config,
      params,
      quant=cfg.rollout_quant,
      max_prompt_len=batch_lib.bucket(cfg.max_prompt_tokens),
      max_new_tokens=cfg.max_new_tokens,
      pad_id=batch_lib.pad_id(tokenizer),
      tokenizer=tokenizer,
      run_dir=cfg.run_dir,
      vllm_urls=cfg.vllm_urls,
      mesh=mesh,
    )

  def prepare(self, params: Any, step: int) -> tuple[Any, dict]:
    """What the engine will run, Q(θ) or θ, in fresh buffers (the update
    step donates θ's), and the quantization diagnostics of exactly that.

    Raises:
      NonFiniteError: the rollout weights hold NaN or inf.
    """
    t0 = time.perf_counter()
    cfg = self.cfg
    rparams = quant.prepare_rollout_weights(
      self.model_config, params, cfg.rollout_quant, fake=cfg.fake_quant
    )
    diag = self.diagnostics(params, rparams) if self.quantized else {}
    guard.require_finite(rparams, f"the rollout weights after step {step}")
    diag["time_quantize"] = time.perf_counter() - t0
    return rparams, diag

  def push(self, rparams: Any, diag: dict) -> dict[str, float]:
    """Loads prepared weights into the engine; `prepare`'s diagnostics plus
    the sync's time and bytes."""
    t0 = time.perf_counter()
    stats = self.recovering(
      "weight sync", lambda: self.engine.update_weights(rparams)
    )
    out = dict(diag)
    out["time_sync"] = time.perf_counter() - t0 + diag.pop("time_quantize", 0.0)
    out["sync_bytes"] = float(stats.bytes)
    return out

  def sync(self, params: Any, step: int) -> dict[str, float]:
    """Prepares θ and pushes it (synchronous mode)."""
    return self.push(*self.prepare(params, step))

  def generate(self, prompts: list, sampling: SamplingConfig) -> RolloutBatch:
    return self.recovering(
      "rollout", lambda: self.engine.generate(prompts, sampling)
    )

  def recovering(self, what: str, call: Callable[[], Any]) -> Any:
    """Runs an engine call; if the engine died or hung (a vLLM sidecar),
    restarts it (it reloads the weights of its last sync) and tries once
    more. A second failure ends the run with the engine's own message."""

    def on_restart(what, first):
      self.restarts += 1
      print(
        f"[rljax] {what}: rollout engine failed ({str(first)[:300]}); "
        f"restarting it (restart #{self.restarts})",
        flush=True,
      )

    return rollout_factory.call_with_restart(
      self.engine, what, call, on_restart
    )

  def metrics(self) -> dict[str, float]:
    """engine_restarts, for the engines that can be restarted (vLLM)."""
    if self.cfg.engine == "jax":
      return {}
    return {"engine_restarts": float(self.restarts)}

  def close(self) -> None:
    if self.engine is not None:
      self.engine.close()
      self.engine = None
