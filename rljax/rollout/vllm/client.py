"""What a sidecar asks of its vLLM server over HTTP.

`EngineClient` waits for the server, checks at start-up that it serves what
the sidecar needs (the model, the dev routes, the worker extension,
processed log-probs), fans a rollout out as one concurrent request per
prompt, and reloads weights from a sync dir. Requests go through
`api.VLLMClient`; failures become the `SidecarError` of the server they
were sent to (`process.Server.failure`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import time
from typing import Any, Sequence

import numpy as np

from rljax.quant import cpu as cpu_lib
from rljax.rollout.base import RolloutBatch
from rljax.rollout.base import SamplingConfig
from rljax.rollout.vllm.config import ATTACH_HEALTH_TIMEOUT_S
from rljax.rollout.vllm.config import SidecarError
from rljax.rollout.vllm.config import VLLMSidecarConfig
from rljax.rollout.vllm.process import EXTENSION_CLASS
from rljax.rollout.vllm.process import EXTENSION_DIR
from rljax.rollout.vllm.process import Server
from rljax.rollout.vllm.api import VLLMClient
from rljax.rollout.vllm.api import VLLMRequestError
from rljax.rollout.vllm.api import completion_request
from rljax.rollout.vllm.api import parse_completion

Row = tuple[list[int], np.ndarray, str]  # response ids, behav_logp, reason


# How often a waiting rollout checks that its server process still runs.
_ALIVE_POLL_S = 0.5


def _prompt_seed(seed: int, prompt_index: int) -> int:
  # vLLM seeds sample j of a request with seed + j; a 32-bit hash of
  # (seed, prompt index) keeps every (prompt, sample) stream distinct (up to
  # ~n / 2**32 collisions) and independent of how prompts are split into
  # requests or across sidecars.
  state = np.random.SeedSequence([seed % (1 << 64), prompt_index])
  return int(state.generate_state(1, np.uint32)[0])


class EngineClient:
  """Requests to one vLLM server on behalf of a sidecar.

  Attributes:
    http: the HTTP client (one connection per call: thread-safe).
    broken: why the engine is unusable until restarted (a failed weight
      reload leaves layers without data), or None.
    has_extension: the server loaded rljax's worker extension.
    extension_version: its `EXTENSION_VERSION` (0 without it); 2 and up
      apply shared-memory weights in place (`apply_shared`).
  """

  def __init__(
    self, server: Server, config: VLLMSidecarConfig, api_key: str | None
  ):
    self.server, self.config = server, config
    self.http = VLLMClient(
      server.url, config.request_timeout_s, api_key=api_key
    )
    self.broken: str | None = None
    self.has_extension = False
    self.extension_version = 0
    self._vocab_size: int | None = None

  def wait_healthy(self, deadline: float) -> None:
    """Polls /health until `deadline` (perf_counter); stops a launched
    server that does not come up."""
    while True:
      if self.server.exited():
        raise self.server.failure("starting up", "the server process exited")
      if self.http.is_healthy(timeout_s=5.0):
        return
      if time.perf_counter() > deadline:
        self.server.stop()
        raise self.server.failure(
          "starting up",
          "not healthy after "
          f"{self.config.startup_timeout_s:.0f} s (the health wait: "
          "VLLMSidecarConfig.startup_timeout_s, at most "
          f"{ATTACH_HEALTH_TIMEOUT_S:.0f} s for a --rollout.vllm_urls server)",
        )
      time.sleep(0.5)

  def model_card(self) -> dict[str, Any]:
    """The /v1/models entry of `served_model_name` (`root`, ...)."""
    action = "checking the server after start-up"
    try:
      models = self.http.models()
    except VLLMRequestError as e:
      raise self.server.failure(action, e) from None
    card = next(
      (m for m in models if m.get("id") == self.config.served_model_name), None
    )
    if card is None:
      raise self.server.failure(
        action,
        (
          f"it serves {[m.get('id') for m in models]}, not "
          f"{self.config.served_model_name!r} (served_model_name)"
        ),
      )
    return card

  def check_server(
    self, quant_mode: str, vocab_size: int | None, attached: bool
  ) -> None:
    """The rest of the start-up check: the dev routes, the worker extension
    (required on launched servers) and the log-prob mode."""
    action = "checking the server after start-up"
    self._vocab_size = vocab_size
    try:
      self.http.reset_prefix_cache(timeout_s=60)
    except VLLMRequestError as e:
      if e.status == 404:
        raise self.server.failure(
          action,
          (
            "it has no /reset_prefix_cache route; start it with "
            "VLLM_SERVER_DEV_MODE=1 (weight syncs need the dev routes)"
          ),
        ) from None
      raise self.server.failure(action, e) from None
    self.has_extension = False
    self.extension_version = 0
    if self.config.worker_extension:
      try:
        info = self.http.collective_rpc("rljax_extension_info", timeout_s=60)
        self.has_extension = True
        self.extension_version = _extension_version(info)
      except VLLMRequestError as e:
        if not attached:
          raise self.server.failure(
            action, f"the rljax worker extension did not load: {e}"
          ) from None
    if quant_mode == "int8" and not self.has_extension:
      logging.warning(
        "vLLM sidecar %s runs an INT8 checkpoint without rljax's worker "
        "extension (start it with PYTHONPATH=%s --worker-extension-cls %s): "
        "on vLLM's CPU backend INT8 weight reloads then produce garbage, "
        "which the post-sync check reports",
        self.server.describe(),
        EXTENSION_DIR,
        EXTENSION_CLASS,
      )
    if quant_mode == "int8" and not attached:
      info = cpu_lib.host_cpu()
      if info.onednn_int8_saturates:
        logging.warning(
          "vLLM sidecar %s runs INT8 W8A8 on a CPU without VNNI or AMX-INT8 "
          "(%s): vLLM-CPU's oneDNN int8 GEMM sums u8 x s8 products in "
          "saturating int16 there, so codes |w| > 63 overflow (12.9%% "
          "relative error measured on an AVX2-only AMD EPYC; "
          "CpuInfo.onednn_int8_saturates). The behavior log-probs stay "
          "honest, but the actor is not the W8A8 model: for INT8 rollouts "
          "on this CPU use --rollout.engine=jax (XLA's int8 dot is exact)",
          self.server.describe(),
          info.summary(),
        )
    # This request also warms the server up (its first request is several
    # times slower than the next ones).
    self.probe(action)

  def probe(self, action: str) -> None:
    """One-token generations: finite output and processed log-probs.

    With top_k=1 the distribution actually sampled from is a point mass, so
    the processed log-prob of the sampled token is 0; a raw log-prob (vLLM's
    default mode) is log_softmax(logits) < 0. A tie of m top logits keeps
    all m under top_k=1 and gives exactly -log m: bf16 logits tie often
    (their spacing at |z| ~ 16 is 0.125; seen on an AVX2-only CPU after an
    embedding change), so a tie asks again with another prompt instead of
    failing (`probe_verdict`).
    """
    probe = SamplingConfig(n=1, temperature=1.0, top_k=1, max_new_tokens=1)
    vocab = self._vocab_size or 2
    seen = []
    for token in range(1, 1 + _PROBE_PROMPTS):
      prompt = [min(token, vocab - 1)] * 4
      try:
        answer = self.http.complete(
          completion_request(
            self.config.served_model_name, prompt, probe, seed=0
          ),
          timeout_s=self.config.request_timeout_s,
        )
        ((_, logp, _),) = parse_completion(answer, 1)
      except (VLLMRequestError, ValueError) as e:
        raise self.server.failure(
          action + " (probe generation)", _explain(e)
        ) from None
      value = float(logp[0])
      if not np.isfinite(value):
        raise self.server.failure(
          action + " (probe generation)", f"non-finite log-prob {value}"
        )
      verdict = probe_verdict(value)
      if verdict == "processed":
        return
      seen.append(f"{value:.4f}")
      if verdict == "raw":
        break
    if verdict == "tie":
      cause = (
        f"sampled-token log-probs {', '.join(seen)} under top_k=1: the "
        "logits tied at the top on every probe prompt; sound weights almost "
        "never do that, so the engine's weights are suspect"
      )
    else:
      cause = (
        f"sampled-token log-prob {seen[-1]} under top_k=1 is neither 0 nor "
        "-log m (a tie of m top logits): the server does not return "
        "processed log-probs; run it with --logprobs-mode processed_logprobs"
      )
    raise self.server.failure(action, cause)

  def generate_rows(
    self,
    prompts: list[list[int]],
    sampling: SamplingConfig,
    first_index: int,
    limits: Sequence[int] | None = None,
  ) -> list[Row]:
    """One concurrent request per prompt (vLLM batches them), seeded by the
    prompt's global index, each with its own max_tokens where `limits`
    gives them; rows prompt-major."""
    name = self.config.served_model_name
    bodies = [
      completion_request(
        name,
        p,
        sampling
        if limits is None
        else dataclasses.replace(sampling, max_new_tokens=int(limits[i])),
        _prompt_seed(sampling.seed, first_index + i),
      )
      for i, p in enumerate(prompts)
    ]
    action = (
      f"generating {len(prompts)} prompts x n={sampling.n}, "
      f"max_new_tokens={sampling.max_new_tokens}"
    )
    if self.config.fresh_prefix_cache:
      try:
        # False (nothing reset) while another client's requests hold
        # blocks: harmless, this call just may reuse their cache.
        self.http.reset_prefix_cache(timeout_s=60)
      except VLLMRequestError as e:
        raise self.server.failure(action, _explain(e)) from None
    workers = min(len(bodies), self.config.max_concurrent_requests)
    results: list[Any] = [None] * len(bodies)
    pool = concurrent.futures.ThreadPoolExecutor(
      max_workers=max(workers, 1), thread_name_prefix="vllm-request"
    )
    try:
      futures = {
        pool.submit(self.http.complete, body): i
        for i, body in enumerate(bodies)
      }
      done = self._completed(futures, action)
      if self.config.show_progress:
        import tqdm  # pylint: disable=g-import-not-at-top

        done = tqdm.tqdm(
          done, total=len(futures), desc="vllm rollout", unit="prompt"
        )
      for future in done:
        i = futures[future]
        try:
          results[i] = parse_completion(future.result(), sampling.n)
        except VLLMRequestError as e:
          explained = _explain(e)
          if (
            e.status is not None
            and 400 <= e.status < 500
            and explained == str(e)
          ):
            raise ValueError(
              f"vLLM sidecar {self.server.describe()} rejected prompt "
              f"{first_index + i}: {e.detail}"
            ) from None
          raise self.server.failure(action, explained) from None
        except ValueError as e:
          raise self.server.failure(
            action, f"prompt {first_index + i}: {e}"
          ) from None
    finally:
      pool.shutdown(wait=False, cancel_futures=True)
    return [row for rows in results for row in rows]

  def _completed(self, futures, action: str):
    """`futures` as they complete, checking between answers that the
    server still runs (`Server.check_alive`): a dead server's connections
    may stay open."""
    pending = set(futures)
    while pending:
      done, pending = concurrent.futures.wait(
        pending,
        timeout=_ALIVE_POLL_S,
        return_when=concurrent.futures.FIRST_COMPLETED,
      )
      yield from done
      self.server.check_alive(action, len(pending))

  def reload(self, path: str, settle: bool = True) -> None:
    """Reloads the weights of a checkpoint-format dir in place, resets the
    prefix cache (its KV blocks are of the old weights) and, with
    `verify_after_sync`, probes the engine. A failure marks it `broken`.
    settle=False skips the reset and the probe (generation is paused with
    requests in flight: the caller settles once they are done)."""
    action = f"reloading weights from {path!r}"
    method = "rljax_reload_weights" if self.has_extension else "reload_weights"
    try:
      self.http.collective_rpc(
        method, {"weights_path": path}, timeout_s=self.config.sync_timeout_s
      )
    except VLLMRequestError as e:
      # A failed in-place reload leaves layers without data.
      self.broken = f"a failed weight reload from {path!r}"
      raise self.server.failure(
        action, f"{e}; the engine is unusable until restart()"
      ) from None
    if settle:
      self.settle(action, path)

  def apply_shared(
    self, file: str, changed: list[str] | None, settle: bool = True
  ) -> dict[str, Any]:
    """Has the worker extension (version 2+) apply the shared-memory weights
    file in place, only the modules of the `changed` tensors (None: all);
    then resets the prefix cache and probes, as `reload` (unless
    settle=False).

    Returns:
      The extension's report (modules, handlers, seconds), or
      {"unsupported": reason} when this engine or file is not one it
      handles: nothing was changed then, and the caller reloads the file
      the usual way (`reload`).
    """
    action = f"applying shared weights from {file!r}"
    kwargs = {"path": file}
    if changed is not None:
      kwargs["changed"] = json.dumps(changed)
    try:
      answer = self.http.collective_rpc(
        "rljax_apply_shared_weights",
        kwargs,
        timeout_s=self.config.sync_timeout_s,
      )
    except VLLMRequestError as e:
      self.broken = f"a failed weight sync from {file!r}"
      raise self.server.failure(
        action, f"{e}; the engine is unusable until restart()"
      ) from None
    results = answer.get("results") if isinstance(answer, dict) else None
    if not (
      isinstance(results, list) and results and isinstance(results[0], dict)
    ):
      self.broken = f"a weight sync from {file!r} with an unknown outcome"
      raise self.server.failure(
        action,
        f"the worker answered {answer!r:.200}; expected "
        '{"results": [{...}]}; the engine is unusable until restart()',
      )
    report = results[0]
    if settle and "unsupported" not in report:
      self.settle(action, file)
    return report

  def settle(self, action: str, path: str) -> None:
    """After new weights (`action`, from `path`): resets the prefix cache
    (its blocks hold KV of the old weights) and, with `verify_after_sync`,
    probes the engine. A failure marks it `broken`."""
    for _ in range(20):
      try:
        if self.http.reset_prefix_cache(timeout_s=60):
          break
      except VLLMRequestError as e:
        raise self.server.failure(
          "resetting the prefix cache after a weight sync", e
        ) from None
      time.sleep(0.1)  # refused while blocks are still held by requests
    else:
      self.broken = "a prefix-cache reset that kept failing after a sync"
      raise self.server.failure(
        "resetting the prefix cache after a weight sync",
        "the server kept answering success=false",
      )
    if self.config.verify_after_sync:
      try:
        self.probe(f"checking the engine after {action}")
      except SidecarError:
        self.broken = f"weights from {path!r} that break the engine"
        raise


# Prompts the probe tries before it calls a run of ties a failure.
_PROBE_PROMPTS = 4
# Ties of up to this many top logits are recognised as such.
_MAX_TIE = 8


def probe_verdict(logp: float, atol: float = 1e-4) -> str:
  """What one top_k=1 probe's sampled-token log-prob says of the server.

  "processed": |logp| <= atol, the point mass of processed log-probs.
  "tie": logp = -log m for 2 <= m <= 8 (m tied top logits all survive
    top_k=1, each with probability 1/m); the probe cannot tell, ask again.
  "raw": anything else, a log_softmax of the unprocessed logits.
  """
  if abs(logp) <= atol:
    return "processed"
  m = round(float(np.exp(-logp)))
  if 2 <= m <= _MAX_TIE and abs(logp + np.log(m)) <= atol:
    return "tie"
  return "raw"


def _extension_version(info: Any) -> int:
  """EXTENSION_VERSION from an `rljax_extension_info` answer (0: unknown)."""
  results = info.get("results") if isinstance(info, dict) else None
  first = results[0] if isinstance(results, list) and results else None
  version = first.get("extension_version") if isinstance(first, dict) else 0
  return version if isinstance(version, int) else 0


def _explain(error: Exception) -> str:
  text = str(error)
  if "Out of range float values" in text:
    return (
      f"{text} (the engine produced NaN/inf log-probs: its weights or "
      "kernels are broken)"
    )
  return text


def prompt_limits(
  per_sample: Sequence[int] | None, prompts: int, sampling: SamplingConfig
) -> list[int] | None:
  """`max_new_tokens_per_sample` (P·n ints, row order) as one max_tokens
  per prompt (a prompt's n samples are one vLLM request), checked: each in
  [1, sampling.max_new_tokens], equal within a prompt. None stays None."""
  if per_sample is None:
    return None
  n, most = sampling.n, sampling.max_new_tokens
  limits = [int(x) for x in per_sample]
  if len(limits) != prompts * n:
    raise ValueError(
      f"VLLMSidecar.generate: max_new_tokens_per_sample has {len(limits)} "
      f"entries; expected one per sample ({prompts} prompts x n={n})"
    )
  out = []
  for p in range(prompts):
    mine = set(limits[p * n : (p + 1) * n])
    if len(mine) != 1 or not 1 <= min(mine) <= most:
      raise ValueError(
        f"VLLMSidecar.generate: max_new_tokens_per_sample of prompt {p} is "
        f"{sorted(mine)}; expected one value in [1, max_new_tokens={most}] "
        "for its n samples (they are one vLLM request)"
      )
    out.append(mine.pop())
  return out


def to_batch(
  prompts: list[list[int]],
  rows: list[Row],
  sampling: SamplingConfig,
  seconds: float,
) -> RolloutBatch:
  """The `RolloutBatch` of prompt-major rows, with the engine's timing."""
  tokens = sum(len(ids) for ids, _, _ in rows)
  return RolloutBatch(
    prompt_ids=prompts,
    response_ids=[ids for ids, _, _ in rows],
    behav_logp=[logp for _, logp, _ in rows],
    finish_reason=[reason for _, _, reason in rows],
    n=sampling.n,
    timing={
      "seconds": seconds,
      "tokens": float(tokens),
      "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
      "prompt_tokens": float(sum(len(p) for p in prompts)),
    },
  )
