"""An environment served over HTTP: reset and step as JSON, token ids in
and out.

Any ``Environment`` (``reset(example) -> str``, ``step(turn) ->
StepResult``) can run in its own process, in any language that speaks this
protocol, and the trainer talks to it through ``RemoteEnv``
(``rljax/envs/remote.py``). The server holds the tokenizer: it decodes the
model's ids to the text its environment reads and encodes the observations
on their own, so the ids that cross the wire are the ones the policy
trains on. Every body is JSON; every error is an HTTP status with
``{"error": message}``.

  GET  /info    -> {"protocol": 1, "name", "stop_sequences": [str]}
  POST /prompt  {"example": EXAMPLE} -> {"observation", "observation_ids"}
                the first observation only; no episode is opened (the
                trainer renders every problem's prompt once, to filter by
                length)
  POST /reset   {"example": EXAMPLE} -> {"episode": str, "observation",
                "observation_ids", "stop_sequences"}
  POST /step    {"episode": str, "action_ids": [int]} (or "action_text":
                str) -> {"observation", "observation_ids", "reward",
                "done", "info"}; a done episode is closed
  POST /close   {"episode": str} -> {"closed": bool}

  EXAMPLE = {"question": str, "answer": str, "uid": str, "metadata": {}}

Episodes are independent (one environment each, made by ``make_env``) and
run concurrently, one request at a time per episode. An episode nobody
steps for ``idle_timeout_s`` is dropped (a driver that cuts an episode at
its token budget never closes it); at ``max_episodes`` open episodes a
reset is refused with 503. The server binds to loopback unless
``allow_remote``.
"""

from __future__ import annotations

import dataclasses
import http.server
import ipaddress
import json
import secrets
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from rljax.core import _validation as v
from rljax.data.records import Example
from rljax.envs.base import Environment

__all__ = [
  "PROTOCOL_VERSION",
  "EnvServer",
  "EnvServerConfig",
  "ProtocolError",
  "example_from_json",
  "example_to_json",
  "is_loopback",
]

PROTOCOL_VERSION = 1


class ProtocolError(ValueError):
  """A request the protocol refuses, with its HTTP status."""

  def __init__(self, message: str, status: int = 400):
    super().__init__(message)
    self.status = status


@dataclasses.dataclass(frozen=True)
class EnvServerConfig:
  """Where the server listens and how much it holds.

  Attributes:
    host: the address to bind; loopback unless ``allow_remote``.
    port: the port; 0 picks a free one (``EnvServer.url`` says which).
    max_episodes: open episodes at most (>= 1); a reset beyond is refused.
    idle_timeout_s: an episode not stepped for this long is dropped (> 0).
    max_body_bytes: the largest request body accepted (>= 1024).
    allow_remote: bind to a non-loopback address (the server runs no
      authentication: anyone who reaches it can step its episodes).
  """

  host: str = "127.0.0.1"
  port: int = 0
  max_episodes: int = 65536
  idle_timeout_s: float = 600.0
  max_body_bytes: int = 1 << 20
  allow_remote: bool = False

  def __post_init__(self):
    for name, rule in (
      ("port", v.all_of(v.is_int, v.in_range(0, 65535))),
      ("max_episodes", v.all_of(v.is_int, v.at_least(1))),
      ("idle_timeout_s", v.all_of(v.is_real, v.in_range(0, 1e9, lo_open=True))),
      ("max_body_bytes", v.all_of(v.is_int, v.at_least(1024))),
      ("allow_remote", v.is_bool),
    ):
      v.check_field("EnvServerConfig", name, getattr(self, name), rule)
    if not self.allow_remote and not is_loopback(self.host):
      raise ValueError(
        v.field_message(
          "EnvServerConfig.host",
          self.host,
          "a loopback address (127.0.0.1, ::1, localhost) unless "
          "allow_remote=True: the server has no authentication",
        )
      )


def is_loopback(host: str) -> bool:
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


def example_to_json(example: Example) -> dict[str, Any]:
  return {
    "question": example.question,
    "answer": example.answer,
    "uid": example.uid,
    "metadata": dict(example.metadata),
  }


