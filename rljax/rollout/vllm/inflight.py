"""In-flight weight updates through a vLLM sidecar.

The JAX engine's in-flight updates (`rljax.rollout.inflight`) on vLLM 0.32,
with what that version serves (docs/async_vllm.md has the source facts):

  requests ──► /inference/v1/generate, one per prompt, all in flight
      │
      └─ every inflight_poll_s: weight_updates() ──► None: poll again
                                     │
                                     └─► (params, version):
          prepare (convert, check)      while the engine keeps generating
          /pause?mode=keep              requests frozen, not aborted
          write + apply in place        `rljax_apply_shared_weights`
          /update_weight_version        the label of later tokens
          /resume                       the same requests go on

vLLM stamps the label of the weights on every step's output
(`EngineCore._attach_weight_version`) and returns, per choice, the spans of
output tokens each label sampled (`weight_versions`); the sidecar labels the
weights with their int version, so each token gets the version of the
weights that sampled it (`RolloutBatch.policy_version`). What the update
does to the KV of the running requests is `VLLMSidecarConfig.inflight_kv`:
"keep" it (PipelineRL) or "recompute" it (AReaL: the pause preempts them and
vLLM recomputes their prompt and tokens so far with the new weights). The
tokens already sampled and their behaviour log-probs stay as they are.

The prefix cache is versioned: every request carries the `cache_salt` of
the version sampling when it is sent, and vLLM folds the salt into the
hash of a prompt's first block, so a request only reuses blocks that
requests sent under the same version computed. Under "keep" the cache
cannot be cleared at a swap (the running requests hold their blocks), and
without the salt a prompt sent after the swap would read KV the old
weights wrote for an identical prefix while its tokens are stamped with
the new version: a lag the metrics would not show.
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from typing import Any, Callable

import numpy as np

from rljax.rollout import prompt_feed
from rljax.rollout.base import SamplingConfig
from rljax.rollout.inflight import check_version
from rljax.rollout.vllm.api import GENERATE_ROUTE
from rljax.rollout.vllm.api import VLLMRequestError
from rljax.rollout.vllm.api import generate_request
from rljax.rollout.vllm.api import parse_generate
from rljax.rollout.vllm.client import EngineClient
from rljax.rollout.vllm.client import _prompt_seed

# Response ids, behav_logp, finish reason, per-token versions.
VersionedRow = tuple[list[int], np.ndarray, str, np.ndarray]


def check_hook(weight_updates: Any) -> Callable[[], Any]:
  if not callable(weight_updates):
    raise TypeError(
      f"VLLMSidecar.generate_inflight: weight_updates={weight_updates!r:.80};"
      " expected a callable returning None or (params, new_version)"
    )
  return weight_updates


def _unpack(update: Any) -> tuple[Any, Any]:
  if not isinstance(update, tuple) or len(update) != 2:
    raise TypeError(
      f"weight_updates returned {update!r:.80}; expected None or a "
      "(params, new_version) tuple"
    )
  return update


class InflightRun:
  """One `generate_inflight` call: its requests, swaps and figures.

  Attributes:
    client: the sidecar's `EngineClient`.
    kv: "keep" or "recompute" (`VLLMSidecarConfig.inflight_kv`).
    version: the version of the weights sampling now.
    swap_requests_in_flight: requests (prompts) unfinished at each swap.
    pause_seconds: wall seconds generation stood paused (sum over swaps).
    prepare_seconds: wall seconds converting and checking the new weights,
      outside the pauses (the engine keeps generating meanwhile).
  """

  def __init__(self, client: EngineClient, version: int, kv: str):
    self.client, self.kv = client, kv
    self.version = check_version(version, "generate_inflight: version")
    self.swap_requests_in_flight: list[int] = []
    self.pause_seconds = 0.0
    self.prepare_seconds = 0.0
    self.sent: list[str] = []  # a streamed run's request ids

  def label(self) -> None:
    """Labels the engine's weights with `version` (vLLM's label is a
    string, "default" until set)."""
    self.call("labelling the weights", self.client.http.set_weight_version,
              str(self.version))  # fmt: skip

  def call(self, action: str, fn: Callable[..., Any], *args) -> Any:
    """fn(*args); an HTTP failure becomes the server's `SidecarError`."""
    try:
      return fn(*args, timeout_s=self.client.config.sync_timeout_s)
    except VLLMRequestError as e:
      raise self.client.server.failure(action, e) from None

  def swap(
    self,
    update: Any,
    prepare: Callable[[Any], Any],
    apply: Callable[[Any], dict[str, Any]],
    in_flight: int,
  ) -> dict[str, Any]:
    """One update: prepare the weights while generating, then pause (keep
    the requests), apply them, relabel, resume. Returns apply's timing."""
    params, new_version = _unpack(update)
    new_version = check_version(
      new_version, "weight_updates' new_version", self.version
    )
    start = time.perf_counter()
    tensors = prepare(params)
    paused = time.perf_counter()
    self.prepare_seconds += paused - start
    # clear_cache=true preempts the running requests (vLLM's
    # reset_prefix_cache(reset_running_requests=True)): on resume they
    # recompute their KV, with the new weights by then.
    self.call("pausing generation for a weight update",
              self.client.http.pause, self.kv == "recompute")  # fmt: skip
    try:
      timing = apply(tensors)
      self.version = new_version
      self.label()
    finally:
      # Resumed even when the update failed: the frozen requests would
      # otherwise hold the engine until their timeout.
      self.call("resuming generation after a weight update",
                self.client.http.resume)  # fmt: skip
      self.pause_seconds += time.perf_counter() - paused
    self.swap_requests_in_flight.append(in_flight)
    return timing

  def stats(self) -> dict[str, Any]:
    return {
      "weight_swaps": len(self.swap_requests_in_flight),
      "swap_requests_in_flight": list(self.swap_requests_in_flight),
      "swap_pause_seconds": self.pause_seconds,
      "swap_prepare_seconds": self.prepare_seconds,
      "final_version": self.version,
    }


