"""An LLM judge that scores responses against rubrics, as a batched reward.

The rubric approach of Kimi K2 ("Kimi K2: Open Agentic Intelligence", 2025,
appendix F: the policy's answers are rated against criteria such as clarity,
fluency and objectivity) and the LLM-as-a-judge reward: a model served
behind any OpenAI-compatible HTTP endpoint (`/v1/completions`, or
`/v1/chat/completions`; a vLLM sidecar is one) reads the rubrics, the prompt
and the response, and answers a score.

Robustness, because a judge is a language model and a server:
  * `parse_score` accepts "Score: 7", "7/10", "**7**", "7.5" ...; anything
    else is a parse failure: the item gets `failure_score` and is counted
    (component `judge_parse_failure`, metric `judge_parse_failures`);
  * a request that errors or exceeds `timeout_s` also gets `failure_score`
    and is counted (`judge_request_failure`, status "timeout"/"error");
  * only the configured address is contacted: loopback unless
    `allow_remote=True`, the request goes straight to that host and port
    (`http.client`, no proxy variables, no redirects followed).

Scores are mapped to [0, 1]: (s − lo) / (hi − lo) for a scale [lo, hi].
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import ipaddress
import json
import os
import re
import socket
import time
import urllib.parse
from typing import Any, Sequence

import numpy as np

from rljax.rewards import batched
from rljax.rewards.pool import RewardBatch, RewardInput

__all__ = [
  "JudgeConfig",
  "JudgeError",
  "JudgeReward",
  "check_address",
  "judge_prompt",
  "load_rubrics",
  "parse_score",
]

APIS = ("completions", "chat")

DEFAULT_TEMPLATE = (
  "You are a strict grader. Rate the response to the prompt against the "
  "rubrics, on a scale from {lo} to {hi} ({hi} = fully meets every "
  "rubric). Answer with the score only.\n\n"
  "Rubrics:\n{rubrics}\n\n"
  "Prompt:\n{prompt}\n\n"
  "Response:\n{response}\n\n"
  "Score ({lo}-{hi}):"
)


class JudgeError(RuntimeError):
  """A judge request failed (no answer, HTTP error, malformed JSON)."""


def check_address(url: str, allow_remote: bool = False) -> tuple[str, int]:
  """(host, port) of an http:// URL, refusing non-loopback hosts unless
  `allow_remote`. A host name must resolve to loopback addresses only."""
  parsed = urllib.parse.urlsplit(url)
  if parsed.scheme != "http" or not parsed.hostname:
    raise ValueError(f"judge_url={url!r}; expected http://host:port")
  if parsed.path not in ("", "/") or parsed.query:
    raise ValueError(
      f"judge_url={url!r} has a path or query; expected "
      "only http://host:port (the API path is added)"
    )
  host = parsed.hostname
  port = parsed.port or 80
  if not allow_remote:
    try:
      infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
      raise ValueError(
        f"judge_url={url!r}: cannot resolve {host!r} ({e})"
      ) from None
    addresses = {info[4][0] for info in infos}
    remote = sorted(
      a
      for a in addresses
      if not ipaddress.ip_address(a.split("%")[0]).is_loopback
    )
    if remote:
      raise ValueError(
        f"judge_url={url!r} resolves to non-loopback address(es) {remote}; "
        "the judge only talks to 127.0.0.1/::1 unless allowed explicitly "
        "(--reward.judge_allow_remote / JudgeConfig.allow_remote=True)"
      )
  return host, port


def load_rubrics(path: str | os.PathLike) -> str:
  """The rubric text of a file.

  A `.json` file holds a list of {"name", "description"} objects (or
  strings); any other file is used verbatim (stripped).
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"judge_rubrics={path!r}: no such file")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  if path.endswith(".json"):
    try:
      items = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(
        f"{path}: not valid JSON ({e.msg}, line {e.lineno})"
      ) from None
    if not isinstance(items, list) or not items:
      raise ValueError(
        f"{path}: a {type(items).__name__}; expected a "
        "non-empty list of rubrics"
      )
    lines = []
    for i, item in enumerate(items):
      if isinstance(item, str) and item.strip():
        lines.append(f"- {item.strip()}")
      elif (
        isinstance(item, dict)
        and isinstance(item.get("name"), str)
        and isinstance(item.get("description"), str)
      ):
        lines.append(f"- {item['name']}: {item['description']}")
      else:
        raise ValueError(
          f"{path}: rubric [{i}] is {item!r:.80}; expected a "
          'string or {"name": str, "description": str}'
        )
    return "\n".join(lines)
  text = text.strip()
  if not text:
    raise ValueError(f"judge_rubrics={path!r} is empty")
  return text