def example_from_json(obj: Any) -> Example:
  """An ``Example`` from its JSON form, or a ``ProtocolError`` naming the
  bad field."""
  if not isinstance(obj, dict):
    raise ProtocolError(
      v.field_message("example", obj, "an object with question and answer")
    )
  for name in ("question", "answer"):
    if not isinstance(obj.get(name), str):
      raise ProtocolError(
        v.field_message(f"example.{name}", obj.get(name), "a string")
      )
  uid, metadata = obj.get("uid", ""), obj.get("metadata", {})
  if not isinstance(uid, str):
    raise ProtocolError(v.field_message("example.uid", uid, "a string"))
  if not isinstance(metadata, dict):
    raise ProtocolError(
      v.field_message("example.metadata", metadata, "an object")
    )
  return Example(obj["question"], obj["answer"], metadata, uid)


def _action_ids(body: Mapping[str, Any], vocab: int) -> list[int]:
  ids = body["action_ids"]
  if not isinstance(ids, list) or not all(
    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
    for t in ids
  ):
    raise ProtocolError(
      v.field_message("action_ids", ids, f"a list of token ids in [0, {vocab})")
    )
  return ids


@dataclasses.dataclass
class _Episode:
  env: Environment
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
  last_used: float = dataclasses.field(default_factory=time.monotonic)


class EnvServer:
  """Serves ``make_env``'s environments (one per episode) over HTTP.

  Args:
    make_env: a fresh environment per episode.
    tokenizer: decodes the model's ids (``decode(ids,
      skip_special_tokens=True)``) and encodes observations
      (``encode(text, add_special_tokens=False)``); ``len`` is its vocab.
    config: the address and limits.
    name: what ``/info`` calls the environment.

  ``start()`` serves from a daemon thread; ``close()`` stops it.
  """

  def __init__(
    self,
    make_env: Callable[[], Environment],
    tokenizer,
    config: EnvServerConfig = EnvServerConfig(),
    name: str = "env",
  ):
    self.make_env = make_env
    self.tokenizer = tokenizer
    self.config = config
    self.name = name
    self.stop_sequences = tuple(make_env().stop_sequences)
    self._episodes: dict[str, _Episode] = {}
    self._lock = threading.Lock()
    self._httpd: http.server.ThreadingHTTPServer | None = None
    self._thread: threading.Thread | None = None

  @property
  def url(self) -> str:
    if self._httpd is None:
      raise RuntimeError("EnvServer.url: the server is not started")
    host, port = self._httpd.server_address[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"

  def start(self) -> "EnvServer":
    server = self

    class Handler(_Handler):
      env_server = server

    self._httpd = http.server.ThreadingHTTPServer(
      (self.config.host, self.config.port), Handler
    )
    self._httpd.daemon_threads = True
    self._thread = threading.Thread(
      target=self._httpd.serve_forever,
      kwargs={"poll_interval": 0.05},  # how soon close() returns
      name="env-server",
      daemon=True,
    )
    self._thread.start()
    return self

  def close(self) -> None:
    if self._httpd is not None:
      self._httpd.shutdown()
      self._httpd.server_close()
      self._httpd = None

  def __enter__(self) -> "EnvServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def open_episodes(self) -> int:
    with self._lock:
      return len(self._episodes)

  # The protocol's operations, each a JSON object in and out.

  def info(self) -> dict[str, Any]:
    return {
      "protocol": PROTOCOL_VERSION,
      "name": self.name,
      "stop_sequences": list(self.stop_sequences),
    }

  def prompt(self, body: Mapping[str, Any]) -> dict[str, Any]:
    text = self.make_env().reset(example_from_json(body.get("example")))
    return {"observation": text, "observation_ids": self._encode(text)}

  def reset(self, body: Mapping[str, Any]) -> dict[str, Any]:
    example = example_from_json(body.get("example"))
    env = self.make_env()
    text = env.reset(example)
    episode = secrets.token_hex(8)
    with self._lock:
      self._drop_idle()
      if len(self._episodes) >= self.config.max_episodes:
        raise ProtocolError(
          f"{len(self._episodes)} episodes are open, the server's "
          f"max_episodes={self.config.max_episodes}; close or finish some",
          status=503,
        )
      self._episodes[episode] = _Episode(env)
    return {
      "episode": episode,
      "observation": text,
      "observation_ids": self._encode(text),
      "stop_sequences": list(self.stop_sequences),
    }

  def step(self, body: Mapping[str, Any]) -> dict[str, Any]:
    episode = self._episode(body)
    if "action_ids" in body:
      ids = _action_ids(body, len(self.tokenizer))
      turn = self.tokenizer.decode(ids, skip_special_tokens=True)
    elif isinstance(body.get("action_text"), str):
      turn = body["action_text"]
    else:
      raise ProtocolError(
        "step: expected action_ids (a list of token ids) or action_text "
        f"(a string); got the fields {sorted(body)}"
      )
    with episode.lock:
      episode.last_used = time.monotonic()
      result = episode.env.step(turn)
    if result.done:
      self._close(body["episode"])
    return {
      "observation": result.observation,
      "observation_ids": self._encode(result.observation),
      "reward": float(result.reward),
      "done": bool(result.done),
      "info": dict(result.info),
    }

  def close_episode(self, body: Mapping[str, Any]) -> dict[str, Any]:
    return {"closed": self._close(body.get("episode"))}

  def _encode(self, text: str) -> list[int]:
    if not text:
      return []
    return [
      int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)
    ]

  def _episode(self, body: Mapping[str, Any]) -> _Episode:
    name = body.get("episode")
    with self._lock:
      episode = self._episodes.get(name) if isinstance(name, str) else None
    if episode is None:
      raise ProtocolError(
        v.field_message(
          "episode",
          name,
          "an open episode's id from /reset (it may have finished, been "
          f"closed, or been dropped after idle_timeout_s="
          f"{self.config.idle_timeout_s})",
        ),
        status=404,
      )
    return episode

  def _close(self, name: Any) -> bool:
    if not isinstance(name, str):
      return False
    with self._lock:
      return self._episodes.pop(name, None) is not None

  def _drop_idle(self) -> None:
    """Called with ``_lock`` held."""
    cutoff = time.monotonic() - self.config.idle_timeout_s
    for name in [k for k, e in self._episodes.items() if e.last_used < cutoff]:
      del self._episodes[name]