class _Request:
  """A `generate` call as a prompt feed: every prompt at the first poll,
  the rows kept by prompt."""

  def __init__(self, prompts, seed, first_index):
    self.prompts = [
      prompt_feed.StreamPrompt(list(p), first_index + i, seed, i)
      for i, p in enumerate(prompts)
    ]
    self.rows: list[Any] = [None] * len(prompts)

  def poll(self, prompt_len):
    del prompt_len  # the caller checked the lengths
    out, self.prompts = self.prompts, []
    return out

  def started(self, tag, version):
    del tag, version

  def done(self, group):
    self.rows[group.tag] = list(
      zip(group.tokens, group.logp, group.finish, group.versions)
    )

  def stopped(self):
    return False


def generate(
  run: InflightRun,
  prompts: list[list[int]],
  sampling: SamplingConfig,
  first_index: int,
  hook: Callable[[], Any],
  prepare: Callable[[Any], Any],
  apply: Callable[[Any], dict[str, Any]],
) -> list[VersionedRow]:
  """Samples every prompt (one concurrent request each, seeded by its
  global index as `EngineClient.generate_rows`), polling `hook` every
  `inflight_poll_s` while requests are unfinished and swapping in the
  weights it hands over (`InflightRun.swap`): `stream` over a feed that
  admits them all at once. Rows prompt-major."""
  request = _Request(prompts, sampling.seed, first_index)
  action = (
    f"generating {len(prompts)} prompts x n={sampling.n} with in-flight "
    f"weight updates, max_new_tokens={sampling.max_new_tokens}"
  )
  stream(run, request, sampling, 0, hook, prepare, apply, action=action)
  return [row for rows in request.rows for row in rows]


