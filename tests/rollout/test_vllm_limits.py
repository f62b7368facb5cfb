"""Per-sample token limits on the vLLM sidecar: one max_tokens per prompt
(its n samples are one request), checked, and sent with each request."""

import pytest

from rljax.rollout import base
from rljax.rollout.vllm import client as vllm_client
from rljax.rollout.vllm import process as vllm_process
from rljax.rollout.vllm_sidecar import VLLMSidecarConfig


def _choice(index, ids, logps):
  return {
    "index": index,
    "token_ids": ids,
    "logprobs": {"token_logprobs": logps},
    "finish_reason": "length",
  }


class TestPromptLimits:
  """Per-sample limits as one max_tokens per prompt (its n samples are one
  vLLM request)."""

  SAMPLING = base.SamplingConfig(n=2, max_new_tokens=8)

  def test_one_limit_per_prompt(self):
    assert vllm_client.prompt_limits([3, 3, 8, 8], 2, self.SAMPLING) == [3, 8]
    assert vllm_client.prompt_limits(None, 2, self.SAMPLING) is None

  @pytest.mark.parametrize(
    "limits, match",
    [
      ([3, 4, 8, 8], r"prompt 0 is \[3, 4\]"),
      ([3, 3, 9, 9], r"prompt 1 is \[9\]"),
      ([0, 0, 1, 1], r"prompt 0 is \[0\]"),
      ([3, 3], "has 2 entries; expected one per sample"),
    ],
  )
  def test_bad_limits_are_named(self, limits, match):
    with pytest.raises(ValueError, match=match):
      vllm_client.prompt_limits(limits, 2, self.SAMPLING)

  def test_each_request_gets_its_prompts_limit(self, monkeypatch):
    bodies = []

    class Http:
      def complete(self, body):
        bodies.append(body)
        n = body["n"]
        return {"choices": [_choice(j, [1], [-0.5]) for j in range(n)]}

    client = vllm_client.EngineClient.__new__(vllm_client.EngineClient)
    client.config = VLLMSidecarConfig(fresh_prefix_cache=False)
    client.http = Http()
    client.server = vllm_process.Server("http://127.0.0.1:1")  # attached
    rows = client.generate_rows([[1, 2], [3]], self.SAMPLING, 0, [3, 8])
    assert len(rows) == 4
    assert sorted(b["max_tokens"] for b in bodies) == [3, 8]