_ROUTES = {
  ("GET", "/info"): lambda s, body: s.info(),
  ("POST", "/prompt"): EnvServer.prompt,
  ("POST", "/reset"): EnvServer.reset,
  ("POST", "/step"): EnvServer.step,
  ("POST", "/close"): EnvServer.close_episode,
}


class _Handler(http.server.BaseHTTPRequestHandler):
  env_server: EnvServer
  protocol_version = "HTTP/1.1"  # keep-alive: one connection per client

  def log_message(self, *args) -> None:  # one line per request is noise
    pass

  def do_GET(self) -> None:
    self._serve("GET")

  def do_POST(self) -> None:
    self._serve("POST")

  def _serve(self, method: str) -> None:
    try:
      route = _ROUTES.get((method, self.path))
      if route is None:
        known = ", ".join(f"{m} {p}" for m, p in _ROUTES)
        raise ProtocolError(
          f"{method} {self.path} is not part of the protocol; the routes "
          f"are {known}",
          status=404,
        )
      answer = route(self.env_server, self._body() if method == "POST" else {})
      self._send(200, answer)
    except ProtocolError as error:
      self._send(error.status, {"error": str(error)})
    except Exception as error:  # the environment's own failure
      self._send(500, {"error": f"{type(error).__name__}: {error}"})

  def _body(self) -> dict[str, Any]:
    size = int(self.headers.get("Content-Length") or 0)
    limit = self.env_server.config.max_body_bytes
    if size > limit:
      self.close_connection = True  # the body stays unread
      raise ProtocolError(
        f"a body of {size} bytes; the server's max_body_bytes is {limit}",
        status=413,
      )
    try:
      body = json.loads(self.rfile.read(size) or b"{}")
    except ValueError as error:
      raise ProtocolError(f"the body is not JSON ({error})") from None
    if not isinstance(body, dict):
      raise ProtocolError(f"the body must be a JSON object; got {body!r:.80}")
    return body

  def _send(self, status: int, obj: Mapping[str, Any]) -> None:
    data = json.dumps(obj).encode("utf-8")
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


def serve_until_stopped(
  server: EnvServer, announce: Sequence[str] = ()
) -> None:
  """Starts ``server``, prints its URL (one line: ``serving URL``, which a
  parent process reads) and blocks until interrupted."""
  server.start()
  print(f"serving {server.url}", *announce, flush=True)
  try:
    while True:
      time.sleep(3600)
  except KeyboardInterrupt:
    pass
  finally:
    server.close()
