"""The rollout side of training: the engine, the weights it runs, recovery.

The trainer hands θ (full precision) to the actor; the actor prepares the
rollout weights once (`quant.prepare_rollout_weights`: Q(θ) or θ, in fresh
buffers, checked finite, with the quantization diagnostics of exactly what
the engine will run), pushes them, and generates. An engine that dies or
hangs (a vLLM sidecar) is restarted once per call (`rollout.factory`).

Versions: weights are prepared for a version (the trainer step whose update
made θ; 0 = the initial weights), the actor remembers the version it last
pushed, and `generate` stamps it on every response token
(`RolloutBatch.policy_version`). A push and a generation never interleave
(one lock), so the stamp is the version that sampled the token even when a
pipelined worker pushes while the trainer's thread refills a batch. A
streaming rollout (`generate_stream`) may take newer weights between
decode chunks: the engine then stamps each token with its own version.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from rljax import quant
from rljax.rollout import factory as rollout_factory
from rljax.rollout.base import RolloutBatch, SamplingConfig
from rljax.train import batch as batch_lib
from rljax.train import guard
from rljax.train import placement as placement_lib
from rljax.train.config import TrainConfig
from rljax.train.tasks import TOOL_TASKS


def rollout_mode(cfg: TrainConfig) -> str:
  """The format `prepare_rollout_weights` makes for `cfg`'s engine.

  `rollout.quant` as given, except "none" on the JAX sampler under a
  bfloat16 compute dtype, which becomes "bf16": the trainer's proximal pass
  runs θ cast to bf16 (`update.compute_params`), so the sampler must run
  the same bf16 weights for behaviour = proximal to hold up to the
  kernels' float32 accumulation order. Sampling from the float32 θ instead
  was not a reference: a step of Adam at lr 1e-5 moves most
  weights by less than half a bf16 ulp, so the float32 sampler saw each
  update and the bf16 proximal pass did not, and `behav_prox_kl` grew from
  1e-4 to 1e-2 in three SmolLM2 steps. Under the CPU's mixed precision both
  run bf16 x bf16 -> f32 dots over float32 activations
  (`JaxSampler.activation_dtype`, `placement.activation_dtype`); on an
  accelerator both run bf16 throughout. A vLLM engine keeps "none": it runs
  its own kernels and is never the trainer's function.
  """
  mode = cfg.rollout.quant
  if (
    mode == "none"
    and cfg.rollout.engine == "jax"
    and placement_lib.compute_dtype(cfg) == "bfloat16"
  ):
    return "bf16"
  return mode


# The key under which `Actor.prepare`'s diagnostics carry the version to
# `Actor.push` (popped there: it is not a metric).
VERSION_KEY = "policy_version"


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
    """Builds the engine `cfg.rollout.engine` (a vLLM engine starts from `params`;
    the JAX sampler runs sharded on `mesh` when one is given)."""
    self.cfg = cfg
    self.model_config = model_config
    self.quantized = cfg.rollout.quant in ("int8", "int8_wo", "fp8")
    self.diagnostics = quant.SyncDiagnostics() if self.quantized else None
    self.restarts = 0
    self.rollout_mode = rollout_mode(cfg)
    # The engine starts from `params`, the initial θ: version 0 (a resumed
    # trainer syncs its restored θ before its first rollout).
    self.version = 0
    self._engine_lock = threading.RLock()
    self.engine = rollout_factory.make_engine(
      cfg.rollout.engine,
      model_config,
      params,
      quant=cfg.rollout.quant,
      max_prompt_len=batch_lib.bucket(cfg.task.max_prompt_tokens),
      max_new_tokens=cfg.rollout.max_new_tokens,
      pad_id=batch_lib.pad_id(tokenizer),
      tokenizer=tokenizer,
      run_dir=cfg.run.run_dir,
      vllm_urls=cfg.rollout.vllm_urls,
      mesh=mesh,
      batching=cfg.rollout.batching,
      # Tool episodes: each turn's prompt extends the last call's.
      reuse_prefix_cache=cfg.task.name in TOOL_TASKS,
      inflight_kv=cfg.rollout.inflight_kv,
      kv_page_size=cfg.rollout.kv_page_size,
      speculative=cfg.rollout.speculative,
      chunk_steps=cfg.rollout.chunk_steps,
    )
    if (
      cfg.run.async_mode == "streaming"
      and cfg.rollout.engine == "jax"
      and getattr(self.engine, "batching", None) != "continuous"
    ):
      # The config asks for batching=continuous; a mesh still makes the
      # sampler static (its slot programs run on one device).
      raise ValueError(
        "run.async_mode='streaming' needs the continuous JAX engine; the "
        f"engine built runs batching={getattr(self.engine, 'batching', None)!r}"
        " (a rollout mesh keeps the static program): use "
        "--run.async_mode=one_step"
      )

  def prepare(self, params: Any, version: int) -> tuple[Any, dict]:
    """What the engine will run, Q(θ) or θ, in fresh buffers (the update
    step donates θ's), and the quantization diagnostics of exactly that.
    `version` is θ's (the step after which it was taken); the diagnostics
    carry it to `push` under VERSION_KEY.

    Raises:
      NonFiniteError: the rollout weights hold NaN or inf.
    """
    t0 = time.perf_counter()
    cfg = self.cfg
    rparams = quant.prepare_rollout_weights(
      self.model_config, params, self.rollout_mode, fake=cfg.rollout.fake_quant
    )
    diag = self.diagnostics(params, rparams) if self.quantized else {}
    guard.require_finite(rparams, f"the rollout weights after step {version}")
    diag["time_quantize"] = time.perf_counter() - t0
    # Carried in the diagnostics so that a caller holding (rparams, diag)
    # for a later push (the pipelined worker) pushes the version with them.
    diag[VERSION_KEY] = version
    return rparams, diag

  def diagnostics_reference(self) -> Any:
    """θ of the last prepared sync, the QuRL diagnostics' reference for the
    next one (None when not quantized or before the first sync)."""
    if self.diagnostics is None:
      return None
    return self.diagnostics.previous_params

  def restore_diagnostics_reference(self, params: Any, step: int) -> None:
    """Makes `params` (θ of `step`) the diagnostics' reference again, as
    after a resume: the next sync's diagnostics then compare against it as
    in the uninterrupted run, not against the resume's own sync."""
    if self.diagnostics is not None:
      self.prepare(params, step)  # only its effect on the reference

  def push(self, rparams: Any, diag: dict) -> dict[str, float]:
    """Loads prepared weights into the engine and remembers their version
    (`prepare`'s); returns `prepare`'s diagnostics plus the sync's time and
    bytes.

    Raises:
      ValueError: `diag` carries no version (weights that are not
        `prepare`'s: the tokens they sample could not be stamped).
    """
    t0 = time.perf_counter()
    out = dict(diag)
    version = out.pop(VERSION_KEY, None)
    if version is None:
      raise ValueError(
        f"Actor.push: the diagnostics carry no {VERSION_KEY!r}; expected "
        "weights from Actor.prepare(params, version), so that every token "
        "they sample is stamped with its version"
      )
    with self._engine_lock:
      stats = self.recovering(
        "weight sync", lambda: self.engine.update_weights(rparams)
      )
      self.version = int(version)
    out["time_sync"] = time.perf_counter() - t0 + diag.pop("time_quantize", 0.0)
    out["sync_bytes"] = float(stats.bytes)
    return out

  def sync(self, params: Any, version: int) -> dict[str, float]:
    """Prepares θ (of `version`) and pushes it (synchronous mode)."""
    return self.push(*self.prepare(params, version))

  def generate(self, prompts: list, sampling: SamplingConfig) -> RolloutBatch:
    """The engine's rollout, every response token stamped with the version
    of the weights it holds."""
    rb, version = self.with_engine(
      "rollout", lambda engine: engine.generate(prompts, sampling)
    )
    return rb.with_policy_version(version)

  def generate_stream(
    self,
    feed: Any,
    shape_prompts: list,
    sampling: SamplingConfig,
    weight_updates: Callable,
    before_retry: Callable[[], None] | None = None,
  ) -> dict:
    """A streamed run of the engine (`JaxSampler.generate_stream`): the
    prompts `feed` admits share the slots, each group goes to `feed.done`
    as it ends, new weights are taken in flight; the actor's version
    becomes the last one taken. Returns the run's stats.

    An engine that dies or hangs mid-stream (a vLLM sidecar) is restarted
    once, as in every other mode (`recovering`); `before_retry()` then
    puts the prompts it held back into the feed and pushes weights to the
    restarted engine before the stream runs again."""
    attempts = []

    def attempt():
      if attempts and before_retry is not None:
        before_retry()
      attempts.append(1)
      with self._engine_lock:
        version = self.version
        stats = self.engine.generate_stream(
          feed,
          shape_prompts,
          sampling,
          weight_updates=weight_updates,
          version=version,
        )
        self.version = int(stats.get("final_version", version))
      return stats

    return self.recovering("streaming rollout", attempt)

  def with_engine(
    self, what: str, call: Callable[[Any], Any]
  ) -> tuple[Any, int | None]:
    """(call(engine), the version of the weights it ran): no push lands
    in between, and a dead engine is restarted once (`recovering`). For
    rollouts that drive the engine themselves (multi-turn episodes), which
    then stamp `RolloutBatch.with_policy_version(version)`."""
    with self._engine_lock:
      version = self.version
      return self.recovering(what, lambda: call(self.engine)), version

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
    """engine_restarts, for the engines that can be restarted (vLLM); the
    JAX sampler's speculation figures of the step's rollouts (`spec_*`)."""
    if self.cfg.rollout.engine == "jax":
      take = getattr(self.engine, "take_spec_metrics", None)
      return take() if take is not None else {}
    return {"engine_restarts": float(self.restarts)}

  def close(self) -> None:
    if self.engine is not None:
      self.engine.close()
      self.engine = None