_NUMBER = r"[-+]?\d+(?:\.\d+)?"
# Most specific first: an explicit "score" label, then "n/hi", then a number
# that is the whole answer (perhaps in markdown bold).
_PATTERNS = (
  re.compile(
    r"score\s*(?:\(.*?\))?\s*[:=is]*\s*\**\s*(" + _NUMBER + r")", re.IGNORECASE
  ),
  re.compile(r"(" + _NUMBER + r")\s*/\s*" + _NUMBER),
  re.compile(r"^\W*(" + _NUMBER + r")\W*$"),
  re.compile(r"^\s*\**\s*(" + _NUMBER + r")\b"),
)


def parse_score(text: Any, lo: float = 0.0, hi: float = 10.0) -> float | None:
  """The judge's score in [lo, hi], or None when the answer has none.

  Tries, in order: "Score: n" (any case, optional "(lo-hi)"), "n/m", an
  answer that is only a number, an answer that starts with a number. A
  number outside [lo, hi] is a failure, not clipped: the judge did not
  follow the scale.
  """
  if not isinstance(text, str):
    return None
  text = text.strip()
  for pattern in _PATTERNS:
    match = pattern.search(text)
    if match:
      value = float(match.group(1))
      return value if lo <= value <= hi else None
  return None


def judge_prompt(
  template: str, rubrics: str, prompt: str, response: str, lo: float, hi: float
) -> str:
  fmt = lambda v: f"{v:g}"
  return template.format(
    rubrics=rubrics, prompt=prompt, response=response, lo=fmt(lo), hi=fmt(hi)
  )


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
  """Where the judge is and how it is asked.

  Attributes:
    url: http://host:port of the OpenAI-compatible server.
    model: the served model name ("" = the server's first model).
    rubrics: the rubric text (see `load_rubrics`).
    api: "completions" (raw prompt) or "chat" (the server applies the
      model's chat template).
    template: the judge prompt; fields {rubrics} {prompt} {response} {lo}
      {hi}.
    score_range: (lo, hi) of the judge's scale.
    failure_score: the reward (in [0, 1] units) of an item whose score
      could not be obtained.
    timeout_s: one request, connect and read.
    max_tokens: the judge's answer budget.
    temperature: 0 = greedy (deterministic scores).
    concurrency: requests in flight.
    allow_remote: permit a non-loopback host.
    api_key: bearer token sent as `Authorization: Bearer <key>` (a vLLM
      sidecar requires its run key on every route); None = no header. Not
      in the repr, so it never reaches a log or config.json.
  """

  url: str = "http://127.0.0.1:8000"
  model: str = ""
  rubrics: str = "- Correctness: the response answers the prompt correctly."
  api: str = "completions"
  template: str = DEFAULT_TEMPLATE
  score_range: tuple[float, float] = (0.0, 10.0)
  failure_score: float = 0.0
  timeout_s: float = 30.0
  max_tokens: int = 16
  temperature: float = 0.0
  concurrency: int = 8
  allow_remote: bool = False
  api_key: str | None = dataclasses.field(default=None, repr=False)

  def __post_init__(self):
    if self.api not in APIS:
      raise ValueError(f"JudgeConfig.api={self.api!r}; expected one of {APIS}")
    lo, hi = self.score_range
    if not lo < hi:
      raise ValueError(
        f"JudgeConfig.score_range={self.score_range!r}; "
        "expected (lo, hi) with lo < hi"
      )
    if not self.timeout_s > 0:
      raise ValueError(
        f"JudgeConfig.timeout_s={self.timeout_s!r}; expected > 0"
      )
    for name in ("max_tokens", "concurrency"):
      if getattr(self, name) < 1:
        raise ValueError(
          f"JudgeConfig.{name}={getattr(self, name)!r}; expected >= 1"
        )
    if not self.rubrics.strip():
      raise ValueError("JudgeConfig.rubrics is empty")
    check_address(self.url, self.allow_remote)