def stream(
  run: InflightRun,
  feed: Any,
  sampling: SamplingConfig,
  max_prompt_len: int,
  hook: Callable[[], Any],
  prepare: Callable[[Any], Any],
  apply: Callable[[Any], dict[str, Any]],
  action: str | None = None,
) -> None:
  """A streamed run on the server (`rljax.rollout.prompt_feed`): every
  prompt `feed.poll` admits becomes one request at once (vLLM batches
  running requests itself, so a prompt joins as soon as it is sent), each
  prompt's n rows go to `feed.done` when its request ends, and `hook` is
  polled every `inflight_poll_s` while requests run (`InflightRun.swap`).
  A prompt is seeded by its own request's seed and index, as that
  request's `generate` would seed it. Returns when the feed has nothing
  more and every request ended, or at once when `feed.stopped()`. `action`
  names the call in errors."""
  client, config = run.client, run.client.config
  name, tag = config.served_model_name, uuid.uuid4().hex
  action = action or (
    f"streaming prompts x n={sampling.n} with in-flight weight updates, "
    f"max_new_tokens={sampling.max_new_tokens}"
  )
  run.label()
  if config.fresh_prefix_cache:
    run.call(action, client.http.reset_prefix_cache)
  live: dict[Any, tuple[Any, str]] = {}  # future → (prompt, request id)
  pool = concurrent.futures.ThreadPoolExecutor(
    max_workers=max(1, config.max_concurrent_requests),
    thread_name_prefix="vllm-stream",
  )

  def send(prompts) -> None:
    for item in prompts:
      body = generate_request(
        name, item.ids, sampling, _prompt_seed(item.seed, item.index)
      )
      body["request_id"] = f"rljax-stream-{tag}-{len(run.sent)}"
      body["cache_salt"] = cache_salt(run.version)
      run.sent.append(body["request_id"])
      live[pool.submit(client.http.generate_tokens, body)] = (
        item, body["request_id"],
      )  # fmt: skip
      # The version sampling now: its first token's is this or newer.
      feed.started(item.tag, run.version)

  try:
    send(feed.poll(max_prompt_len))
    while live and not feed.stopped():
      done, _ = concurrent.futures.wait(
        set(live),
        timeout=config.inflight_poll_s,
        return_when=concurrent.futures.FIRST_COMPLETED,
      )
      client.server.check_alive(action, len(live) - len(done))
      for future in done:
        item, _ = live.pop(future)
        rows = _rows(run, future, item.index, sampling.n, action)
        feed.done(
          prompt_feed.DoneGroup(
            item.tag, list(item.ids), [r[0] for r in rows],
            [r[1] for r in rows], [r[3] for r in rows], [r[2] for r in rows],
          )
        )  # fmt: skip
      send(feed.poll(max_prompt_len))
      if live:  # polled only while work is left, as the JAX engine
        update = hook()
        if update is not None:
          run.swap(update, prepare, apply, len(live))
  except BaseException:
    if live:  # they would hold the engine's batch slots until done
      _abort([rid for _, rid in live.values()], client)
    raise
  finally:
    pool.shutdown(wait=False, cancel_futures=True)
  if live:  # stopped: the caller is closing
    _abort([rid for _, rid in live.values()], client)


def cache_salt(version: int) -> str:
  """The prefix-cache salt of requests sent while weights `version` sample:
  blocks are shared only among requests of one version."""
  return f"rljax-weights-v{int(version)}"


def _abort(request_ids: list[str], client: EngineClient) -> None:
  """Best effort: vLLM's /abort_requests (dev route) on this call's
  unfinished requests, after a failure. vLLM 0.32's generate route runs a
  request as "generate-tokens-<its request_id>"; both forms are sent (an
  id vLLM does not track is ignored)."""
  ids = [f"generate-tokens-{i}" for i in request_ids] + list(request_ids)
  try:
    client.http.post("/abort_requests", {"request_ids": ids}, 60)
  except VLLMRequestError:
    pass  # the error being raised says more


def _rows(run, future, index, n, action) -> list[VersionedRow]:
  server = run.client.server
  try:
    return parse_generate(future.result(), n)
  except VLLMRequestError as e:
    # 403: vLLM's stand-in for its scale-out routes when they are off;
    # 404 without a model complaint: a vLLM that lacks the route.
    if e.status == 403 or (e.status == 404 and "model" not in e.detail):
      raise server.failure(
        action,
        f"{e}: the server does not serve {GENERATE_ROUTE}, the route that "
        "returns per-token weight versions; launch it with "
        "--enable-scale-out (VLLMSidecarConfig.inflight_routes=True, the "
        "default) or use generate() and --run.async_mode=one_step",
      ) from None
    if e.status is not None and 400 <= e.status < 500:
      raise ValueError(
        f"vLLM sidecar {server.describe()} rejected prompt {index}: {e.detail}"
      ) from None
    raise server.failure(action, e) from None
  except ValueError as e:
    raise server.failure(action, f"prompt {index}: {e}") from None
