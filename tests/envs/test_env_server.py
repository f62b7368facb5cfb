"""The environment server and its client: reset/step over HTTP, token ids
in and out, the same episode as in-process, errors that name the field.

The server runs in a thread of the test process here (the trainer's test
against a server in its own process is tests/train/test_env_server_training
.py); the environment is the real calculator ToolEnv and the tokenizer the
real SmolLM2 one.
"""

import json
import urllib.request

import pytest

from rljax import envs
from rljax.data.records import Example
from rljax.envs.env_server import EnvServer, EnvServerConfig
from rljax.models.pretrained import tiny_tokenizer

EXAMPLE = Example("What is 12 * 34?", "408", {"source": "test"}, "t:0")
CALL = "Let me compute. <calculator>12*34</calculator>"
ANSWER = "The answer is \\boxed{408}."


@pytest.fixture(scope="module")
def tokenizer():
  return tiny_tokenizer()


def _make_env(tokenizer):
  def count(text):
    return len(tokenizer.encode(text, add_special_tokens=False))

  return lambda: envs.ToolEnv(
    [envs.CalculatorTool()], envs.ToolEnvConfig(max_turns=3), count_tokens=count
  )


@pytest.fixture
def server(tokenizer):
  with EnvServer(_make_env(tokenizer), tokenizer, name="calc") as s:
    yield s


def _local_episode(tokenizer, turns):
  env = envs.TokenEnv(
    _make_env(tokenizer)(),
    lambda s: tokenizer.encode(s, add_special_tokens=False),
    lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
  )
  first = env.reset(EXAMPLE)
  return first, [env.step(tokenizer.encode(t)) for t in turns]


def test_remote_episode_is_the_local_one_token_for_token(server, tokenizer):
  factory = envs.connect(server.url)
  assert factory.stop_sequences == ("</calculator>",)
  assert factory.name == "calc"
  env = factory()
  text = env.reset(EXAMPLE)
  first, local = _local_episode(tokenizer, [CALL, ANSWER])
  assert env.first_ids == first
  assert tokenizer.encode(text, add_special_tokens=False) == list(first)
  assert server.open_episodes == 1
  steps = [env.step_ids(tokenizer.encode(t)) for t in (CALL, ANSWER)]
  for remote, mine in zip(steps, local):
    assert remote.observation_ids == mine.observation_ids
    assert (remote.reward, remote.done) == (mine.reward, mine.done)
    assert remote.info == json.loads(json.dumps(mine.info))
  assert "408" in steps[0].observation and not steps[0].done
  assert steps[1].done and steps[1].reward == 1.0
  assert server.open_episodes == 0  # a finished episode is closed there


def test_text_turns_and_the_prompt_route(server, tokenizer):
  factory = envs.connect(server.url)
  first = factory.first_observation(EXAMPLE)
  assert server.open_episodes == 0  # /prompt opens nothing
  env = factory()
  assert env.reset(EXAMPLE) == first
  result = env.step(CALL)
  assert result.observation_ids == tuple(
    tokenizer.encode(result.observation, add_special_tokens=False)
  )
  env.close()
  assert server.open_episodes == 0
  with pytest.raises(RuntimeError, match="no episode open"):
    env.step(ANSWER)


def _raw(url, route, body):
  request = urllib.request.Request(
    url + route, data=json.dumps(body).encode(), method="POST"
  )
  try:
    with urllib.request.urlopen(request, timeout=10) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as error:
    return error.code, json.loads(error.read())


def test_bad_requests_name_the_field(server, tokenizer):
  url = server.url
  status, body = _raw(url, "/reset", {"example": {"question": 1}})
  assert status == 400 and "example.question=1" in body["error"]
  status, body = _raw(url, "/step", {"episode": "nope", "action_ids": []})
  assert status == 404 and "episode='nope'" in body["error"]
  example = envs.env_server.example_to_json(EXAMPLE)
  episode = _raw(url, "/reset", {"example": example})[1]
  vocab = len(tokenizer)
  status, body = _raw(
    url, "/step", {"episode": episode["episode"], "action_ids": [vocab]}
  )
  assert status == 400 and f"in [0, {vocab})" in body["error"]
  status, body = _raw(url, "/step", {"episode": episode["episode"]})
  assert status == 400 and "action_ids" in body["error"]
  status, body = _raw(url, "/nowhere", {})
  assert status == 404 and "POST /reset" in body["error"]
  env = envs.RemoteEnv(url, ("x",))
  env.episode = "gone"
  with pytest.raises(envs.RemoteEnvError, match="answered 404"):
    env.step("hi")


def test_limits_fail_closed(tokenizer):
  config = EnvServerConfig(max_episodes=1)
  with EnvServer(_make_env(tokenizer), tokenizer, config) as s:
    factory = envs.connect(s.url)
    factory().reset(EXAMPLE)
    with pytest.raises(envs.RemoteEnvError, match="503.*max_episodes=1"):
      factory().reset(EXAMPLE)
  with pytest.raises(ValueError, match="host='0.0.0.0'.*loopback"):
    EnvServerConfig(host="0.0.0.0")
  with pytest.raises(ValueError, match="loopback"):
    envs.connect("http://10.1.2.3:8000")
  with pytest.raises(ValueError, match="http://HOST:PORT"):
    envs.connect("ftp://127.0.0.1:1")
  with pytest.raises(envs.RemoteEnvError, match="could not be reached"):
    envs.connect("http://127.0.0.1:9", timeout_s=2.0)


def test_idle_episodes_are_dropped(tokenizer):
  config = EnvServerConfig(idle_timeout_s=1e-6)
  with EnvServer(_make_env(tokenizer), tokenizer, config) as s:
    factory = envs.connect(s.url)
    env = factory()
    env.reset(EXAMPLE)
    factory().reset(EXAMPLE)  # this reset drops the idle one
    assert s.open_episodes == 1
    with pytest.raises(envs.RemoteEnvError, match="idle_timeout_s"):
      env.step(CALL)