class JudgeReward:
  """Rubric / LLM-judge reward over an OpenAI-compatible endpoint.

  Components per item: `judge` (the reward in [0, 1], `failure_score` on a
  failure), `judge_raw` (the parsed score, NaN-free: lo on failure),
  `judge_parse_failure` and `judge_request_failure` (0/1). The batch metrics
  count them (`judge_parse_failures`, `judge_request_failures`).
  """

  name = "judge"

  def __init__(self, config: JudgeConfig):
    self.config = config
    self.host, self.port = check_address(config.url, config.allow_remote)
    self._model = config.model or None
    self._executor = concurrent.futures.ThreadPoolExecutor(config.concurrency)

  # -- HTTP ----------------------------------------------------------------
  def _request(self, method: str, path: str, body: Any = None) -> Any:
    conn = http.client.HTTPConnection(
      self.host, self.port, timeout=self.config.timeout_s
    )
    try:
      data = None if body is None else json.dumps(body).encode()
      headers = {"Content-Type": "application/json"} if data else {}
      if self.config.api_key:
        headers["Authorization"] = f"Bearer {self.config.api_key}"
      conn.request(method, path, body=data, headers=headers)
      response = conn.getresponse()
      raw = response.read()
    except (socket.timeout, TimeoutError) as e:
      raise TimeoutError(
        f"judge {self.config.url}{path}: no answer within "
        f"{self.config.timeout_s:g} s"
      ) from e
    except (OSError, http.client.HTTPException) as e:
      raise JudgeError(
        f"judge {self.config.url}{path}: {type(e).__name__}: {e}"
      ) from e
    finally:
      conn.close()
    if response.status != 200:
      raise JudgeError(
        f"judge {self.config.url}{path}: HTTP {response.status}: {raw[:500]!r}"
      )
    try:
      return json.loads(raw)
    except json.JSONDecodeError:
      raise JudgeError(
        f"judge {self.config.url}{path}: answer is not JSON: {raw[:200]!r}"
      ) from None

  def model_name(self) -> str:
    """The configured model, else the server's first (`/v1/models`)."""
    if self._model is None:
      answer = self._request("GET", "/v1/models")
      data = answer.get("data") if isinstance(answer, dict) else None
      if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise JudgeError(
          f"judge {self.config.url}/v1/models lists no model: {answer!r:.200}"
        )
      self._model = str(data[0]["id"])
    return self._model

  def ask(self, prompt: str, response: str) -> str:
    """The judge's raw answer text for one item."""
    cfg = self.config
    lo, hi = cfg.score_range
    text = judge_prompt(cfg.template, cfg.rubrics, prompt, response, lo, hi)
    body = {
      "model": self.model_name(),
      "max_tokens": cfg.max_tokens,
      "temperature": cfg.temperature,
    }
    if cfg.api == "chat":
      body["messages"] = [{"role": "user", "content": text}]
      answer = self._request("POST", "/v1/chat/completions", body)
    else:
      body["prompt"] = text
      answer = self._request("POST", "/v1/completions", body)
    try:
      choice = answer["choices"][0]
      out = (
        choice["message"]["content"] if cfg.api == "chat" else choice["text"]
      )
    except (KeyError, IndexError, TypeError):
      raise JudgeError(
        f"judge answer has no choices[0] text: {answer!r:.300}"
      ) from None
    if not isinstance(out, str):
      raise JudgeError(f"judge answer text is {type(out).__name__}")
    return out

  # -- reward --------------------------------------------------------------
  def score(self, inputs: Sequence[RewardInput]) -> RewardBatch:
    t0 = time.perf_counter()
    cfg = self.config
    lo, hi = cfg.score_range
    count = len(inputs)
    futures = [
      self._executor.submit(self.ask, i.prompt, i.completion) for i in inputs
    ]
    rewards = np.full(count, cfg.failure_score, np.float32)
    raw = np.full(count, lo, np.float32)
    parse_fail = np.zeros(count, np.float32)
    request_fail = np.zeros(count, np.float32)
    status = []
    for k, future in enumerate(futures):
      try:
        text = future.result()
      except TimeoutError:
        request_fail[k] = 1.0
        status.append("timeout")
        continue
      except Exception:  # pylint: disable=broad-except
        # A bad answer must not stop the run: it is counted and scored as
        # a failure.
        request_fail[k] = 1.0
        status.append("error")
        continue
      status.append("ok")
      value = parse_score(text, lo, hi)
      if value is None:
        parse_fail[k] = 1.0
        continue
      raw[k] = value
      rewards[k] = (value - lo) / (hi - lo)
    return batched.reward_batch(
      rewards,
      {
        "judge": rewards,
        "judge_raw": raw,
        "judge_parse_failure": parse_fail,
        "judge_request_failure": request_fail,
      },
      status=status,
      seconds=time.perf_counter() - t0,
      metrics={
        "judge_parse_failures": float(parse_fail.sum()),
        "judge_request_failures": float(request_fail.sum()),
      },
    )

  def close(self) -> None:
    self._executor.shutdown(wait=False, cancel_futures=True)
