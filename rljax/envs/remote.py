"""The client of an environment served over HTTP (``env_server.py``).

``connect(url)`` asks the server what it serves (``/info``: its stop
sequences) once and gives a factory of ``RemoteEnv``s, one per episode, to
hand to ``rollout_multiturn`` (or the trainer: ``--task.env_url``). A
``RemoteEnv`` is an ``Environment``: ``reset(example)`` opens an episode on
the server and returns its first observation; ``step(turn)`` sends the
model's turn and returns the server's ``StepResult``, with
``observation_ids``, the server's own ids of the observation.
``step_ids(ids)`` sends the turn as token ids (the server decodes them with
its tokenizer), for drivers that keep the sampled ids.

Errors fail closed: a server that cannot be reached, that answers with an
error, or that speaks another protocol version raises ``RemoteEnvError``
with the URL, the route and the server's message. URLs outside loopback
are refused unless ``allow_remote`` (the protocol has no authentication).
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping, Sequence

from rljax.data.records import Example
from rljax.envs.base import StepResult
from rljax.envs.env_server import PROTOCOL_VERSION, example_to_json, is_loopback

__all__ = ["RemoteEnv", "RemoteEnvError", "RemoteEnvFactory", "connect"]


class RemoteEnvError(RuntimeError):
  """The server could not be reached or refused a request."""


def _post(url: str, route: str, body: Mapping[str, Any] | None, timeout_s):
  data = None if body is None else json.dumps(body).encode("utf-8")
  request = urllib.request.Request(
    url + route,
    data=data,
    method="GET" if body is None else "POST",
    headers={"Content-Type": "application/json"},
  )
  try:
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
      return json.loads(response.read())
  except urllib.error.HTTPError as error:
    try:
      message = json.loads(error.read()).get("error", "")
    except ValueError:
      message = ""
    raise RemoteEnvError(
      f"environment server {url}{route} answered {error.code}: "
      f"{message or error.reason}"
    ) from None
  except (urllib.error.URLError, OSError, ValueError) as error:
    raise RemoteEnvError(
      f"environment server {url}{route} could not be reached or gave no "
      f"JSON ({error}); expected a running rljax.envs.env_server"
    ) from None


def _check_url(url: str, allow_remote: bool) -> str:
  parsed = urllib.parse.urlparse(url)
  if parsed.scheme != "http" or not parsed.hostname:
    raise ValueError(
      f"env_url={url!r}; expected http://HOST:PORT of an environment server"
    )
  if not allow_remote and not is_loopback(parsed.hostname):
    raise ValueError(
      f"env_url={url!r}; expected a loopback address (127.0.0.1, ::1, "
      "localhost) unless allow_remote: the protocol has no authentication"
    )
  return url.rstrip("/")


@dataclasses.dataclass(frozen=True)
class RemoteEnvFactory:
  """Makes one ``RemoteEnv`` per call (per episode) on one server."""

  url: str
  stop_sequences: tuple[str, ...]
  name: str = "env"
  timeout_s: float = 60.0

  def __call__(self) -> "RemoteEnv":
    return RemoteEnv(self.url, self.stop_sequences, self.timeout_s)

  def first_observation(self, example: Example) -> str:
    """The prompt an episode of ``example`` starts with; opens nothing."""
    answer = _post(
      self.url, "/prompt", {"example": example_to_json(example)}, self.timeout_s
    )
    return answer["observation"]


def connect(
  url: str, timeout_s: float = 60.0, allow_remote: bool = False
) -> RemoteEnvFactory:
  """The factory of ``url``'s episodes, after checking its protocol."""
  url = _check_url(url, allow_remote)
  info = _post(url, "/info", None, timeout_s)
  if info.get("protocol") != PROTOCOL_VERSION:
    raise RemoteEnvError(
      f"environment server {url} speaks protocol {info.get('protocol')!r}; "
      f"expected {PROTOCOL_VERSION}"
    )
  stops = info.get("stop_sequences")
  if not isinstance(stops, list) or not stops:
    raise RemoteEnvError(
      f"environment server {url}/info: stop_sequences={stops!r}; expected "
      "a non-empty list of strings"
    )
  return RemoteEnvFactory(
    url, tuple(stops), str(info.get("name", "env")), timeout_s
  )


class RemoteEnv:
  """One episode on an environment server (see the module doc)."""

  def __init__(
    self, url: str, stop_sequences: Sequence[str], timeout_s: float = 60.0
  ):
    self.url = url
    self.stop_sequences = tuple(stop_sequences)
    self.timeout_s = timeout_s
    self.episode: str | None = None
    self.first_ids: tuple[int, ...] = ()

  def reset(self, example: Example) -> str:
    self.close()
    answer = self._call("/reset", {"example": example_to_json(example)})
    self.episode = answer["episode"]
    self.first_ids = tuple(answer["observation_ids"])
    return answer["observation"]

  def step(self, turn: str) -> StepResult:
    return self._step({"action_text": turn})

  def step_ids(self, turn_ids: Sequence[int]) -> StepResult:
    return self._step({"action_ids": [int(t) for t in turn_ids]})

  def close(self) -> None:
    """Closes the episode on the server (a finished one is closed there)."""
    if self.episode is not None:
      episode, self.episode = self.episode, None
      self._call("/close", {"episode": episode})

  def _step(self, body: dict[str, Any]) -> StepResult:
    if self.episode is None:
      raise RuntimeError("RemoteEnv.step: no episode open; call reset first")
    answer = self._call("/step", {"episode": self.episode, **body})
    if answer["done"]:
      self.episode = None  # the server closed it
    return StepResult(
      answer["observation"],
      float(answer["reward"]),
      bool(answer["done"]),
      answer["info"],
      tuple(answer["observation_ids"]),
    )

  def _call(self, route: str, body: Mapping[str, Any]) -> dict[str, Any]:
    return _post(self.url, route, body, self.timeout_s)
